"""Quantisation: byte-equal to gguf-py's quantize, and a sane round trip."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from llamay.errors import UnsupportedTensorTypeError
from llamay.gguf.constants import GGMLType
from llamay.quant import dequantize, quantize

T = GGMLType
TYPES = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]
# Round-trip error bound relative to each block's range.
STEP = {T.Q4_0: 1 / 8, T.Q4_1: 1 / 15, T.Q5_0: 1 / 16, T.Q5_1: 1 / 31, T.Q8_0: 1 / 127}


def gguf_quantize(x: np.ndarray, t: GGMLType) -> np.ndarray:
    with np.errstate(all="ignore"):
        out = np.asarray(gguf.quants.quantize(x, gguf.GGMLQuantizationType(int(t))))
    return out.view(np.uint8).reshape(*x.shape[:-1], -1)


def edge_rows(rng: np.random.Generator) -> np.ndarray:
    """[12, 64] float32 rows of awkward blocks: zeros, -0, constants, the max value present with
    both signs, exact ties of every quantiser's rounding, subnormals, huge values."""
    r = rng.standard_normal((12, 64)).astype(np.float32)
    r[0] = 0.0
    r[1] = -0.0
    r[2] = 1.5
    r[3, :32] = np.tile([3.0, -3.0], 16)
    r[3, 32:] = np.tile([-3.0, 3.0], 16)
    r[4] = np.round(r[4] * 8) / 8  # many exact .5 steps after scaling
    r[5] = np.linspace(-16, 15, 64)  # Q4/Q5 level ties
    r[6, :32] = np.r_[127.0, np.arange(-15, 16) + 0.5]  # Q8_0: d = 1, x*id on exact halves
    r[7] *= 1e-41  # subnormal f32
    r[8] *= 1e30  # f16 overflow to inf
    r[9] = rng.standard_normal(64).astype(np.float32) + 100  # all positive, far from 0
    r[10] = -np.abs(r[10])
    r[11, ::7] = 0.0
    return r


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_byte_equal_to_gguf(t):
    rng = np.random.default_rng(int(t))
    x = np.concatenate([rng.standard_normal((20, 64)).astype(np.float32), edge_rows(rng)])
    x = x.reshape(4, 8, 64)  # leading dims
    got = quantize(x, t)
    assert got.dtype == np.uint8 and got.shape[:-1] == (4, 8)
    np.testing.assert_array_equal(got, gguf_quantize(x, t))


@pytest.mark.parametrize("t", [T.F32, T.F16, T.BF16], ids=lambda t: t.name)
def test_float_types_keep_specials(t):
    bits = np.random.default_rng(5).integers(0, 2**32, (4, 32), dtype=np.uint32)
    x = bits.view(np.float32)  # NaNs with payloads, infs, subnormals
    np.testing.assert_array_equal(quantize(x, t), gguf_quantize(x, t))


@settings(max_examples=60, deadline=None)
@given(
    t=st.sampled_from(TYPES[3:]),
    x=hnp.arrays(
        np.float32,
        (2, 64),
        elements=st.floats(-1e4, 1e4, width=32, allow_subnormal=True),
    ),
)
def test_byte_equal_hypothesis(t, x):
    np.testing.assert_array_equal(quantize(x, t), gguf_quantize(x, t))


@pytest.mark.parametrize("t", list(STEP), ids=lambda t: t.name)
def test_round_trip_error_bounded(t):
    x = np.random.default_rng(9).standard_normal((16, 128)).astype(np.float32)
    back = dequantize(quantize(x, t), t)
    blocks = x.reshape(16, 4, 32)
    span = np.abs(blocks).max(-1, keepdims=True) * 2
    err = np.abs(back.reshape(16, 4, 32) - blocks)
    assert (err <= span * STEP[t] * 0.51 + 1e-6).all()


@pytest.mark.parametrize("t", [T.Q4_K, T.Q8_1, T.IQ4_NL, 77], ids=str)
def test_unsupported(t):
    with pytest.raises(UnsupportedTensorTypeError):
        quantize(np.zeros((1, 256), np.float32), t)


def test_ragged_rejected():
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize(np.zeros((2, 48), np.float32), T.Q8_0)
