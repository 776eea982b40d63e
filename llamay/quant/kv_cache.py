"""Quantised KV cache rows (`llamay.kv.types`): what the cache writers and the attention
paths need to store and read a row of any KV type.

A cache array's type follows from its dtype and row width (`cache_type`): float32,
float16 and bfloat16 arrays are those types; a uint8 array of D/32·b bytes a row holds
GGUF blocks of the 32-element type with b bytes a block (Q8_0 34, Q5_1 24, Q5_0 22,
Q4_1 20, Q4_0 18). Rows are written as llama.cpp's CPU backend writes its cache
(ggml_set_rows with the type's `from_float`): Q8_0 by `quantize_row_q8_0`'s x86 SIMD
code, the others by their reference quantisers (in ggml-base, built without FMA: x·(1/d)
and + offset rounded apart, as gguf-py computes them), f16/bf16 round to nearest even; and
read back with `dequantize_jnp` (exact in f32).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from llamay.gguf.constants import BLOCK_SIZES, GGMLType
from llamay.quant.jnp_dequant import dequantize_jnp
from llamay.quant.quantize import JNP_TYPES, quantize_jnp

_FLOATS = {
    np.dtype(jnp.float32): GGMLType.F32,
    np.dtype(jnp.float16): GGMLType.F16,
    np.dtype(jnp.bfloat16): GGMLType.BF16,
}
# ggml's from_float for Q8_0 on x86 (quantize_row_q8_0, AVX2/AVX-512): see act_quant
Q8_VARIANT = "x86"


def cache_type(cache, head_dim: int) -> GGMLType:
    """The GGML type of a cache array whose rows hold heads of `head_dim` (static)."""
    dt = np.dtype(cache.dtype)
    if dt in _FLOATS:
        return _FLOATS[dt]
    if dt == np.uint8 and head_dim % 32 == 0:
        per_block = cache.shape[-1] * 32 // head_dim
        for t in JNP_TYPES:
            if BLOCK_SIZES[t] == (32, per_block) and cache.shape[-1] % (head_dim // 32) == 0:
                return t
    raise ValueError(
        f"a {dt} KV cache with rows of {cache.shape[-1]} for heads of {head_dim} is no KV type"
    )


def is_quantised(cache) -> bool:
    return np.dtype(cache.dtype) == np.uint8


def encode(new: jax.Array, cache) -> jax.Array:
    """new [..., D] as rows of `cache`'s type (for scattering into it)."""
    if not is_quantised(cache):
        return new.astype(cache.dtype)
    t = cache_type(cache, new.shape[-1])
    return quantize_jnp(new, t, Q8_VARIANT)


def decode(cache: jax.Array, head_dim: int) -> jax.Array:
    """A cache of any KV type [..., row] -> its values f32 [..., head_dim] (float caches
    keep their dtype: callers widen as they need)."""
    if not is_quantised(cache):
        return cache
    return dequantize_jnp(cache, cache_type(cache, head_dim))
