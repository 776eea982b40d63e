"""PP-OCRv4 text-line recognizer (`ppocr_rec`): PP-LCNetV3 backbone, SVTR neck, CTC head.

`config(meta)` reads the `ppocr.*` metadata written by `llamay.ocr.convert`;
`forward(cfg, w, images)` maps `[N, 48, W, 3]` normalised images ((x/255 - 0.5)/0.5,
NHWC) to per-frame class probabilities `[N, W/8, n_classes]`. Weights are a flat dict
of f32 arrays (convs HWIO, linears [in, out]); the neck's transformer blocks are
stacked and run under `lax.scan`. Not a text LM, so not in the architecture registry.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

HI = lax.Precision.HIGHEST


@dataclass(frozen=True)
class Config:
    stem_stride: tuple[int, int]
    stem_pad: tuple[int, int]
    strides: tuple[tuple[int, int], ...]
    pads: tuple[tuple[int, int], ...]
    groups: tuple[int, ...]
    se: tuple[bool, ...]
    pool: tuple[int, int]
    dim: int
    head_count: int
    neck_blocks: int
    ln_eps: float
    final_ln_eps: float
    neck_pads: tuple[tuple[int, int], ...]  # conv1..conv5
    n_classes: int
    image_height: int = 48

    @property
    def width_stride(self) -> int:
        """Input columns per output frame."""
        s = self.stem_stride[1] * self.pool[1]
        for sh in self.strides:
            s *= sh[1]
        return s


def _pairs(flat) -> tuple[tuple[int, int], ...]:
    flat = [int(x) for x in flat]
    return tuple((flat[i], flat[i + 1]) for i in range(0, len(flat), 2))


def config(meta: Mapping, n_classes: int) -> Config:
    return Config(
        stem_stride=tuple(int(x) for x in meta["ppocr.stem.stride"]),
        stem_pad=tuple(int(x) for x in meta["ppocr.stem.pad"]),
        strides=_pairs(meta["ppocr.blk.stride"]),
        pads=_pairs(meta["ppocr.blk.pad"]),
        groups=tuple(int(x) for x in meta["ppocr.blk.groups"]),
        se=tuple(bool(x) for x in meta["ppocr.blk.se"]),
        pool=tuple(int(x) for x in meta["ppocr.neck.pool"]),
        dim=int(meta["ppocr.neck.dim"]),
        head_count=int(meta["ppocr.neck.head_count"]),
        neck_blocks=int(meta["ppocr.neck.block_count"]),
        ln_eps=float(meta["ppocr.neck.ln_eps"]),
        final_ln_eps=float(meta["ppocr.neck.final_ln_eps"]),
        neck_pads=tuple(
            tuple(int(x) for x in meta[f"ppocr.neck.conv{i}.pad"]) for i in range(1, 6)
        ),
        n_classes=n_classes,
        image_height=int(meta.get("ppocr.image_height", 48)),
    )


def prepare_weights(cfg: Config, tensors: Mapping[str, np.ndarray]) -> dict:
    """GGUF tensors (ONNX layouts) -> the forward's pytree: convs to HWIO, neck blocks
    stacked along a leading layer axis."""
    w: dict = {}
    for k, v in tensors.items():
        if k.startswith("neck.blk."):
            continue
        v = np.asarray(v, np.float32)
        if v.ndim == 4:  # OIHW -> HWIO
            v = v.transpose(2, 3, 1, 0)
        w[k] = jnp.asarray(v)
    names = ("ln1", "qkv", "proj", "ln2", "fc1", "fc2")
    w["neck.blk"] = {
        f"{nm}.{p}": jnp.asarray(
            np.stack([tensors[f"neck.blk.{j}.{nm}.{p}"] for j in range(cfg.neck_blocks)])
        )
        for nm in names
        for p in ("weight", "bias")
    }
    return w


def depthwise_by_shifts() -> bool:
    """Whether depthwise convs run as k*k shifted multiply-adds (XLA's CPU grouped
    convolution is ~10x slower than that) instead of a grouped `conv_general_dilated`.
    Chosen per backend at trace time; `LLAMAY_OCR_DEPTHWISE=shift|conv` overrides."""
    forced = os.environ.get("LLAMAY_OCR_DEPTHWISE")
    if forced in ("shift", "conv"):
        return forced == "shift"
    return jax.default_backend() == "cpu"


def _depthwise_shifts(x, w, stride, pad):
    """Depthwise conv as a sum of strided shifted slices times per-channel taps."""
    kh, kw = w.shape[:2]
    sh, sw = stride
    xp = jnp.pad(x, ((0, 0), (pad[0], pad[0]), (pad[1], pad[1]), (0, 0)))
    ho = (xp.shape[1] - kh) // sh + 1
    wo = (xp.shape[2] - kw) // sw + 1
    out = None
    for i in range(kh):
        for j in range(kw):
            tap = xp[:, i : i + (ho - 1) * sh + 1 : sh, j : j + (wo - 1) * sw + 1 : sw, :]
            term = tap * w[i, j, 0]
            out = term if out is None else out + term
    return out


def _conv(x, w, b, stride=(1, 1), pad=(0, 0), groups=1):
    if groups > 1 and groups == x.shape[-1] == w.shape[-1] and depthwise_by_shifts():
        return _depthwise_shifts(x, w, stride, pad) + b
    y = lax.conv_general_dilated(
        x,
        w,
        window_strides=stride,
        padding=((pad[0], pad[0]), (pad[1], pad[1])),
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
        feature_group_count=groups,
        precision=HI,
    )
    return y + b


def _hardswish(x):
    return x * jnp.clip(x + 3.0, 0.0, 6.0) / 6.0


def _swish(x):
    return x * jax.nn.sigmoid(x)


def _ln(x, g, b, eps):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    d = x - mu
    var = jnp.mean(d * d, axis=-1, keepdims=True)
    return d / jnp.sqrt(var + eps) * g + b


def _block(cfg: Config, x, p):
    """One pre-norm SVTR transformer block over [N, L, D]."""
    n, length, d = x.shape
    hd = d // cfg.head_count
    h = _ln(x, p["ln1.weight"], p["ln1.bias"], cfg.ln_eps)
    qkv = jnp.matmul(h, p["qkv.weight"], precision=HI) + p["qkv.bias"]
    qkv = qkv.reshape(n, length, 3, cfg.head_count, hd)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    att = jnp.einsum("nqhd,nkhd->nhqk", q * (hd**-0.5), k, precision=HI)
    att = jax.nn.softmax(att, axis=-1)
    o = jnp.einsum("nhqk,nkhd->nqhd", att, v, precision=HI).reshape(n, length, d)
    x = x + jnp.matmul(o, p["proj.weight"], precision=HI) + p["proj.bias"]
    h = _ln(x, p["ln2.weight"], p["ln2.bias"], cfg.ln_eps)
    h = _swish(jnp.matmul(h, p["fc1.weight"], precision=HI) + p["fc1.bias"])
    return x + jnp.matmul(h, p["fc2.weight"], precision=HI) + p["fc2.bias"]


def forward(cfg: Config, w: Mapping, images: jax.Array) -> jax.Array:
    """[N, H, W, 3] normalised images -> [N, W / width_stride, n_classes] probabilities."""
    x = _conv(images, w["stem.weight"], w["stem.bias"], cfg.stem_stride, cfg.stem_pad)
    for i in range(len(cfg.groups)):
        x = _conv(
            x, w[f"blk.{i}.weight"], w[f"blk.{i}.bias"], cfg.strides[i], cfg.pads[i], cfg.groups[i]
        )
        lab = w[f"blk.{i}.lab"]
        x = _hardswish(x * lab[0] + lab[1]) * lab[2] + lab[3]
        if cfg.se[i]:
            z = jnp.mean(x, axis=(1, 2))
            z = jax.nn.relu(
                jnp.matmul(z, w[f"blk.{i}.se1.weight"].T, precision=HI) + w[f"blk.{i}.se1.bias"]
            )
            z = jnp.matmul(z, w[f"blk.{i}.se2.weight"].T, precision=HI) + w[f"blk.{i}.se2.bias"]
            x = x * jnp.clip(z / 6.0 + 0.5, 0.0, 1.0)[:, None, None, :]
    n, h, wd, c = x.shape
    ph, pw = cfg.pool
    x = x[:, : h // ph * ph, : wd // pw * pw]
    x = x.reshape(n, h // ph, ph, wd // pw, pw, c).mean(axis=(2, 4))
    shortcut = x
    pads = cfg.neck_pads
    z = _swish(_conv(x, w["neck.conv1.weight"], w["neck.conv1.bias"], pad=pads[0]))
    z = _swish(_conv(z, w["neck.conv2.weight"], w["neck.conv2.bias"], pad=pads[1]))
    n, h, wd, d = z.shape
    seq = z.reshape(n, h * wd, d)
    seq, _ = lax.scan(lambda s, p: (_block(cfg, s, p), None), seq, w["neck.blk"])
    seq = _ln(seq, w["neck.norm.weight"], w["neck.norm.bias"], cfg.final_ln_eps)
    z = seq.reshape(n, h, wd, d)
    z = _swish(_conv(z, w["neck.conv3.weight"], w["neck.conv3.bias"], pad=pads[2]))
    z = jnp.concatenate([shortcut, z], axis=-1)
    z = _swish(_conv(z, w["neck.conv4.weight"], w["neck.conv4.bias"], pad=pads[3]))
    z = _swish(_conv(z, w["neck.conv5.weight"], w["neck.conv5.bias"], pad=pads[4]))
    feats = z[:, 0]  # [N, W', D]: the neck leaves a height of one
    logits = jnp.matmul(feats, w["head.weight"], precision=HI) + w["head.bias"]
    return jax.nn.softmax(logits, axis=-1)
