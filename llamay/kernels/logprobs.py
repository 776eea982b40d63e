"""Scoring's reduction over the vocabulary: `logprob_argmax(logits, picks)` gives each
row's log-softmax at J picked tokens (picks [..., J]: the target, or a multiple-choice
task's answers after one context) and the first index of the row's maximum (whether a
pick is the greedy token). On CPU one native pass over each row
(`llamay.kernels_cpu.logprob_argmax`: its sum of exponentials in double, as llama.cpp's
perplexity tool forms it); elsewhere, and as the test oracle's twin, the XLA reference."""

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
