"""Activation quantisers (Q8_0, Q8_1, Q8_K) against gguf-py and numpy references of ggml."""

from __future__ import annotations

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from llamay.errors import UnsupportedTensorTypeError
from llamay.gguf.constants import GGMLType
from llamay.quant import (
    VEC_DOT_TYPES,
    quantize_q8_0,
    quantize_q8_1,
    quantize_q8_k,
    round_activations,
)
from llamay.quant.formulas import q8_quants
from llamay.quant.layouts import jax_backend

T = GGMLType
f32 = np.float32


def activations(n: int, seed: int) -> np.ndarray:
    """[4, n] rows: normal, heavy-tailed, a zero block, and exact rounding ties."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((4, n)).astype(f32)
    x[1] *= np.exp(rng.standard_normal(n) * 3).astype(f32)
    x[2, :32] = 0.0
    x[2, 32:64] = -x[2, 32:64]
    # Block 0 of row 3: amax = 127 so d = 1 and every x*id is an exact k + 0.5;
    # for Q8_K the first max is negative (-127 before +127).
    x[3, :32] = np.r_[-127.0, 127.0, np.arange(-14.5, 15.5)]
    return x


def gguf_q8_0(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    raw = np.asarray(gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0))
    blocks = raw.reshape(*x.shape[:-1], -1, 34)
    d = blocks[..., :2].copy().view(np.float16).astype(f32)[..., 0]
    qs = blocks[..., 2:].view(np.int8).reshape(x.shape)
    return qs, d


def test_q8_0_ref_matches_gguf():
    x = activations(256, 1)
    got = jax.jit(quantize_q8_0)(x)
    qs, d = gguf_q8_0(x)
    np.testing.assert_array_equal(np.asarray(got.qs), qs)
    np.testing.assert_array_equal(np.asarray(got.d), d)
    expect = (qs.reshape(4, -1, 32).astype(f32) * d[..., None]).reshape(x.shape)
    np.testing.assert_array_equal(np.asarray(got.values), expect)
    assert got.sums is None


def test_q8_1_ref_matches_gguf_and_sum():
    x = activations(256, 2)
    got = jax.jit(quantize_q8_1)(x)
    qs, d16 = gguf_q8_0(x)  # Q8_1's quants and d are Q8_0's
    np.testing.assert_array_equal(np.asarray(got.qs), qs)
    np.testing.assert_array_equal(np.asarray(got.d), d16)
    blocks = x.reshape(4, -1, 32)
    d = np.abs(blocks).max(-1) / f32(127)  # the unrounded f32 scale
    total = qs.reshape(4, -1, 32).astype(np.int32).sum(-1).astype(f32)
    np.testing.assert_array_equal(np.asarray(got.sums), (total * d).astype(np.float16))


def simd_q8_reference(x: np.ndarray, variant: str) -> tuple[np.ndarray, np.ndarray]:
    """ggml's AVX (x86) and NEON (arm) quantize_row_q8_0: ties go to even."""
    b = x.reshape(*x.shape[:-1], -1, 32)
    amax = np.abs(b).max(-1, keepdims=True)
    d = amax / f32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, f32(127) / amax, f32(0)) if variant == "x86" else None
        inv = np.where(d != 0, f32(1) / d, f32(0)) if variant == "arm" else inv
    qs = np.rint(b * inv).astype(np.int8).reshape(x.shape)
    return qs, d[..., 0].astype(np.float16).astype(f32)


@pytest.mark.parametrize("variant", ["x86", "arm"])
def test_q8_0_simd_variants(variant):
    x = activations(128, 3)
    got = quantize_q8_0(x, variant)
    qs, d = simd_q8_reference(x, variant)
    np.testing.assert_array_equal(np.asarray(got.qs), qs)
    np.testing.assert_array_equal(np.asarray(got.d), d)


def test_variants_differ_at_ties():
    x = activations(32, 4)[3:]
    ref, x86 = quantize_q8_0(x).qs, quantize_q8_0(x, "x86").qs
    # x = k + 0.5 with d = 1: roundf goes away from zero, the SIMD paths to even.
    np.testing.assert_array_equal(np.asarray(ref[0, 2:6]), [-15, -14, -13, -12])
    np.testing.assert_array_equal(np.asarray(x86[0, 2:6]), [-14, -14, -12, -12])


def test_unknown_variant():
    with pytest.raises(ValueError, match="variant"):
        quantize_q8_0(np.zeros((32,), f32), "avx9")


def nearest_int(v: np.float32) -> int:
    """ggml's nearest_int: add 1.5 * 2**23 and read the low mantissa bits."""
    val = np.array(f32(v) + f32(12582912.0), dtype=f32)
    i = int(val.view(np.int32))
    return (i & 0x007FFFFF) - 0x00400000


