"""Reductions over the vocabulary as native kernels (`src/logprobs.cc`): scoring's, each
row's log-softmax at a picked token and the first index of its maximum (the reference:
`llamay.kernels.logprobs.logprob_argmax_reference`, XLA's max, exp-sum and variadic
argmax reduce, each a single-threaded loop over the logits); the sampler's greedy pick
(`llamay.kernels.logprobs.argmax_reference`) and its top-k view (`jax.lax.top_k`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from llamay.kernels_cpu.build import targets


def _rows(x) -> bool:
    """Whether x is f32 rows of at least one logit (a traced or concrete jax.Array)."""
    return isinstance(x, jax.Array) and x.ndim > 0 and x.dtype == jnp.float32 and x.shape[-1] > 0


def _call(name: str, variant: str, out, *args):
    """The kernel `name` of the `variant` build on args, or None when it is not built."""
    prefix = targets(variant)
    if prefix is None:
        return None
    return jax.ffi.ffi_call(prefix + name, out, vmap_method="sequential")(*args)


def logprob_argmax_native(logits, picks, variant: str = "native"):
    """(log_softmax(logits) at picks [..., J] f32, argmax(logits) [...] int32) over the
    last axis, J tokens picked per row, or None when it does not apply (not f32 logits /
    int32 picks [rows, J]) or the kernels are not built."""
    if not _rows(logits) or not isinstance(picks, jax.Array):
        return None
    if picks.shape[:-1] != logits.shape[:-1] or picks.ndim != logits.ndim:
        return None
    if picks.dtype != jnp.int32 or picks.shape[-1] == 0:
        return None
    out = (
        jax.ShapeDtypeStruct(picks.shape, jnp.float32),
        jax.ShapeDtypeStruct(picks.shape[:-1], jnp.int32),
    )
    got = _call("LlamayLogprobArgmax", variant, out, logits, picks)
    return None if got is None else tuple(got)


def argmax_native(x, variant: str = "native"):
    """The first index of each row's maximum over the last axis [...] int32, 0 for a row
    holding a NaN, or None when it does not apply (not f32) or the kernels are not built."""
    if not _rows(x):
        return None
    return _call("LlamayArgmax", variant, jax.ShapeDtypeStruct(x.shape[:-1], jnp.int32), x)


def top_k_native(x, k: int, variant: str = "native"):
    """(values [..., k] f32, ids [..., k] int32): each row's k best over the last axis
    exactly as `jax.lax.top_k` gives them on CPU, or None when it does not apply (not
    f32, k outside [1, V]) or the kernels are not built."""
    if not _rows(x) or not 1 <= k <= x.shape[-1]:
        return None
    shape = (*x.shape[:-1], k)
    out = (jax.ShapeDtypeStruct(shape, jnp.float32), jax.ShapeDtypeStruct(shape, jnp.int32))
    got = _call("LlamayTopK", variant, out, x)
    return None if got is None else tuple(got)
