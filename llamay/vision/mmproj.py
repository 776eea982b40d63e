"""Reading a multimodal projector (mmproj) GGUF as llama.cpp's tools/mtmd/clip.cpp does.

An mmproj file (`general.architecture = clip`) holds a vision tower (`v.*` tensors) and a
projector (`mm.*`) into the text model's embedding width, described by `clip.*` keys.
`read_mmproj(path)` returns its `VisionConfig` (frozen, static under jit) and its weights as
a dict of f32 numpy arrays in numpy order (the reverse of ggml's `ne`), the transformer
blocks stacked along a leading layer axis for `lax.scan`.

Supported `clip.projector_type`s: `gemma3` (SigLIP + average pooling, soft-embedding RMS
norm, linear), `idefics3` (SigLIP + pixel shuffle + linear; SmolVLM) and `mlp` (CLIP +
LLaVA's two-layer MLP).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from llamay.errors import ProjectorError
from llamay.gguf import open_gguf
from llamay.quant import dequantize

PROJECTORS = ("gemma3", "idefics3", "mlp")
# clip.cpp's preprocessing per projector: resize algorithm, letterbox pad colour (None: no
# letterbox) and tiling.
RESIZE = {"gemma3": "bilinear", "idefics3": "lanczos", "mlp": "bicubic"}
PAD_COLOR = {"gemma3": (0, 0, 0), "mlp": (122, 116, 104)}
BLOCK_TENSORS = (
    "ln1.weight",
    "ln1.bias",
    "attn_q.weight",
    "attn_q.bias",
    "attn_k.weight",
    "attn_k.bias",
    "attn_v.weight",
    "attn_v.bias",
    "attn_out.weight",
    "attn_out.bias",
    "ln2.weight",
    "ln2.bias",
    "ffn_up.weight",
    "ffn_up.bias",
    "ffn_down.weight",
    "ffn_down.bias",
)


@dataclass(frozen=True)
class VisionConfig:
    projector: str  # clip.projector_type
    image_size: int
    patch_size: int
    n_embd: int
    n_head: int
    n_ff: int
    n_layer: int  # blocks the graph runs (mlp: up to the second-to-last)
    eps: float
    act: str  # "gelu" (ggml_gelu) or "gelu_quick"
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    n_merge: int  # gemma3: pooling kernel; idefics3: pixel-shuffle scale; mlp: 1
    longest_edge: int  # idefics3: clip.vision.preproc_image_size (0: none)
    n_text: int  # output width (the text model's n_embd)
    has_class: bool
    has_pre_ln: bool
    has_post_ln: bool
    # the weights stored F16/BF16 (pytree keys): ggml's matmul rounds its activations to
    # that type first (the weight type's vec_dot_type), so the tower does too
    half: frozenset[str] = frozenset()
    bf16: frozenset[str] = frozenset()
    # "llamacpp": every f32 operation as ggml's x86 CPU backend orders it (`encoder`'s
    # ggml path); "exact": f32 math with ggml's roundings (f16 activations, GELU tables)
    numerics: str = "exact"

    @property
    def n_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def tokens_per_image(self) -> int:
        """Embeddings one image_size x image_size tile becomes."""
        return self.n_patches // (self.n_merge * self.n_merge)


def _get(meta: dict, key: str, path: str, default=None):
    if key in meta:
        return meta[key]
    if default is None:
        raise ProjectorError(f"{path}: mmproj metadata lacks {key}")
    return default


def read_mmproj(path: str | os.PathLike) -> tuple[VisionConfig, dict[str, np.ndarray]]:
    path = os.fspath(path)
    with open_gguf(path) as g:
        meta = g.metadata
        arch = meta.get("general.architecture")
        if arch != "clip":
            raise ProjectorError(
                f"{path}: not a multimodal projector (general.architecture is {arch!r}; "
                "an mmproj file has 'clip')"
            )
        if not meta.get("clip.has_vision_encoder", False):
            raise ProjectorError(
                f"{path}: the projector has no vision encoder (clip.has_vision_encoder)"
            )
        proj = meta.get("clip.vision.projector_type") or meta.get("clip.projector_type")
        if proj not in PROJECTORS:
            raise ProjectorError(
                f"{path}: clip.projector_type {proj!r} is not supported "
                f"(llamay reads {', '.join(PROJECTORS)})"
            )

        types: dict[str, str] = {}

        def t(name: str) -> np.ndarray:
            info = g.tensors.get(name)
            if info is not None:
                types[name] = info.ggml_type.name
            if info is None:
                raise ProjectorError(
                    f"{path}: the {proj} projector needs tensor {name}, which the file lacks"
                )
            return dequantize(g.raw(name), info.ggml_type).reshape(info.shape).astype(np.float32)

        def has(name: str) -> bool:
            return name in g.tensors

        n_layer_file = int(_get(meta, "clip.vision.block_count", path))
        if meta.get("clip.use_gelu") and meta.get("clip.use_silu"):
            raise ProjectorError(f"{path}: both clip.use_gelu and clip.use_silu are set")
        if meta.get("clip.use_silu"):
            raise ProjectorError(f"{path}: SiLU vision towers (clip.use_silu) are not supported")
        feature_layers = meta.get("clip.vision.feature_layer")
        if feature_layers is not None and len(feature_layers):
            raise ProjectorError(
                f"{path}: explicit clip.vision.feature_layer (Granite) is not supported"
            )
        n_merge = {"gemma3": 4, "idefics3": 2, "mlp": 1}[proj]
        if proj != "mlp":
            n_merge = int(meta.get("clip.vision.projector.scale_factor", n_merge))
        mean = tuple(float(x) for x in _get(meta, "clip.vision.image_mean", path))
        std = tuple(float(x) for x in _get(meta, "clip.vision.image_std", path))
        if len(mean) < 3 or len(std) < 3:
            raise ProjectorError(f"{path}: clip.vision.image_mean/image_std need 3 values")
        w: dict[str, np.ndarray] = {}
        w["patch_w"] = t("v.patch_embd.weight")  # (n_embd, 3, p, p)
        w["patch_b"] = (
            t("v.patch_embd.bias")
            if has("v.patch_embd.bias")
            else np.zeros(w["patch_w"].shape[0], np.float32)
        )
        w["pos"] = t("v.position_embd.weight")
        has_class = has("v.class_embd")
        if has_class:
            w["class"] = t("v.class_embd")
        has_pre = has("v.pre_ln.weight")
        has_post = has("v.post_ln.weight")
        if has_pre:
            w["pre_ln_w"], w["pre_ln_b"] = t("v.pre_ln.weight"), t("v.pre_ln.bias")
        if has_post:
            w["post_ln_w"], w["post_ln_b"] = t("v.post_ln.weight"), t("v.post_ln.bias")
        # LLaVA's projector reads the second-to-last layer's output (clip.cpp: il_last)
        n_layer = n_layer_file - 1 if proj == "mlp" else n_layer_file
        n_embd = int(_get(meta, "clip.vision.embedding_length", path))
        blocks = {k: [] for k in BLOCK_TENSORS}
        for i in range(n_layer):
            for k in BLOCK_TENSORS:
                blocks[k].append(t(f"v.blk.{i}.{k}"))
        # old conversions stored ffn up and down swapped (clip.cpp's is_ffn_swapped)
        # (its test: ffn_down's ne[0] is the width, which also holds when n_ff == n_embd)
        if n_layer and blocks["ffn_down.weight"][0].shape[1] == n_embd:
            blocks["ffn_up.weight"], blocks["ffn_down.weight"] = (
                blocks["ffn_down.weight"],
                blocks["ffn_up.weight"],
            )
            blocks["ffn_up.bias"], blocks["ffn_down.bias"] = (
                blocks["ffn_down.bias"],
                blocks["ffn_up.bias"],
            )
        for k, v in blocks.items():
            w["blk." + k] = np.stack(v)
        if proj == "gemma3":
            w["soft_emb_norm"] = t("mm.soft_emb_norm.weight")
            w["proj"] = t("mm.input_projection.weight")  # (n_embd, n_text): applied as x @ proj
            n_text = w["proj"].shape[1]
        elif proj == "idefics3":
            w["fc"] = t("mm.model.fc.weight")  # (n_text, n_embd * n_merge^2)
            n_text = w["fc"].shape[0]
        else:
            w["mm0_w"], w["mm0_b"] = t("mm.0.weight"), t("mm.0.bias")
            w["mm2_w"], w["mm2_b"] = t("mm.2.weight"), t("mm.2.bias")
            n_text = w["mm2_w"].shape[0]
        sources = {
            "patch_w": "v.patch_embd.weight",
            "proj": "mm.input_projection.weight",
            "fc": "mm.model.fc.weight",
            "mm0_w": "mm.0.weight",
            "mm2_w": "mm.2.weight",
        }
        sources.update({"blk." + k: f"v.blk.0.{k}" for k in BLOCK_TENSORS if k.endswith(".weight")})
        # (a swapped up/down pair keeps its types in order: both come from the same layer)
        if "blk.ffn_up.weight" in w and w["blk.ffn_up.weight"].shape[1] != n_embd:
            sources["blk.ffn_up.weight"], sources["blk.ffn_down.weight"] = (
                sources["blk.ffn_down.weight"],
                sources["blk.ffn_up.weight"],
            )

        def of_type(name: str) -> frozenset[str]:
            return frozenset(k for k, src in sources.items() if k in w and types.get(src) == name)

        cfg = VisionConfig(
            projector=proj,
            image_size=int(_get(meta, "clip.vision.image_size", path)),
            patch_size=int(_get(meta, "clip.vision.patch_size", path)),
            n_embd=n_embd,
            n_head=int(_get(meta, "clip.vision.attention.head_count", path)),
            n_ff=int(_get(meta, "clip.vision.feed_forward_length", path)),
            n_layer=n_layer,
            eps=float(_get(meta, "clip.vision.attention.layer_norm_epsilon", path)),
            act="gelu" if meta.get("clip.use_gelu") else "gelu_quick",
            image_mean=mean[:3],
            image_std=std[:3],
            n_merge=n_merge,
            longest_edge=int(meta.get("clip.vision.preproc_image_size", 0)),
            n_text=int(n_text),
            has_class=has_class,
            has_pre_ln=has_pre,
            has_post_ln=has_post,
            half=of_type("F16"),
            bf16=of_type("BF16"),
        )
    side = cfg.image_size // cfg.patch_size
    if cfg.image_size % cfg.patch_size or side % cfg.n_merge:
        raise ProjectorError(
            f"{path}: image_size {cfg.image_size} does not divide into patches and merges"
        )
    if w["pos"].shape[0] != cfg.n_patches + int(has_class):
        raise ProjectorError(
            f"{path}: v.position_embd.weight has {w['pos'].shape[0]} rows "
            f"for {cfg.n_patches} patches"
        )
    if cfg.n_embd % cfg.n_head:
        raise ProjectorError(f"{path}: width {cfg.n_embd} is not a multiple of {cfg.n_head} heads")
    return cfg, w
