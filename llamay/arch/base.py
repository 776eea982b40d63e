"""What every architecture family provides, and the config and metadata helpers they share.

A family is data plus pure functions: `config(meta)` reads GGUF metadata into a
frozen `Config`; `tensors` names the GGUF tensors bound into the weight pytree;
`embed`, `block` and `head` are the forward pass, which `llamay.model` composes
(`block` runs under `lax.scan` over stacked per-layer weights).

Research scripts run a modified family with `dataclasses.replace(arch, block=...)`
and `Model.with_architecture(...)`, which stores the new `Architecture` in the
config (`Config.impl`); `llamay.arch.architecture_of(cfg)` is what the step functions call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from llamay.arch.validate import check_config, head_dim, hyperparameter
from llamay.errors import ModelFormatError

_REQUIRED = object()


def hparam(meta: dict[str, Any], arch: str, key: str, default: Any = _REQUIRED) -> Any:
    """`{arch}.{key}` from GGUF metadata; a missing required key, or a value out of the
    key's range (`llamay.arch.validate`), is a ModelFormatError."""
    full = f"{arch}.{key}"
    if full in meta:
        return hyperparameter(arch, key, meta[full])
    if default is _REQUIRED:
        raise ModelFormatError(f"GGUF metadata lacks {full!r}, which the {arch} architecture needs")
    return default


@dataclass(frozen=True)
class TensorSpec:
    """A GGUF tensor bound into the weight pytree under `role`.

    `name` may contain `{i}` (per-layer tensors). `optional` tensors may be absent.
    `every_layer`: one tensor that every layer uses (bound into each layer's weights,
    like llama.cpp's shared `rope_freqs.weight`).
    """

    role: str
    name: str
    optional: bool = False
    every_layer: bool = False

    @property
    def per_layer(self) -> bool:
        return "{i}" in self.name or self.every_layer


@dataclass(frozen=True)
class Architecture:
    name: str
    config: Callable[[dict[str, Any]], Any]
    tensors: tuple[TensorSpec, ...]
    embed: Callable  # (cfg, w, tokens [B,T], positions [B,T]) -> x [B,T,E]
    block: Callable  # (cfg, lw, x, positions, k_cache, v_cache, layer) -> (x, k_cache, v_cache)
    head: Callable  # (cfg, w, x [B,T,E]) -> logits [B,T,V] (encoders: the output states)
    aliases: tuple[str, ...] = field(default=())


# -- configs ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Rope:
    """Rotary embedding as llama.cpp applies it.

    kind: "norm" rotates adjacent pairs (2i, 2i+1), "neox" pairs (i, i + n_rot/2).
    scaling: "none", "linear" (positions × 1/factor) or "yarn" (ramped interpolation
    between dims with magnitude correction, `orig_ctx` = the training context).
    Llama-3-style scaling is not metadata: the converter stores per-dim divisors in the
    optional tensor `rope_freqs.weight`, which the families pass along when present.
    """

    kind: str
    base: float
    n_rot: int
    scaling: str = "none"
    factor: float = 1.0
    orig_ctx: int = 0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attn_factor: float = 1.0

    @property
    def freq_scale(self) -> float:
        return 1.0 / self.factor if self.scaling in ("linear", "yarn") and self.factor else 1.0


ROPE_SCALINGS = ("none", "linear", "yarn")
POOLINGS = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}  # llama_pooling_type


@dataclass(frozen=True, kw_only=True)
class Config:
    """One frozen (hashable, jit-static) config type for every family; a family sets the
    fields it uses and leaves the rest at their neutral defaults.

    The engine sizes the KV cache from `n_layers`, `n_kv_heads`, `head_dim`, `context_length`.
    """

    arch: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab: int
    context_length: int
    eps: float  # norm epsilon (RMSNorm or LayerNorm, see `norm`)
    ffn: int = 0
    rope: Rope | None = None
    norm: str = "rms"  # "rms" | "layer"
    causal: bool = True
    attn_scale: float = 0.0  # 0: 1/sqrt(head_dim)
    attn_softcap: float = 0.0  # 0: none
    final_softcap: float = 0.0  # 0: none
    embed_scale: float = 0.0  # 0: none
    act: str = "silu"  # gated MLP activation ("silu" | "gelu"); ungated: "gelu"
    gated: bool = True
    window: int = 0  # sliding-window size of the local layers (0: no local layers)
    swa_pattern: int = 0  # layer il is local iff il % swa_pattern < swa_pattern - 1
    rope_swa: Rope | None = None  # rope of the local layers (None: the global one)
    n_experts: int = 0
    n_experts_used: int = 0
    expert_ffn: int = 0
    pooling: str = "none"  # <arch>.pooling_type: "none" | "mean" | "cls" | "last" | "rank"
    numerics: str = "exact"  # "exact" | "llamacpp" (as llama.cpp's CPU backend rounds)
    # llamacpp numerics: llama.cpp's -fa on (its flash attention's rounding), and the thread
    # count of the run reproduced (its split path, one token over >= 512 cells, rounds by it)
    flash_attn: bool = False
    ggml_threads: int = 1
    impl: Architecture | None = None  # a research variant of the family (see module doc)

    @property
    def scale(self) -> float:
        return self.attn_scale or self.head_dim**-0.5


