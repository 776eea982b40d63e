"""BERT-style encoders (sentence embeddings), as llama.cpp's bert graph computes them.

x = LayerNorm(token_embd[t] + token_types[0] + position_embd[pos]); each layer is
post-norm: x = LN(x + attn(x)), x = LN(x + down(gelu(up·x + b_up)) + b_down), with
biases on q/k/v/o, no rope, and non-causal attention over the whole sequence. The
output is the last layer's states (no LM head); `pooling_type` from the metadata says
how `Model.embed` pools them (mean, CLS = first token, last, rank). A cross-encoder
reranker (pooling_type 4, RANK: bge-reranker, jina-reranker) adds llama.cpp's
classifier head `cls.{weight,bias}` (tanh) and `cls.output.{weight,bias}`
(llamay.model.embed.rank_head).

Every token gets token type 0 (llama.cpp feeds no segment ids). CLS/SEP are the
tokenizer's business, not the graph's.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from llamay.arch import decoder
from llamay.arch.base import POOLINGS, Architecture, Config, TensorSpec, hparam, read_config
from llamay.errors import ModelFormatError


def config(meta: dict[str, Any]) -> Config:
    arch = meta["general.architecture"]
    code = hparam(meta, arch, "pooling_type", 0)
    if code not in POOLINGS:
        raise ModelFormatError(
            f"{arch}.pooling_type {code} is not supported "
            f"(supported: {', '.join(f'{k} ({v})' for k, v in POOLINGS.items())})"
        )
    return read_config(
        meta,
        rope=None,
        norm="layer",
        causal=bool(hparam(meta, arch, "attention.causal", False)),
        gated=False,
        act="gelu",
        pooling=POOLINGS[code],
    )


def _layer(role: str, name: str) -> tuple[TensorSpec, TensorSpec]:
    return TensorSpec(role, f"blk.{{i}}.{name}.weight"), TensorSpec(
        role + "_b", f"blk.{{i}}.{name}.bias"
    )


TENSORS = (
    TensorSpec("tok_embd", "token_embd.weight"),
    TensorSpec("token_types", "token_types.weight", optional=True),
    TensorSpec("pos_embd", "position_embd.weight"),
    TensorSpec("embd_norm", "token_embd_norm.weight"),
    TensorSpec("embd_norm_b", "token_embd_norm.bias"),
    *_layer("wq", "attn_q"),
    *_layer("wk", "attn_k"),
    *_layer("wv", "attn_v"),
    *_layer("wo", "attn_output"),
    *_layer("attn_out_norm", "attn_output_norm"),
    *_layer("w_up", "ffn_up"),
    *_layer("w_down", "ffn_down"),
    *_layer("layer_out_norm", "layer_output_norm"),
    # the rank head of cross-encoder rerankers (llama.cpp's LLM_TENSOR_CLS, CLS_OUT)
    TensorSpec("cls", "cls.weight", optional=True),
    TensorSpec("cls_b", "cls.bias", optional=True),
    TensorSpec("cls_out", "cls.output.weight", optional=True),
    TensorSpec("cls_out_b", "cls.output.bias", optional=True),
)


def embed(cfg: Config, w, tokens: jax.Array, positions: jax.Array) -> jax.Array:
    pos_embd = w["pos_embd"]
    x = w["tok_embd"].rows(tokens) + pos_embd.rows(jnp.clip(positions, 0, pos_embd.shape[0] - 1))
    if "token_types" in w:
        x = x + w["token_types"].rows(jnp.zeros((), jnp.int32))
    return decoder.sub_norm(cfg, w, "embd_norm", x)


def block(cfg: Config, lw, x, positions, k_cache, v_cache, layer):
    o, k_cache, v_cache = decoder.self_attention(cfg, lw, x, positions, k_cache, v_cache, layer)
    x = decoder.sub_norm(cfg, lw, "attn_out_norm", x + decoder.out_proj(lw, o))
    x = decoder.sub_norm(cfg, lw, "layer_out_norm", x + decoder.mlp(cfg, lw, x, layer))
    return x, k_cache, v_cache


def head(cfg: Config, w, x: jax.Array) -> jax.Array:
    """Encoders have no LM head: the output is the last layer's states [B, T, E]."""
    return x


ARCH = Architecture(
    name="bert", config=config, tensors=TENSORS, embed=embed, block=block, head=head
)
