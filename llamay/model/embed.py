"""Embeddings and rerank scores as llama.cpp computes them (llama-graph's build_pooling,
common_embd_normalize, llama-server's format_rerank).

The per-token embedding is the last layer's output after the final norm, before any LM
head (llama.cpp's `t_embd`): a decoder's `output_norm` applies, an encoder (bert) has
none. Pooling then reduces one sequence's states [T, E]:
  none -> [T, E] as is; mean -> the average; cls -> the first token; last -> the last;
  rank -> the first token through the classifier head: tanh(cls @ x + cls_b), then
  cls_out @ . + cls_out_b (either part may be absent, as in jina-reranker-v1-tiny) ->
  [n_cls_out] scores (one for bge/jina rerankers).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from llamay.arch.base import POOLINGS as POOLING_CODES
from llamay.arch.decoder import sub_norm
from llamay.arch.layers import linear
from llamay.errors import ModelFormatError, RequestError
from llamay.model.forward import forward

POOLINGS = tuple(POOLING_CODES.values())


def pooling_of(meta: dict[str, Any]) -> str:
    """The pooling a GGUF asks for (`<arch>.pooling_type`); none when it says nothing."""
    arch = meta.get("general.architecture", "")
    code = meta.get(f"{arch}.pooling_type", 0)
    if code not in POOLING_CODES:
        raise ModelFormatError(
            f"{arch}.pooling_type {code} is not a llama.cpp pooling type "
            f"({', '.join(f'{k} {v}' for k, v in POOLING_CODES.items())})"
        )
    return POOLING_CODES[code]


def check_pooling(kind: str) -> str:
    if kind not in POOLINGS:
        raise RequestError(f"unknown pooling {kind!r} (one of {', '.join(POOLINGS)})")
    return kind


@partial(jax.jit, static_argnames=("cfg",))
def states_step(cfg, weights, kv, tokens, positions):
    """Per-token embeddings [B, T, E]: the last layer's output after the final norm."""
    x, _, _ = forward(cfg, weights, kv, tokens, positions, hidden=False)
    return sub_norm(cfg, weights, "output_norm", x)


def rank_head(weights, cls_state: np.ndarray) -> np.ndarray:
    """llama.cpp's RANK pooling on the first token's state: [n_cls_out] scores."""
    x = jnp.asarray(cls_state, jnp.float32)[None, None]
    if "cls" in weights:
        x = jnp.tanh(linear(x, weights["cls"], weights.get("cls_b")))
    if "cls_out" in weights:
        x = linear(x, weights["cls_out"], weights.get("cls_out_b"))
    return np.asarray(x[0, 0], np.float32)


def pool(states: np.ndarray, kind: str, weights=None) -> np.ndarray:
    """One sequence's states [T, E] pooled as llama.cpp pools them (see the module doc)."""
    if kind == "none":
        return states
    if kind == "mean":
        return states.mean(axis=0)
    if kind == "cls":
        return states[0]
    if kind == "last":
        return states[-1]
    if kind == "rank":
        return rank_head(weights, states[0])
    raise RequestError(f"unknown pooling {kind!r} (one of {', '.join(POOLINGS)})")


def normalize(v: np.ndarray, mode: int = 2) -> np.ndarray:
    """common_embd_normalize: -1 none, 0 max-absolute scaled to int16 range, 1 taxicab,
    2 Euclidean (llama-server's default), p > 2 the p-norm; a zero vector stays zero."""
    v = np.asarray(v, np.float32)
    if mode < 0:
        return v
    if mode == 0:
        s = float(np.max(np.abs(v))) / 32760.0
    elif mode == 2:
        s = float(np.sqrt(np.sum(v.astype(np.float64) ** 2)))
    else:
        s = float(np.sum(np.abs(v.astype(np.float64)) ** mode) ** (1.0 / mode))
    return (v * (1.0 / s if s > 0 else 0.0)).astype(np.float32)


def rerank_tokens(tokenizer, query: list[int], doc: list[int]) -> list[int]:
    """llama-server's format_rerank: [BOS] query [EOS if add_eos] [SEP if add_sep] doc EOS,
    the EOS falling back to SEP (BERT vocabularies have no EOS: [CLS] q [SEP] d [SEP])."""
    eos = tokenizer.eos_id if tokenizer.eos_id is not None else tokenizer.sep_id
    bos = tokenizer.bos_id
    vocab = tokenizer.vocab
    out = [bos] if vocab.add_bos and bos is not None else []
    out += list(query)
    if vocab.add_eos and eos is not None:
        out.append(eos)
    if vocab.add_sep and tokenizer.sep_id is not None:
        out.append(tokenizer.sep_id)
    out += list(doc)
    if eos is not None:
        out.append(eos)
    return out
