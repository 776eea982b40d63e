"""The jit-compiled generation steps: forward, head on the rows that sample, and
on-device sampling fused into one call, so a step returns just the new token ids.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from llamay.arch import architecture_of
from llamay.model import forward
from llamay.sample import SamplingParams, sample


@partial(jax.jit, static_argnames=("cfg",), donate_argnames=("kv",))
def prefill_step(cfg, weights, kv, tokens, positions, last, params: SamplingParams, keys):
    """Prefill a (bucket-padded) prompt and sample the first new token of each row.

    last [B]: index in T of each row's last real token. Returns (tokens [B], keys, kv).
    """
    arch = architecture_of(cfg)
    x, kv, _ = forward(cfg, weights, kv, tokens, positions)
    x_last = jnp.take_along_axis(x, last[:, None, None], axis=1)
    logits = arch.head(cfg, weights, x_last)[:, 0]
    next_tokens, keys = sample(logits, params, keys)
    return next_tokens, keys, kv


@partial(jax.jit, static_argnames=("cfg",), donate_argnames=("kv",))
def decode_step(cfg, weights, kv, tokens, positions, params: SamplingParams, keys):
    """One token per row: tokens [B] at positions [B]. Returns (next tokens [B], keys, kv)."""
    arch = architecture_of(cfg)
    x, kv, _ = forward(cfg, weights, kv, tokens[:, None], positions[:, None])
    logits = arch.head(cfg, weights, x)[:, 0]
    next_tokens, keys = sample(logits, params, keys)
    return next_tokens, keys, kv


@partial(jax.jit, static_argnames=("cfg", "steps"), donate_argnames=("kv",))
def decode_many(cfg, steps, weights, kv, tokens, positions, params: SamplingParams, keys):
    """`steps` decode steps in one program, each fed the token the last one sampled (the
    first: tokens [B] at positions [B]), as `decode_step` would be `steps` times, without a
    dispatch and a host round trip per token. Returns (tokens [steps, B], keys, kv)."""

    def one(carry, _):
        kv, tok, pos, keys = carry
        nxt, keys, kv = decode_step.__wrapped__(cfg, weights, kv, tok, pos, params, keys)
        return (kv, nxt, pos + 1, keys), nxt

    (kv, _, _, keys), out = jax.lax.scan(one, (kv, tokens, positions, keys), None, length=steps)
    return out, keys, kv


@partial(jax.jit, static_argnames=("cfg",), donate_argnames=("kv",))
def prefill_logits(cfg, weights, kv, tokens, positions, last):
    """Prefill without sampling (constrained generation samples after the host's mask):
    returns (logits [B, V] at each row's last real token, kv)."""
    arch = architecture_of(cfg)
    x, kv, _ = forward(cfg, weights, kv, tokens, positions)
    x_last = jnp.take_along_axis(x, last[:, None, None], axis=1)
    return arch.head(cfg, weights, x_last)[:, 0], kv


@partial(jax.jit, static_argnames=("cfg",), donate_argnames=("kv",))
def decode_logits(cfg, weights, kv, tokens, positions):
    """One token per row without sampling: returns (logits [B, V], kv)."""
    arch = architecture_of(cfg)
    x, kv, _ = forward(cfg, weights, kv, tokens[:, None], positions[:, None])
    return arch.head(cfg, weights, x)[:, 0], kv


sample_masked = jax.jit(sample)