def read_rope(meta: dict[str, Any], arch: str, kind: str, head_dim: int) -> Rope:
    scaling = hparam(meta, arch, "rope.scaling.type", "none")
    if scaling not in ROPE_SCALINGS:
        raise ModelFormatError(
            f"{arch}.rope.scaling.type is {scaling!r}, which llamay does not implement "
            f"(supported: {', '.join(ROPE_SCALINGS)})"
        )
    factor = float(hparam(meta, arch, "rope.scaling.factor", 1.0)) if scaling != "none" else 1.0
    ctx = hparam(meta, arch, "context_length")
    return Rope(
        kind=kind,
        base=float(hparam(meta, arch, "rope.freq_base", 10000.0)),
        n_rot=hparam(meta, arch, "rope.dimension_count", head_dim),
        scaling=scaling,
        factor=factor,
        orig_ctx=hparam(meta, arch, "rope.scaling.original_context_length", ctx),
        beta_fast=float(hparam(meta, arch, "rope.scaling.yarn_beta_fast", 32.0)),
        beta_slow=float(hparam(meta, arch, "rope.scaling.yarn_beta_slow", 1.0)),
        attn_factor=float(hparam(meta, arch, "rope.scaling.attn_factor", 1.0)),
    )


def read_config(meta: dict[str, Any], *, rope: str | None, norm: str = "rms", **fields) -> Config:
    """The metadata every family shares; `rope` is the rope kind (None: no rope).

    `fields` set or override family-specific Config fields.
    """
    arch = meta["general.architecture"]
    n_heads = hparam(meta, arch, "attention.head_count")
    d_model = hparam(meta, arch, "embedding_length")
    if f"{arch}.attention.key_length" in meta:
        head_size = hparam(meta, arch, "attention.key_length")
    else:
        head_size = head_dim(arch, d_model, n_heads)
    v_dim = hparam(meta, arch, "attention.value_length", head_size)
    if v_dim != head_size:
        raise ModelFormatError(
            f"{arch}: attention.value_length {v_dim} differs from key_length {head_size}, "
            "which llamay's KV cache does not support"
        )
    eps_key = (
        "attention.layer_norm_rms_epsilon" if norm == "rms" else "attention.layer_norm_epsilon"
    )
    # As llama.cpp, the embedding and output rows are the tokenizer's tokens: a model
    # must not generate ids the tokenizer cannot spell.
    vocab = hparam(meta, arch, "vocab_size", None)
    tokens = meta.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list):
        if vocab is not None and vocab != len(tokens):
            raise ModelFormatError(
                f"GGUF metadata {arch}.vocab_size is {vocab}, but tokenizer.ggml.tokens "
                f"has {len(tokens)} tokens"
            )
        vocab = len(tokens)
    elif vocab is None:
        raise ModelFormatError(
            f"GGUF metadata lacks {arch}.vocab_size and tokenizer.ggml.tokens: "
            "the vocabulary size is unknown"
        )
    base = dict(
        arch=arch,
        n_layers=hparam(meta, arch, "block_count"),
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=hparam(meta, arch, "attention.head_count_kv", n_heads),
        head_dim=head_size,
        vocab=vocab,
        context_length=hparam(meta, arch, "context_length"),
        eps=float(hparam(meta, arch, eps_key)),
        ffn=hparam(meta, arch, "feed_forward_length", 0),
        rope=read_rope(meta, arch, rope, head_size) if rope else None,
        norm=norm,
    )
    cfg = Config(**(base | fields))
    check_config(cfg)
    return cfg
