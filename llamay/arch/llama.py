"""The llama family (also Mistral-style files, which use the same graph).

As llama.cpp builds it: pre-RMSNorm blocks, NORM rope (adjacent pairs; GGUF
conversion permutes Q/K so this equals HF's rotate-half), grouped-query attention,
SwiGLU MLP, output tied to the token embedding when `output.weight` is absent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax

from llamay.arch.base import Architecture, TensorSpec, hparam
from llamay.arch.layers import apply_rope, attention, rms_norm, rope_angles, swiglu, write_kv
from llamay.errors import ModelFormatError
from llamay.quant import qmatmul


@dataclass(frozen=True)
class LlamaConfig:
    arch: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_rot: int
    ffn: int
    vocab: int
    context_length: int
    eps: float
    rope_base: float
    rope_freq_scale: float = 1.0
    rope_kind: str = "norm"


def config(meta: dict[str, Any]) -> LlamaConfig:
    arch = meta["general.architecture"]
    n_heads = hparam(meta, arch, "attention.head_count")
    d_model = hparam(meta, arch, "embedding_length")
    head_dim = hparam(meta, arch, "attention.key_length", d_model // n_heads)
    scaling = hparam(meta, arch, "rope.scaling.type", "none")
    if scaling not in ("none", "linear"):
        raise ModelFormatError(
            f"rope scaling {scaling!r} is not supported for {arch} yet (supported: none, linear)"
        )
    factor = hparam(meta, arch, "rope.scaling.factor", 1.0) if scaling == "linear" else 1.0
    vocab = hparam(meta, arch, "vocab_size", None) or len(meta["tokenizer.ggml.tokens"])
    return LlamaConfig(
        arch=arch,
        n_layers=hparam(meta, arch, "block_count"),
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=hparam(meta, arch, "attention.head_count_kv", n_heads),
        head_dim=head_dim,
        n_rot=hparam(meta, arch, "rope.dimension_count", head_dim),
        ffn=hparam(meta, arch, "feed_forward_length"),
        vocab=vocab,
        context_length=hparam(meta, arch, "context_length"),
        eps=hparam(meta, arch, "attention.layer_norm_rms_epsilon"),
        rope_base=hparam(meta, arch, "rope.freq_base", 10000.0),
        rope_freq_scale=1.0 / factor if factor else 1.0,
    )


TENSORS = (
    TensorSpec("tok_embd", "token_embd.weight"),
    TensorSpec("output_norm", "output_norm.weight"),
    TensorSpec("output", "output.weight", optional=True),
    TensorSpec("attn_norm", "blk.{i}.attn_norm.weight"),
    TensorSpec("wq", "blk.{i}.attn_q.weight"),
    TensorSpec("wk", "blk.{i}.attn_k.weight"),
    TensorSpec("wv", "blk.{i}.attn_v.weight"),
    TensorSpec("wo", "blk.{i}.attn_output.weight"),
    TensorSpec("ffn_norm", "blk.{i}.ffn_norm.weight"),
    TensorSpec("w_gate", "blk.{i}.ffn_gate.weight"),
    TensorSpec("w_up", "blk.{i}.ffn_up.weight"),
    TensorSpec("w_down", "blk.{i}.ffn_down.weight"),
)


def embed(cfg: LlamaConfig, w, tokens: jax.Array) -> jax.Array:
    return w["tok_embd"].rows(tokens)


def self_attention(cfg, lw, h, positions, k_cache, v_cache):
    """Project, rope, write this step's K/V into the cache, attend, project out."""
    B, T, _ = h.shape
    q = qmatmul(h, lw["wq"]).reshape(B, T, cfg.n_heads, cfg.head_dim)
    k = qmatmul(h, lw["wk"]).reshape(B, T, cfg.n_kv_heads, cfg.head_dim)
    v = qmatmul(h, lw["wv"]).reshape(B, T, cfg.n_kv_heads, cfg.head_dim)
    cos, sin = rope_angles(positions, cfg.n_rot, cfg.rope_base, cfg.rope_freq_scale)
    q = apply_rope(q, cos, sin, cfg.rope_kind)
    k = apply_rope(k, cos, sin, cfg.rope_kind)
    k_cache = write_kv(k_cache, k, positions)
    v_cache = write_kv(v_cache, v, positions)
    o = attention(q, k_cache, v_cache, positions, scale=cfg.head_dim**-0.5)
    return qmatmul(o.reshape(B, T, -1), lw["wo"]), k_cache, v_cache


def block(cfg: LlamaConfig, lw, x, positions, k_cache, v_cache, layer):
    a, k_cache, v_cache = self_attention(
        cfg, lw, rms_norm(x, lw["attn_norm"], cfg.eps), positions, k_cache, v_cache
    )
    x = x + a
    x = x + swiglu(rms_norm(x, lw["ffn_norm"], cfg.eps), lw["w_gate"], lw["w_up"], lw["w_down"])
    return x, k_cache, v_cache


def head(cfg: LlamaConfig, w, x: jax.Array) -> jax.Array:
    out = w.get("output", w["tok_embd"])
    return qmatmul(rms_norm(x, w["output_norm"], cfg.eps), out)


ARCH = Architecture(
    name="llama",
    config=config,
    tensors=TENSORS,
    embed=embed,
    block=block,
    head=head,
    aliases=("mistral",),
)
