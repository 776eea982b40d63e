"""Every weight form answers the matrix protocol (`llamay.quant.matrix`) with the same
values, held to gguf-py's dequantisation: shape and row count, one layer's slice, the
row lookup, the whole dequantised matrix, and the product through the dispatcher."""

from __future__ import annotations

import gguf.quants
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from llamay import kernels
from llamay.gguf.constants import GGMLType
from llamay.kernels_pallas import repack
from llamay.quant import AffineQTensor, MixedQTensor, QTensor
from llamay.quant.quantize import random_blocks

T = GGMLType
L, ROWS, COLS = 3, 24, 512


def forms(t: GGMLType):
    """The same stacked [L, ROWS, COLS] weight in every form, and gguf-py's values."""
    raw = np.stack([random_blocks(t, ROWS, COLS, seed=s) for s in range(L)])
    want = gguf.quants.dequantize(raw.reshape(L * ROWS, -1), gguf.GGMLQuantizationType(int(t)))
    blocks = QTensor.from_raw(raw, t)
    stacks = (QTensor.from_raw(raw[:1], t), QTensor.from_raw(raw[1:], t))
    mixed = MixedQTensor(stacks, jnp.array([0, 1, 1], jnp.int32), jnp.array([0, 0, 1], jnp.int32))
    built = {
        "QTensor": blocks,
        "AffineQTensor": AffineQTensor.from_raw(raw, t),
        "PackedWeight": repack(blocks),
        "MixedQTensor": mixed,
    }
    return built, want.reshape(L, ROWS, COLS).astype(np.float32)


@pytest.mark.parametrize("t", [T.Q4_0, T.Q5_1, T.Q4_K, T.Q6_K])
def test_forms_agree_with_gguf_py(t, monkeypatch):
    monkeypatch.setenv(kernels.ENV, "reference")
    built, want = forms(t)
    ids = jnp.array([[3, 0], [ROWS - 1, 7]], jnp.int32)
    x = np.random.default_rng(0).standard_normal((2, COLS)).astype(np.float32)
    for name, w in built.items():
        assert w.shape == (L, ROWS, COLS), name
        assert (w.n_rows, w.cols) == (ROWS, COLS), name
        one = w.layer(jnp.int32(2))
        assert (one.n_rows, one.cols, one.shape[-2:]) == (ROWS, COLS, (ROWS, COLS)), name
        np.testing.assert_array_equal(one.dequantize(), want[2], err_msg=name)
        np.testing.assert_array_equal(one.rows(ids), want[2][np.asarray(ids)], err_msg=name)
        y = np.asarray(kernels.matmul(jnp.asarray(x), one))
        tol = 1e-5 * np.abs(x).sum() * np.abs(want[2]).max()
        np.testing.assert_allclose(y, x @ want[2].T, rtol=0, atol=tol, err_msg=name)


def test_scan_parts_rebuild_each_layer():
    """`scan_parts`: what the layer scan slices, rebuilt per layer, is that layer."""
    built, want = forms(T.Q4_K)
    for name, w in built.items():
        sliced, rebuild = w.scan_parts()

        def body(carry, part, rebuild=rebuild):
            return carry, rebuild(part).dequantize()

        _, per_layer = jax.lax.scan(body, 0, sliced)
        np.testing.assert_array_equal(per_layer, want, err_msg=name)
