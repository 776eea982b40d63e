"""Scoring's reduction over the vocabulary: `logprob_argmax(logits, picks)` gives each
row's log-softmax at J picked tokens (picks [..., J]: the target, or a multiple-choice
task's answers after one context) and the first index of the row's maximum (whether a
pick is the greedy token). On CPU one native pass over each row
(`llamay.kernels_cpu.logprob_argmax`: its sum of exponentials in double, as llama.cpp's
perplexity tool forms it); elsewhere, and as the test oracle's twin, the XLA reference.
`argmax(x)`: the first index of each row's maximum (the sampler's greedy pick), and
`top_k(x, k)`: `jax.lax.top_k`'s values and ids (the sampler's view), natively on CPU too."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from llamay import kernels_cpu
from llamay.kernels.backend import backend


def logprob_argmax_reference(logits: jax.Array, picks: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(log_softmax(logits) at picks [..., J] f32, argmax(logits) [...] int32) over the
    last axis."""
    logits = logits.astype(jnp.float32)
    lse = jax.nn.logsumexp(logits, axis=-1, keepdims=True)
    picked = jnp.take_along_axis(logits, picks, axis=-1, mode="clip")
    return picked - lse, jnp.argmax(logits, axis=-1).astype(jnp.int32)


def logprob_argmax(logits: jax.Array, picks: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`logprob_argmax_reference`'s values, natively where the backend takes it."""
    if backend().native:
        got = kernels_cpu.logprob_argmax(logits.astype(jnp.float32), picks.astype(jnp.int32))
        if got is not None:
            return got
    return logprob_argmax_reference(logits, picks)


def argmax_reference(x: jax.Array) -> jax.Array:
    """jnp.argmax over the last axis (the first index of the maximum; 0 for a row
    holding a NaN) as two plain reductions: XLA CPU runs argmax's paired (value, index)
    reduce unvectorised, 0.27 ms over a 49k vocabulary against 0.05 ms for these."""
    n = x.shape[-1]
    m = jnp.max(x, axis=-1, keepdims=True)
    i = jnp.min(jnp.where(x == m, jnp.arange(n, dtype=jnp.int32), n), axis=-1)
    return jnp.where(i == n, 0, i)


def argmax(x: jax.Array) -> jax.Array:
    """`argmax_reference`'s values, natively where the backend takes it (one pass over
    each row, ~10x XLA CPU's two over Gemma 3's 262k logits)."""
    if backend().native and x.dtype == jnp.float32:
        got = kernels_cpu.argmax(x)
        if got is not None:
            return got
    return argmax_reference(x)


def top_k(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """`jax.lax.top_k(x, k)` (values, int32 ids; ties to the lower index), natively where
    the backend takes it (one pass over each row: XLA CPU partially sorts all V indices,
    ~0.5 ms for the sampler's 512 of Gemma 3's 262k logits)."""
    if backend().native and x.dtype == jnp.float32:
        got = kernels_cpu.top_k(x, k)
        if got is not None:
            return got
    vals, ids = jax.lax.top_k(x, k)
    return vals, ids.astype(jnp.int32)
