"""The i-quants, TQ1_0/TQ2_0 and MXFP4: codebooks and well-formed blocks against gguf-py
(the oracle: ggml's tables and dequantisers in numpy), and their matmuls through the
dispatcher against a float64 product of gguf-py's dequantised weights.

Random-byte blocks of every type are checked bit for bit in test_quant_dequant.py (it
runs over every layout)."""

from __future__ import annotations

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_cases import iq_blocks

from llamay import kernels
from llamay.gguf.constants import GGMLType
from llamay.quant import AffineQTensor, QTensor, dequantize, dequantize_jnp, iquants

T = GGMLType
NEW_TYPES = [T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M]
NEW_TYPES += [T.IQ4_NL, T.IQ4_XS, T.MXFP4, T.TQ1_0, T.TQ2_0]
GGUF_QUANTIZES = [T.TQ1_0, T.TQ2_0, T.MXFP4]  # types gguf-py can quantise itself
GRIDS = {
    "IQ2XXS_GRID": gguf.quants.IQ2_XXS,
    "IQ2XS_GRID": gguf.quants.IQ2_XS,
    "IQ2S_GRID": gguf.quants.IQ2_S,
    "IQ3XXS_GRID": gguf.quants.IQ3_XXS,
    "IQ3S_GRID": gguf.quants.IQ3_S,
    "IQ1S_GRID": gguf.quants.IQ1_S,
}


def _oracle(raw: np.ndarray, t: GGMLType) -> np.ndarray:
    return np.asarray(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(int(t))), np.float32)


def _bits(x) -> np.ndarray:
    return np.asarray(x, np.float32).view(np.uint32)


@pytest.mark.parametrize("name", list(GRIDS))
def test_grids_equal_ggml_tables(name):
    cls = GRIDS[name]
    cls.init_grid()
    np.testing.assert_array_equal(iquants.grid(name), cls.grid.reshape(cls.grid_shape))


def test_ksigns_equal_ggml_table():
    table = np.frombuffer(gguf.quants.IQ2_XXS.ksigns, np.uint8)
    expect = np.where((table[:, None] >> np.arange(8)) & 1, -1, 1)
    np.testing.assert_array_equal(iquants.ksigns(), expect)


@pytest.mark.parametrize("t", GGUF_QUANTIZES, ids=lambda t: t.name)
def test_quantised_weights_bit_exact(t):
    """Well-formed blocks: real floats quantised by gguf-py (scales as quantisers set them)."""
    rng = np.random.default_rng(int(t))
    w = (rng.standard_normal((16, 512)) * np.exp2(rng.uniform(-8, 4, (16, 1)))).astype(np.float32)
    raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType(int(t)))
    expect = _oracle(raw, t)
    np.testing.assert_array_equal(_bits(dequantize(raw, t)), _bits(expect))
    got = jax.jit(dequantize_jnp, static_argnums=1)(jnp.asarray(raw), t)
    np.testing.assert_array_equal(_bits(got), _bits(expect))


def test_mxfp4_subnormal_scales_bit_exact():
    """e = 0, 1 make the block scale subnormal and e = 254, 255 overflow; XLA CPU flushes
    subnormal products, so MXFP4 values are assembled bit by bit (iquants.mxfp4_values)."""
    e = np.array([0, 1, 2, 3, 127, 253, 254, 255], np.uint8)
    qs = np.tile(np.arange(256, dtype=np.uint8).reshape(16, 16), (len(e), 1))
    raw = np.concatenate([np.repeat(e, 16)[:, None], qs], axis=1).reshape(len(e), -1)
    expect = _oracle(raw, T.MXFP4)
    assert np.any((expect != 0) & (np.abs(expect) < 2.0**-126)) and np.isinf(expect).any()
    np.testing.assert_array_equal(_bits(dequantize(raw, T.MXFP4)), _bits(expect))
    got = jax.jit(dequantize_jnp, static_argnums=1)(jnp.asarray(raw), T.MXFP4)
    np.testing.assert_array_equal(_bits(got), _bits(expect))


@pytest.mark.parametrize("t", NEW_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("form", ["blocks", "affine", "llamacpp"])
def test_matmul_through_dispatcher(t, form):
    """Exact numerics within 1e-3 of float64 over gguf-py's dequantised weight; llamacpp
    numerics (activations rounded to Q8_K / Q8_0) within the rounding of those."""
    rows, cols = 24, 512
    raw = iq_blocks(t, rows, cols, seed=int(t))
    wf = _oracle(raw, t).astype(np.float64)
    assert np.isfinite(wf).all() and np.abs(wf).max() > 0
    x = np.random.default_rng(1).standard_normal((3, cols)).astype(np.float32)
    expect = x.astype(np.float64) @ wf.T
    if form == "affine":
        w = AffineQTensor.from_raw(raw, t)
    else:
        w = QTensor.from_raw(raw, t, "llamacpp" if form == "llamacpp" else "exact")
    got = np.asarray(jax.jit(kernels.matmul)(jnp.asarray(x), w), np.float64)
    scale = np.abs(expect).max()
    tol = 1e-3 if form != "llamacpp" else 3e-2  # int8 activations: ~0.4% per element
    np.testing.assert_allclose(got, expect, atol=tol * scale, rtol=0)
    if form == "llamacpp":
        assert np.abs(got - expect).max() > 0  # the activations were rounded