def q8_k_reference(x: np.ndarray):
    """quantize_row_q8_K_ref, one scalar at a time in float32."""
    blocks = x.reshape(-1, 256)
    qs = np.zeros(blocks.shape, np.int8)
    d = np.zeros(len(blocks), f32)
    for i, blk in enumerate(blocks):
        amax, mx = f32(0), f32(0)
        for v in blk:
            if abs(v) > amax:
                amax, mx = abs(v), v
        if not amax:
            continue
        iscale = f32(-127.0) / mx
        qs[i] = [min(127, nearest_int(iscale * v)) for v in blk]
        d[i] = f32(1.0) / iscale
    bsums = qs.reshape(-1, 16, 16).astype(np.int32).sum(-1).astype(np.int16)
    shape = x.shape[:-1]
    return qs.reshape(x.shape), d.reshape(*shape, -1), bsums.reshape(*shape, -1)


def test_q8_k_matches_ggml_reference():
    x = activations(512, 5)
    x[2, :256] = 0.0  # an all-zero super-block
    got = jax.jit(quantize_q8_k)(x)
    qs, d, bsums = q8_k_reference(x)
    np.testing.assert_array_equal(np.asarray(got.qs), qs)
    np.testing.assert_array_equal(np.asarray(got.d), d)
    np.testing.assert_array_equal(np.asarray(got.sums), bsums)
    values = (qs.reshape(4, 2, 256).astype(f32) * d[..., None]).reshape(x.shape)
    np.testing.assert_array_equal(np.asarray(got.values), values)
    assert float(got.d[3, 0]) > 0  # first max was -127: iscale = +1


def test_leading_dims_and_jit():
    x = activations(256, 6).reshape(2, 2, 256)
    for fn in (quantize_q8_0, quantize_q8_1, quantize_q8_k):
        flat = fn(x.reshape(4, 256))
        got = jax.jit(fn)(jnp.asarray(x))
        assert got.values.shape == x.shape
        np.testing.assert_array_equal(np.asarray(got.values).reshape(4, 256), flat.values)


@pytest.mark.parametrize("w", sorted(VEC_DOT_TYPES), ids=lambda t: t.name)
def test_round_activations_dispatch(w):
    x = jnp.asarray(activations(256, 7))
    got = np.asarray(round_activations(x, w))
    dot = VEC_DOT_TYPES[w]
    expect = {
        T.F32: lambda: np.asarray(x),
        T.F16: lambda: np.asarray(x).astype(np.float16).astype(f32),
        T.BF16: lambda: np.asarray(x.astype(jnp.bfloat16).astype(jnp.float32)),
        T.Q8_0: lambda: quantize_q8_0(x).values,
        T.Q8_1: lambda: quantize_q8_1(x).values,
        T.Q8_K: lambda: quantize_q8_k(x).values,
    }[dot]()
    np.testing.assert_array_equal(got, np.asarray(expect))


def test_round_activations_unknown_type():
    with pytest.raises(UnsupportedTensorTypeError):
        round_activations(jnp.zeros((256,)), T.I32)


def test_q8_scale_is_a_true_division():
    """d = amax / 127 in IEEE f32, as ggml computes it. XLA rewrites divisions
    algebraically (a / bcast(c) -> a * (1/c), 1 / (a / b) -> b / a), each off by an ulp
    in a few % of blocks; the f16 rounding of d hides that from smaller checks."""
    x = np.random.default_rng(8).standard_normal((64, 256, 32)).astype(f32)
    for variant in ("ref", "x86"):
        qs, d = jax.jit(lambda v, variant=variant: q8_quants(jax_backend(), v, variant))(x)
        np.testing.assert_array_equal(np.asarray(d), np.abs(x).max(-1, keepdims=True) / f32(127))
    x = x.reshape(64, -1)
    qs, d16 = gguf_q8_0(x)
    got = jax.jit(quantize_q8_0)(x)
    np.testing.assert_array_equal(np.asarray(got.qs), qs)
    np.testing.assert_array_equal(np.asarray(got.d), d16)
    for variant in ("x86", "arm"):
        got = jax.jit(quantize_q8_0, static_argnums=1)(x, variant)
        np.testing.assert_array_equal(np.asarray(got.qs), simd_q8_reference(x, variant)[0])


def q8_k_numpy(x: np.ndarray):
    """quantize_row_q8_K_ref vectorised (checked against the scalar version below)."""
    b = x.reshape(*x.shape[:-1], -1, 256)
    mx = np.take_along_axis(b, np.abs(b).argmax(-1)[..., None], -1)
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = np.where(mx != 0, f32(-127) / mx, f32(0))
        d = np.where(mx != 0, f32(1) / iscale, f32(0))[..., 0]
    qs = np.minimum(np.rint(iscale * b), 127).astype(np.int8).reshape(x.shape)
    return qs, d


def test_q8_k_many_blocks():
    x = np.random.default_rng(9).standard_normal((64, 64 * 256)).astype(f32)
    small = activations(512, 10)
    for a, b in zip(q8_k_numpy(small), q8_k_reference(small)[:2], strict=True):
        np.testing.assert_array_equal(a, b)
    got = jax.jit(quantize_q8_k)(x)
    qs, d = q8_k_numpy(x)
    np.testing.assert_array_equal(np.asarray(got.qs), qs)
    np.testing.assert_array_equal(np.asarray(got.d), d)
