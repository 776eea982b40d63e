"""Scoring's reduction over the vocabulary as one native kernel (`src/logprobs.cc`):
each row's log-softmax at a picked token and the first index of its maximum, the
reference being `llamay.kernels.logprobs.logprob_argmax_reference` (XLA: a max, an
exp-sum and a variadic argmax reduce, each a single-threaded loop over the logits)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from llamay.kernels_cpu.build import targets


def logprob_argmax_native(logits, picks, variant: str = "native"):
    """(log_softmax(logits) at picks [..., J] f32, argmax(logits) [...] int32) over the
    last axis, J tokens picked per row, or None when it does not apply (not f32 logits /
    int32 picks [rows, J]) or the kernels are not built."""
    if not isinstance(logits, jax.Array) or not isinstance(picks, jax.Array):
        return None
    if logits.ndim == 0 or logits.dtype != jnp.float32 or logits.shape[-1] == 0:
        return None
    if picks.shape[:-1] != logits.shape[:-1] or picks.ndim != logits.ndim:
        return None
    if picks.dtype != jnp.int32 or picks.shape[-1] == 0:
        return None
    prefix = targets(variant)
    if prefix is None:
        return None
    out = (
        jax.ShapeDtypeStruct(picks.shape, jnp.float32),
        jax.ShapeDtypeStruct(picks.shape[:-1], jnp.int32),
    )
    call = jax.ffi.ffi_call(prefix + "LlamayLogprobArgmax", out, vmap_method="sequential")
    lp, first = call(logits, picks)
    return lp, first
