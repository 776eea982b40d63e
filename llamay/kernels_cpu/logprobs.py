"""Reductions over the vocabulary as native kernels (`src/logprobs.cc`): scoring's, each
row's log-softmax at a picked token and the first index of its maximum (the reference:
`llamay.kernels.logprobs.logprob_argmax_reference`, XLA's max, exp-sum and variadic
argmax reduce, each a single-threaded loop over the logits); the sampler's greedy pick
(`llamay.kernels.logprobs.argmax_reference`) and its top-k view (`jax.lax.top_k`)."""

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


def argmax_native(x, variant: str = "native"):
    """The first index of each row's maximum over the last axis [...] int32, 0 for a row
    holding a NaN, or None when it does not apply (not f32) or the kernels are not built."""
    if not isinstance(x, jax.Array) or x.ndim == 0 or x.dtype != jnp.float32 or x.shape[-1] == 0:
        return None
    prefix = targets(variant)
    if prefix is None:
        return None
    out = jax.ShapeDtypeStruct(x.shape[:-1], jnp.int32)
    return jax.ffi.ffi_call(prefix + "LlamayArgmax", out, vmap_method="sequential")(x)


def top_k_native(x, k: int, variant: str = "native"):
    """(values [..., k] f32, ids [..., k] int32): each row's k best over the last axis
    exactly as `jax.lax.top_k` gives them on CPU, or None when it does not apply (not
    f32, k outside [1, V]) or the kernels are not built."""
    if not isinstance(x, jax.Array) or x.ndim == 0 or x.dtype != jnp.float32:
        return None
    if not 1 <= k <= x.shape[-1]:
        return None
    prefix = targets(variant)
    if prefix is None:
        return None
    out = (
        jax.ShapeDtypeStruct((*x.shape[:-1], k), jnp.float32),
        jax.ShapeDtypeStruct((*x.shape[:-1], k), jnp.int32),
    )
    return tuple(jax.ffi.ffi_call(prefix + "LlamayTopK", out, vmap_method="sequential")(x))
