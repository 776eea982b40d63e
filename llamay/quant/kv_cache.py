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


# -- llama.cpp's attention rotation for quantised caches -------------------------------------
#
# llama.cpp (llama-kv-cache.cpp, attn_rot_k / attn_rot_v; LLAMA_ATTN_ROT_DISABLE turns it
# off) rotates q and k by an orthonormal Walsh-Hadamard matrix before a quantised K cache
# stores k, and v (then the attention output, back) before a quantised V cache stores v,
# when the head dim is a multiple of 64: quantisation error spreads over the block instead
# of sitting on the outlier channels. K rotates in blocks of the largest power of two
# (>= 64) dividing the head dim, V in blocks of 64. Exact math is unchanged (H·H = I and
# (Hq)·(Hk) = q·k); the stored blocks are llama.cpp's. ggml computes H·x as a fast
# Walsh-Hadamard transform (ggml_compute_forward_fwht): x·(1/sqrtf(n)), then butterflies
# (u + v, u - v) over strides 1, 2, 4, ...; each step here is the same f32 operation.

V_ROTATION = 64


def k_rotation(head_dim: int) -> int:
    """The K rotation's block size for a quantised K cache (0: none, head dim % 64 != 0)."""
    if head_dim % 64:
        return 0
    n = 64
    while head_dim % (2 * n) == 0:
        n *= 2
    return n


def v_rotation(head_dim: int) -> int:
    """The V rotation's block size for a quantised V cache (0: none)."""
    return V_ROTATION if head_dim % V_ROTATION == 0 else 0


def hadamard(x: jax.Array, n: int) -> jax.Array:
    """x [..., D] with each block of n (a power of two) times the orthonormal Sylvester
    Hadamard matrix, as ggml's FWHT computes it (f32)."""
    if not n:
        return x
    shape = x.shape
    y = x.astype(jnp.float32).reshape(*shape[:-1], shape[-1] // n, n)
    y = y * (np.float32(1) / np.sqrt(np.float32(n)))
    half = 1
    while half < n:
        y = y.reshape(*y.shape[:-1], n // (2 * half), 2, half)
        u, v = y[..., 0, :], y[..., 1, :]
        y = jnp.stack([u + v, u - v], axis=-2).reshape(*shape[:-1], shape[-1] // n, n)
        half *= 2
    return y.reshape(shape)


def rotations(k_cache, v_cache, head_dim: int) -> tuple[int, int]:
    """(K, V) rotation block sizes for caches of these stored arrays (0: not rotated)."""
    k = k_rotation(head_dim) if is_quantised(k_cache) else 0
    v = v_rotation(head_dim) if is_quantised(v_cache) else 0
    return k, v
