"""Activation quantisers of llama.cpp's CPU matmuls, in jnp (for numerics="llamacpp").

ggml's CPU backend rounds the activations to the weight type's "vec_dot type"
before every matmul: Q8_0 (int8, blocks of 32) for Q4_0/Q5_0/Q8_0 weights, Q8_1
(Q8_0 plus a block sum) for Q4_1/Q5_1, Q8_K (int8, blocks of 256, f32 scale)
for K-quants, f16/bf16 for F16/BF16 weights. The functions here reproduce
ggml's `quantize_row_q8_0/q8_1/q8_K` bit for bit and return both the integer
parts (for integer-dot kernels) and the round-tripped f32 values (`qs * d`, the
activations as the dot product sees them).

Q8_0/Q8_1 come in three flavours (`variant`), because ggml's SIMD paths differ
from its reference at exact rounding ties: "ref" (quantize_row_q8_*_ref),
"x86" (AVX/AVX2/AVX-512 builds: id = 127/amax, ties to even) and "arm" (NEON:
ties to even). Q8_K uses the reference everywhere.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from llamay.errors import UnsupportedTensorTypeError
from llamay.gguf.constants import BLOCK_SIZES, GGMLType
from llamay.quant.formulas import q8_quants, signed_absmax
from llamay.quant.layouts import jax_backend

_T = GGMLType

# ggml-cpu's type_traits_cpu[weight].vec_dot_type.
VEC_DOT_TYPES: dict[GGMLType, GGMLType] = {
    _T.F32: _T.F32,
    _T.F16: _T.F16,
    _T.BF16: _T.BF16,
    _T.Q4_0: _T.Q8_0,
    _T.Q5_0: _T.Q8_0,
    _T.Q8_0: _T.Q8_0,
    _T.Q4_1: _T.Q8_1,
    _T.Q5_1: _T.Q8_1,
    _T.Q2_K: _T.Q8_K,
    _T.Q3_K: _T.Q8_K,
    _T.Q4_K: _T.Q8_K,
    _T.Q5_K: _T.Q8_K,
    _T.Q6_K: _T.Q8_K,
    **{t: _T.Q8_K for t in (_T.IQ2_XXS, _T.IQ2_XS, _T.IQ2_S, _T.IQ3_XXS, _T.IQ3_S)},
    **{t: _T.Q8_K for t in (_T.IQ1_S, _T.IQ1_M, _T.IQ4_XS, _T.TQ1_0, _T.TQ2_0)},
    _T.IQ4_NL: _T.Q8_0,
    _T.MXFP4: _T.Q8_0,
}


class Q8Acts(NamedTuple):
    """Activations x [..., n] quantised in blocks of B (32 or 256)."""

    values: jax.Array  # f32 [..., n]: qs * d, the activations as ggml's dot product sees them
    qs: jax.Array  # int8 [..., n]
    d: jax.Array  # f32 [..., n // B]: block scale (Q8_0/Q8_1: the stored f16, widened)
    sums: jax.Array | None  # Q8_1: f16(d * Σqs) widened, [..., n // 32];
    #                         Q8_K: int16 sums of 16 quants, [..., n // 16]; Q8_0: None


def _blocks(x: jax.Array, t: GGMLType) -> jax.Array:
    size = BLOCK_SIZES[t][0]
    if x.ndim == 0 or x.shape[-1] % size:
        raise ValueError(
            f"cannot quantise activations of shape {x.shape} to {t.name}: the last dim "
            f"must be a multiple of {size}"
        )
    return x.astype(jnp.float32).reshape(*x.shape[:-1], x.shape[-1] // size, size)


def _acts(qs: jax.Array, d: jax.Array, sums: jax.Array | None, shape) -> Q8Acts:
    values = qs.astype(jnp.float32) * d
    return Q8Acts(values.reshape(shape), qs.reshape(shape), d[..., 0], sums)


def _q8_0_blocks(x: jax.Array, variant: str):
    qs, d = q8_quants(jax_backend(), x, variant)
    return qs, d, d.astype(jnp.float16).astype(jnp.float32)


def quantize_q8_0(x: jax.Array, variant: str = "ref") -> Q8Acts:
    """ggml's quantize_row_q8_0 over the last axis (a multiple of 32)."""
    qs, _, d16 = _q8_0_blocks(_blocks(x, _T.Q8_0), variant)
    return _acts(qs, d16, None, x.shape)


def quantize_q8_1(x: jax.Array, variant: str = "ref") -> Q8Acts:
    """ggml's quantize_row_q8_1: Q8_0's quants plus s = f16(d * Σqs) per block."""
    qs, d, d16 = _q8_0_blocks(_blocks(x, _T.Q8_1), variant)
    total = jnp.sum(qs.astype(jnp.int32), axis=-1, keepdims=True).astype(jnp.float32)
    s = (total * d).astype(jnp.float16).astype(jnp.float32)
    return _acts(qs, d16, s[..., 0], x.shape)


def quantize_q8_k(x: jax.Array) -> Q8Acts:
    """ggml's quantize_row_q8_K_ref over the last axis (a multiple of 256).

    iscale = -127 / (the first element of largest magnitude), quants are
    nearest-even of iscale * x capped at 127, d = 1 / iscale (f32); an all-zero
    block gets d = 0.
    """
    b = _blocks(x, _T.Q8_K)
    opaque = jax.lax.optimization_barrier  # keep XLA from rewriting the divisions
    mx = signed_absmax(jax_backend(), b)
    nonzero = mx != 0
    iscale = opaque(jnp.where(nonzero, -127 / opaque(jnp.where(nonzero, mx, 1)), 0))
    qs = jnp.minimum(jnp.round(iscale * b), 127).astype(jnp.int8)
    d = jnp.where(nonzero, 1 / jnp.where(nonzero, iscale, 1), 0)
    bsums = jnp.sum(qs.reshape(*qs.shape[:-1], -1, 16), axis=-1, dtype=jnp.int16)
    return _acts(qs, d, bsums.reshape(*x.shape[:-1], -1), x.shape)


def round_activations(x: jax.Array, weight_type: GGMLType | int, variant: str = "ref") -> jax.Array:
    """x [..., n] as llama.cpp's CPU matmul against a `weight_type` weight sees it (f32)."""
    try:
        dot = VEC_DOT_TYPES[GGMLType(weight_type)]
    except (ValueError, KeyError):
        raise UnsupportedTensorTypeError(
            f"no activation rounding known for weight type {weight_type!r}"
        ) from None
    x = x.astype(jnp.float32)
    if dot == _T.F32:
        return x
    if dot in (_T.F16, _T.BF16):
        return x.astype(jnp.float16 if dot == _T.F16 else jnp.bfloat16).astype(jnp.float32)
    if dot == _T.Q8_K:
        return quantize_q8_k(x).values
    quant = quantize_q8_0 if dot == _T.Q8_0 else quantize_q8_1
    return quant(x, variant).values
