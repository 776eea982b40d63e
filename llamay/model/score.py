"""Batched scoring steps: many padded rows [B, T] from an empty context, in one jit call.

Each row is a separate sequence starting at position 0, right-padded (padding tokens get
position `T`, which `write_kv` drops, so they never enter the cache). The KV cache is a
scratch buffer made inside the step, sized to the row bucket `T`.

- `batch_logits`: logits at every position [B, T, V] (tests, small batches).
- `token_logprobs`: log p(targets[b, t] | tokens[b, :t+1]) and whether that target is the
  argmax, for positions `head_from ..` of every row: the LM head runs in chunks under
  `lax.map` so [B, T, V] logits never exist at once (perplexity, lm-eval scoring).

With a `mesh` (`llamay.model.sharding`), the scratch cache is laid out along it (batch
over "data", kv heads over "model" where they divide); weights and inputs carry their own
shardings and XLA's partitioner does the rest.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from llamay.arch import architecture_of
from llamay.kv import new_dense_kv
from llamay.model.forward import forward

# Tokens whose logits one head chunk materialises (B · chunk ≤ this).
HEAD_CHUNK_TOKENS = 4096


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


def head_chunk(n: int, batch: int) -> int:
    """The largest power of two dividing n with batch · chunk <= HEAD_CHUNK_TOKENS (>= 1)."""
    c = 1
    while n % (2 * c) == 0 and batch * 2 * c <= max(HEAD_CHUNK_TOKENS, batch):
        c *= 2
    return c


@partial(jax.jit, static_argnames=("cfg", "kv_dtype", "head_from", "mesh"))
def token_logprobs(
    cfg, weights, tokens, positions, targets, kv_dtype=jnp.float32, head_from: int = 0, mesh=None
):
    """For rows tokens/positions/targets [B, T]: (log-probability of targets[b, t] after
    tokens[b, :t+1] [B, T - head_from] f32, whether targets[b, t] is the argmax (bool))."""
    arch = architecture_of(cfg)
    x = _hidden(cfg, weights, tokens, positions, kv_dtype, mesh)[:, head_from:]
    tg = targets[:, head_from:]
    B, T, E = x.shape
    c = head_chunk(T, B)
    xs = x.reshape(B, T // c, c, E).transpose(1, 0, 2, 3)
    ts = tg.reshape(B, T // c, c).transpose(1, 0, 2)

    def one(args):
        xc, tc = args
        logits = arch.head(cfg, weights, xc).astype(jnp.float32)
        lse = jax.nn.logsumexp(logits, axis=-1)
        picked = jnp.take_along_axis(logits, tc[..., None], axis=-1)[..., 0]
        greedy = jnp.argmax(logits, axis=-1) == tc
        return picked - lse, greedy

    lp, greedy = jax.lax.map(one, (xs, ts))
    return lp.transpose(1, 0, 2).reshape(B, T), greedy.transpose(1, 0, 2).reshape(B, T)
