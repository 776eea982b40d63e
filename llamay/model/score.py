"""Batched scoring steps: many padded rows [B, T] from an empty context, in one jit call.

Each row is a separate sequence starting at position 0, right-padded (padding tokens get
position `T`, which `write_kv` drops, so they never enter the cache). The KV cache is a
scratch buffer made inside the step, sized to the row bucket `T`.

- `batch_logits`: logits at every position [B, T, V] (tests, small batches).
- `prefix_logprobs`: log p(token | the row so far) and whether that token is the argmax,
  for rows grouped by a shared prefix: each prefix runs once and its KV is copied to its
  rows (a context's endings; a perplexity chunk's unscored first half), which run only
  their scored positions, J tokens picked at each (the next one, or several one-token
  answers after one context). The LM head runs on those positions only, in chunks under
  `lax.map` so [B, K, V] logits never exist at once, each chunk's reduction over the
  vocabulary one pass (`llamay.kernels.logprob_argmax`) (perplexity, lm-eval scoring).

With a `mesh` (`llamay.model.sharding`), the scratch cache is laid out along it (batch
over "data", kv heads over "model" where they divide); weights and inputs carry their own
shardings and XLA's partitioner does the rest.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from llamay.arch import architecture_of
from llamay.kernels import logprob_argmax
from llamay.kv import new_dense_kv
from llamay.model.forward import forward

# Logits one head chunk materialises (B · chunk · vocab · 4 bytes ≤ this): small enough to
# stay in cache between the head's matmul and the reduction over them (Gemma 3's 262,144
# tokens: 64 rows a chunk).
HEAD_CHUNK_BYTES = 64 << 20


def _scratch_kv(cfg, batch: int, slots: int, kv_dtype, mesh):
    kv = new_dense_kv(cfg.n_layers, batch, slots, cfg.n_kv_heads, cfg.head_dim, kv_dtype)
    if mesh is None:
        return kv
    from llamay.model.sharding import kv_sharding

    return jax.lax.with_sharding_constraint(kv, kv_sharding(cfg, mesh))


def _hidden(cfg, weights, tokens, positions, kv_dtype, mesh):
    B, T = tokens.shape
    kv = _scratch_kv(cfg, B, T, kv_dtype, mesh)
    x, _, _ = forward(cfg, weights, kv, tokens, positions)
    return x


@partial(jax.jit, static_argnames=("cfg", "kv_dtype", "mesh"))
def batch_logits(cfg, weights, tokens, positions, kv_dtype=jnp.float32, mesh=None):
    """Logits [B, T, V] of padded rows tokens/positions [B, T] (each from position 0)."""
    x = _hidden(cfg, weights, tokens, positions, kv_dtype, mesh)
    return architecture_of(cfg).head(cfg, weights, x)


def head_chunk(n: int, batch: int, vocab: int) -> int:
    """The largest power of two dividing n with batch · chunk · vocab f32 logits within
    HEAD_CHUNK_BYTES (>= 1)."""
    rows = max(HEAD_CHUNK_BYTES // (4 * max(1, vocab)), batch)
    c = 1
    while n % (2 * c) == 0 and batch * 2 * c <= rows:
        c *= 2
    return c


@partial(jax.jit, static_argnames=("cfg", "kv_dtype", "mesh"))
def prefix_logprobs(
    cfg, weights, prefix, prefix_pos, suffix, suffix_pos, picks, kv_dtype=jnp.float32, mesh=None
):
    """Rows that share a prefix, the prefix run once: prefix/prefix_pos [G, P] (each
    group's shared tokens), suffix/suffix_pos [G, R, K] (R rows continuing each prefix at
    the positions after it) and picks [G, R, K, J] (the tokens scored after each suffix
    position) -> (log-probabilities [G, R, K, J] f32, greedy flags [G, R, K, J]). Padding:
    position P + K. The prefix's KV is computed for the G groups, copied to their R rows,
    and only suffix positions go through the LM head (a multiple-choice task's endings
    after one context: the context once, not once per ending)."""
    G, R, K = suffix.shape
    J = picks.shape[-1]
    kv = _scratch_kv(cfg, G, prefix.shape[1] + K, kv_dtype, mesh)
    _, kv, _ = forward(cfg, weights, kv, prefix, prefix_pos)
    kv = jax.tree.map(lambda a: jnp.repeat(a, R, axis=1), kv)  # [L, G * R, slots, ...]
    x, _, _ = forward(cfg, weights, kv, suffix.reshape(G * R, K), suffix_pos.reshape(G * R, K))
    lp, greedy = _head_logprobs(cfg, weights, x, picks.reshape(G * R, K, J))
    return lp.reshape(G, R, K, J), greedy.reshape(G, R, K, J)


def _head_logprobs(cfg, weights, x, picks):
    """The LM head over hidden states x [B, K, E], in chunks of at most HEAD_CHUNK_BYTES
    of logits, each reduced at once to (log-probabilities of picks [B, K, J], whether
    each is the argmax)."""
    arch = architecture_of(cfg)
    B, K, E = x.shape
    J = picks.shape[-1]
    c = head_chunk(K, B, cfg.vocab)
    xs = x.reshape(B, K // c, c, E).transpose(1, 0, 2, 3)
    ps = picks.reshape(B, K // c, c, J).transpose(1, 0, 2, 3)

    def one(args):
        xc, pc = args
        lp, first = logprob_argmax(arch.head(cfg, weights, xc), pc)
        return lp, first[..., None] == pc

    lp, greedy = jax.lax.map(one, (xs, ps))
    return lp.transpose(1, 0, 2, 3).reshape(B, K, J), greedy.transpose(1, 0, 2, 3).reshape(B, K, J)
