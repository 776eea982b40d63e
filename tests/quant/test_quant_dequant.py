"""Dequantisation: numpy vs gguf-py bit for bit, jnp vs numpy bit for bit, on random blocks."""

from __future__ import annotations

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from llamay.errors import UnsupportedTensorTypeError
from llamay.gguf.constants import GGMLType
from llamay.quant import LAYOUTS, QTensor, dequantize, dequantize_jnp

T = GGMLType
TYPES = list(LAYOUTS)
NO_GGUF_ORACLE = {T.Q8_K}  # gguf-py has no Q8_K dequantiser


def random_blocks(t: GGMLType, shape: tuple[int, ...], n_blocks: int, seed: int) -> np.ndarray:
    """Random bytes [*shape, n_blocks * block_bytes]; scale fields (f16 d/dmin/m, Q8_K's f32 d)
    set to finite values of either sign over a wide range, f16 subnormals included. The
    plain float types keep every random bit pattern (NaN, inf, subnormals)."""
    lay = LAYOUTS[t]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (*shape, n_blocks, lay.block_bytes), dtype=np.uint8)
    if t in (T.F32, T.F16, T.BF16):
        return raw.reshape(*shape, -1)
    pos = 0
    for f in lay.fields:
        if f.dtype in ("float16", "float32"):
            mag = np.exp2(rng.uniform(-20, 4, (*shape, n_blocks)))
            val = (mag * rng.choice([-1.0, 1.0], mag.shape)).astype(f.dtype)
            raw[..., pos : pos + f.nbytes] = val[..., None].view(np.uint8)
        pos += f.nbytes
    return raw.reshape(*shape, -1)


def bits(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).view(np.uint32)


def _gguf_dequant(raw: np.ndarray, t: GGMLType) -> np.ndarray:
    return np.asarray(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(int(t))), np.float32)


_jit_dequant = jax.jit(dequantize_jnp, static_argnums=1)


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_numpy_matches_gguf_bit_exact(t):
    raw = random_blocks(t, (5,), 37, seed=int(t))
    ours = dequantize(raw, t)
    n_cols = 37 * LAYOUTS[t].block_elems
    assert ours.shape == (5, n_cols) and ours.dtype == np.float32
    if t in NO_GGUF_ORACLE:
        d = raw.reshape(5, 37, -1)[..., :4].copy().view(np.float32)
        qs = raw.reshape(5, 37, -1)[..., 4:260].view(np.int8).astype(np.float32)
        expect = (qs * d).reshape(5, -1)
    else:
        expect = _gguf_dequant(raw, t)
    np.testing.assert_array_equal(bits(ours), bits(expect))


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_jnp_matches_numpy_bit_exact(t):
    raw = random_blocks(t, (2, 3), 11, seed=100 + int(t))  # stacked layers [L, rows, bytes]
    ours = dequantize(raw, t)
    got = _jit_dequant(jnp.asarray(raw), t)
    assert got.shape == ours.shape and got.dtype == jnp.float32
    np.testing.assert_array_equal(bits(got), bits(ours))


@pytest.mark.parametrize("t", [T.F16, T.Q4_K, T.Q5_0], ids=lambda t: t.name)
def test_eager_and_1d(t):
    raw = random_blocks(t, (), 4, seed=7)
    ours = dequantize(raw, t)
    assert ours.shape == (4 * LAYOUTS[t].block_elems,)
    np.testing.assert_array_equal(bits(dequantize_jnp(raw, t)), bits(ours))


def test_int_type_code_accepted():
    raw = random_blocks(T.Q4_0, (2,), 3, seed=1)
    np.testing.assert_array_equal(dequantize(raw, 2), dequantize(raw, T.Q4_0))


@pytest.mark.parametrize("t", [T.Q8_1, T.I32, T.F64, 99], ids=str)
def test_unsupported_type_is_named(t):
    raw = np.zeros((1, 64), np.uint8)
    name = GGMLType(t).name if t in GGMLType._value2member_map_ else str(t)
    with pytest.raises(UnsupportedTensorTypeError, match=name):
        dequantize(raw, t)
    with pytest.raises(UnsupportedTensorTypeError, match=name):
        dequantize_jnp(jnp.asarray(raw), t)


def test_ragged_row_rejected():
    with pytest.raises(ValueError, match="18-byte blocks"):
        dequantize(np.zeros((2, 20), np.uint8), T.Q4_0)


def test_qtensor_uses_jnp_dequant():
    raw = random_blocks(T.Q6_K, (6,), 2, seed=3)
    w = QTensor.from_raw(raw, T.Q6_K)
    full = dequantize(raw, T.Q6_K)
    assert w.shape == full.shape
    np.testing.assert_array_equal(bits(jax.jit(lambda w: w.dequantize())(w)), bits(full))
    ids = jnp.array([[5, 0], [2, 2]])
    np.testing.assert_array_equal(bits(w.rows(ids)), bits(full[np.asarray(ids)]))
