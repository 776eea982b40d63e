"""The vision tower and projectors: one pure function over the weight pytree, batched.

`encode(cfg, w, pixels)` maps (B, S, S, 3) normalised tiles to (B, tokens_per_image,
n_text) embeddings, as clip.cpp's graphs compute them (models/siglip.cpp for gemma3 and
idefics3, models/llava.cpp for mlp):

- patch embedding: a stride-p convolution with bias, patches in row-major order; ggml's
  CPU conv_2d (im2col then matmul) rounds the pixels and the kernel to f16 and sums in
  f32; mlp appends the class embedding *after* the patches (ggml_concat along the
  sequence) before adding the learned positions;
- optional pre-LN; pre-LN blocks (LayerNorm, q/k/v with bias, softmax(q k^T / sqrt(d)),
  output projection, residual; LayerNorm, up, GELU, down, residual) under `lax.scan`;
  optional post-LN;
- gemma3: k x k average pooling of the patch grid, RMS norm x soft_emb_norm, x @ proj;
  idefics3: pixel shuffle (each k x k block of patches concatenated, x fastest within a
  row of the block, then rows) and a bias-free linear; mlp: the rows after the first
  (clip.cpp's `patches` are i + 1 when there is a class embedding), linear, GELU, linear.

Matmuls against F16 (BF16) weights round their activations to f16 (bf16) first, as
ggml's CPU matmul converts them to the weight type's vec_dot_type. GELU is ggml's:
`ggml_gelu` and `ggml_gelu_quick` look up f16(x) in f16 tables (GGML_GELU_FP16,
GGML_GELU_QUICK_FP16), which `llamay.arch.ggml_ops` reproduces.

With `cfg.numerics == "llamacpp"` every f32 operation is also ordered as ggml's x86 CPU
backend orders it (`llamay.quant.ggml_float`): matmuls as the kernel ggml picks computes
them (llamafile's tinyBLAS for a contiguous batch with K % 16 == 0, else
ggml_vec_dot_*: q·k^T reads a permuted q, so vec_dot), ggml's layer and RMS norms
(`ggml_ops`), its softmax (scaled first, ggml_v_expf, the sum in double). An f16 GELU
lookup turns a last-bit difference in its input into a whole f16 step of its output
(~5e-4) where the input sits at a rounding boundary; with these orders the inputs are
llama.cpp's, and the embeddings agree to ~1e-6 (bit for bit for the LLaVA tower).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from llamay.arch import ggml_ops
from llamay.quant import ggml_float as gf
from llamay.vision.mmproj import VisionConfig

F32 = jnp.float32


@functools.cache
def _gelu_quick_table() -> np.ndarray:
    """ggml_table_gelu_quick_f16: f16(x · 1/(1 + expf(-1.702·x))) for every f16 x."""
    x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    with np.errstate(all="ignore"):
        e = np.exp((np.float32(-1.702) * x).astype(np.float32)).astype(np.float32)
        y = (x * (np.float32(1.0) / (np.float32(1.0) + e)).astype(np.float32)).astype(np.float32)
    return y.astype(np.float16).astype(np.float32)


def gelu_quick(x: jax.Array) -> jax.Array:
    bits = jax.lax.bitcast_convert_type(x.astype(jnp.float16), jnp.uint16).astype(jnp.int32)
    return jnp.take(jnp.asarray(_gelu_quick_table()), bits)


def _act(name: str):
    return ggml_ops.gelu if name == "gelu" else gelu_quick


def _layer_norm(x, w, b, eps):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    y = x - mean
    var = jnp.mean(y * y, axis=-1, keepdims=True)
    return y * jax.lax.rsqrt(var + eps) * w + b


def _round_for(cfg: VisionConfig, key: str, x):
    """The activations as ggml's matmul sees them for weight `key`: rounded to f16/bf16
    when the weight is stored so (its vec_dot_type), else f32."""
    if key in cfg.half:
        return x.astype(jnp.float16).astype(F32)
    if key in cfg.bf16:
        return x.astype(jnp.bfloat16).astype(F32)
    return x


def _linear(x, w, b=None):
    y = jnp.einsum("...i,oi->...o", x, w, precision=jax.lax.Precision.HIGHEST)
    return y if b is None else y + b


def _block(cfg: VisionConfig, x, lw):
    B, N, E = x.shape
    H = cfg.n_head
    D = E // H

    def lin(name, h):
        return _linear(
            _round_for(cfg, f"blk.{name}.weight", h), lw[f"{name}.weight"], lw[f"{name}.bias"]
        )

    h = _layer_norm(x, lw["ln1.weight"], lw["ln1.bias"], cfg.eps)
    q = lin("attn_q", h).reshape(B, N, H, D)
    k = lin("attn_k", h).reshape(B, N, H, D)
    v = lin("attn_v", h).reshape(B, N, H, D)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision=jax.lax.Precision.HIGHEST) * jnp.asarray(
        1.0 / np.sqrt(D), x.dtype
    )
    p = jax.nn.softmax(s, axis=-1)
    a = jnp.einsum("bhqk,bkhd->bqhd", p, v, precision=jax.lax.Precision.HIGHEST).reshape(B, N, E)
    x = x + lin("attn_out", a)
    h = _layer_norm(x, lw["ln2.weight"], lw["ln2.bias"], cfg.eps)
    h = _act(cfg.act)(lin("ffn_up", h))
    return x + lin("ffn_down", h)


# -- numerics "llamacpp": ggml's operation orders ---------------------------------------------


def _ggml_mm(cfg: VisionConfig, key: str | None, x, w, contiguous: bool = True):
    """x [..., K] @ w[O, K].T as ggml_mul_mat computes it on the CPU: activations rounded
    to the weight's vec_dot_type; tinyBLAS when x is contiguous with >= 2 rows, O % 4 == 0
    and K % 16 (BF16: 32) == 0, else ggml_vec_dot_*."""
    n = int(np.prod(x.shape[:-1]))
    O, K = w.shape[-2:]
    if key == "f16" or key in cfg.half:
        x, w = x.astype(jnp.float16).astype(F32), w.astype(jnp.float16).astype(F32)
        sgemm, step, vec = gf.dot_f16_sgemm, 16, gf.dot_f16_vec
    elif key in cfg.bf16:
        x, w = x.astype(jnp.bfloat16).astype(F32), w.astype(jnp.bfloat16).astype(F32)
        sgemm, step, vec = gf.dot_bf16_sgemm, 32, gf.dot_bf16_vec
    else:
        sgemm, step, vec = gf.dot_f32_sgemm, 16, gf.dot_f32_vec
    batched = contiguous and n >= 2 and O % 4 == 0 and K % step == 0
    return gf.opaque((sgemm if batched else vec)(gf.opaque(x)[..., None, :], w))


def _ggml_linear(cfg, key, x, w, b=None):
    y = _ggml_mm(cfg, key, x, w)
    return y if b is None else gf.opaque(y) + b


def _ggml_block(cfg: VisionConfig, x, lw):
    B, N, E = x.shape
    H = cfg.n_head
    D = E // H

    def lin(name, h):
        return _ggml_linear(cfg, f"blk.{name}.weight", h, lw[f"{name}.weight"], lw[f"{name}.bias"])

    h = gf.opaque(ggml_ops.layer_norm(x, lw["ln1.weight"], lw["ln1.bias"], cfg.eps))
    q = lin("attn_q", h).reshape(B, N, H, D).transpose(0, 2, 1, 3)
    k = lin("attn_k", h).reshape(B, N, H, D).transpose(0, 2, 1, 3)
    v = lin("attn_v", h).reshape(B, N, H, D).transpose(0, 2, 3, 1)  # ggml_cont: [B, H, D, N]
    # kq = mul_mat(k, q) over a permuted q: ggml_vec_dot_f32 per score
    s = gf.opaque(gf.dot_f32_vec(gf.opaque(q)[..., :, None, :], k[..., None, :, :]))
    p = ggml_ops._softmax_rows(gf.opaque(s * np.float32(1.0 / np.sqrt(D))))
    # kqv = mul_mat(v (made contiguous), kq): tinyBLAS when N % 16 == 0
    dot = gf.dot_f32_sgemm if N % 16 == 0 and D % 4 == 0 else gf.dot_f32_vec
    o = gf.opaque(dot(gf.opaque(p)[..., :, None, :], v[..., None, :, :]))
    x = gf.opaque(x + lin("attn_out", o.transpose(0, 2, 1, 3).reshape(B, N, E)))
    h = gf.opaque(ggml_ops.layer_norm(x, lw["ln2.weight"], lw["ln2.bias"], cfg.eps))
    h = gf.opaque(_act(cfg.act)(lin("ffn_up", h)))
    return gf.opaque(x + lin("ffn_down", h))


def _encode_ggml(cfg: VisionConfig, w: dict, x: jax.Array, B: int, g: int) -> jax.Array:
    """`encode` after patchifying (x [B, g·g, 3·p·p]), in ggml's operation orders."""
    x = _ggml_linear(cfg, "f16", x, w["patch_w"].reshape(cfg.n_embd, -1), None)
    x = gf.opaque(x) + w["patch_b"]
    if cfg.has_class:
        x = jnp.concatenate([x, jnp.broadcast_to(w["class"], (B, 1, cfg.n_embd))], axis=1)
    x = gf.opaque(x + w["pos"][None])
    if cfg.has_pre_ln:
        x = gf.opaque(ggml_ops.layer_norm(x, w["pre_ln_w"], w["pre_ln_b"], cfg.eps))
    layers = {k[4:]: v for k, v in w.items() if k.startswith("blk.")}
    # unrolled, not under lax.scan: in a scan of two or more layers XLA CPU gives other
    # bits where p·v takes the tinyBLAS emulation (N % 16 == 0). Measured on the LLaVA
    # tower's weights, x [1, N, 32], 2 layers: N = 16 1.27 off, N = 17 (vec_dot) equal;
    # dot_f32_sgemm alone in a 2-step scan is equal, so the cause is not isolated yet.
    # Unrolled, the 16-row gemma3 tower holds llama.cpp's goldens (tests/vision).
    for i in range(cfg.n_layer):
        x = _ggml_block(cfg, x, {k: v[i] for k, v in layers.items()})
    if cfg.has_post_ln:
        x = gf.opaque(ggml_ops.layer_norm(x, w["post_ln_w"], w["post_ln_b"], cfg.eps))
    E, k = cfg.n_embd, cfg.n_merge
    if cfg.projector == "gemma3":
        x = x.reshape(B, g // k, k, g // k, k, E).mean(axis=(2, 4)).reshape(B, (g // k) ** 2, E)
        x = ggml_ops.rms_norm(x, w["soft_emb_norm"], cfg.eps)
        return _ggml_mm(cfg, "proj", gf.opaque(x), w["proj"].T)
    if cfg.projector == "idefics3":
        x = (
            x.reshape(B, g // k, k, g // k, k, E)
            .transpose(0, 1, 3, 2, 4, 5)
            .reshape(B, (g // k) ** 2, k * k * E)
        )
        return _ggml_mm(cfg, "fc", x, w["fc"])
    x = x[:, 1 : 1 + g * g] if cfg.has_class else x
    x = ggml_ops.gelu(_ggml_linear(cfg, "mm0_w", x, w["mm0_w"], w["mm0_b"]))
    return _ggml_linear(cfg, "mm2_w", gf.opaque(x), w["mm2_w"], w["mm2_b"])


def encode(cfg: VisionConfig, w: dict, pixels: jax.Array) -> jax.Array:
    """(B, S, S, 3) f32 normalised tiles -> (B, cfg.tokens_per_image, cfg.n_text) f32."""
    B, S, _, _ = pixels.shape
    p = cfg.patch_size
    g = S // p
    x = (
        pixels.astype(F32)
        .reshape(B, g, p, g, p, 3)
        .transpose(0, 1, 3, 5, 2, 4)
        .reshape(B, g * g, 3 * p * p)
    )
    if cfg.numerics == "llamacpp":
        return _encode_ggml(cfg, w, x, B, g)
    # ggml_conv_2d runs as im2col + matmul in f16: pixels and kernel rounded to f16, f32 sums
    f16 = jnp.float16
    x = _linear(
        x.astype(f16).astype(F32),
        w["patch_w"].reshape(cfg.n_embd, 3 * p * p).astype(f16).astype(F32),
        w["patch_b"],
    )
    if cfg.has_class:
        cls = jnp.broadcast_to(w["class"], (B, 1, cfg.n_embd))
        x = jnp.concatenate([x, cls], axis=1)
    x = x + w["pos"][None]
    if cfg.has_pre_ln:
        x = _layer_norm(x, w["pre_ln_w"], w["pre_ln_b"], cfg.eps)
    layers = {k[4:]: v for k, v in w.items() if k.startswith("blk.")}
    if cfg.n_layer:
        x, _ = jax.lax.scan(lambda c, lw: (_block(cfg, c, lw), None), x, layers)
    if cfg.has_post_ln:
        x = _layer_norm(x, w["post_ln_w"], w["post_ln_b"], cfg.eps)
    E, k = cfg.n_embd, cfg.n_merge
    if cfg.projector == "gemma3":
        x = x.reshape(B, g // k, k, g // k, k, E).mean(axis=(2, 4)).reshape(B, (g // k) ** 2, E)
        x = (
            x
            * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + cfg.eps)
            * w["soft_emb_norm"]
        )
        x = _round_for(cfg, "proj", x)
        return jnp.einsum("bte,eo->bto", x, w["proj"], precision=jax.lax.Precision.HIGHEST)
    if cfg.projector == "idefics3":
        x = (
            x.reshape(B, g // k, k, g // k, k, E)
            .transpose(0, 1, 3, 2, 4, 5)
            .reshape(B, (g // k) ** 2, k * k * E)
        )
        return _linear(_round_for(cfg, "fc", x), w["fc"])
    x = x[:, 1 : 1 + g * g] if cfg.has_class else x
    x = ggml_ops.gelu(_linear(_round_for(cfg, "mm0_w", x), w["mm0_w"], w["mm0_b"]))
    return _linear(_round_for(cfg, "mm2_w", x), w["mm2_w"], w["mm2_b"])


@functools.partial(jax.jit, static_argnums=0)
def encode_jit(cfg: VisionConfig, w: dict, pixels: jax.Array) -> jax.Array:
    return encode(cfg, w, pixels)
