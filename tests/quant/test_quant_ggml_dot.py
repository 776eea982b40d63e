"""llama.cpp's 32-element block dots (numerics="llamacpp") as laid out for speed: the two
ways of computing the lane sums agree bit for bit, row chunks change no bit, both are
the dot of the rounded activations with the dequantised weight up to f32 rounding (and
Q8_1's f16 block sums), and a layer scan of them stays off XLA CPU's single-threaded
"small call" path. The bit-for-bit oracle of the kernels themselves is llama.cpp
(tests/model/test_llamacpp_numerics.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from llamay.gguf.constants import GGMLType
from llamay.quant import QTensor, dequantize, qtensor, round_activations
from llamay.quant.quantize import random_blocks

T = GGMLType
BLOCK_TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]


def weight(t: GGMLType, rows: int, cols: int, seed: int = 0) -> tuple[QTensor, np.ndarray]:
    raw = random_blocks(t, rows, cols, seed, scales=(0.001, 0.01))
    return QTensor.from_raw(raw, t, "llamacpp"), dequantize(raw, t).reshape(rows, cols)


@pytest.mark.parametrize("t", BLOCK_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("m", [1, 3, 9])
def test_lane_sums_at_once_or_per_block_agree(t, m, monkeypatch):
    w, wf = weight(t, 24, 96)
    x = jnp.asarray(np.random.default_rng(m).standard_normal((m, 96)), jnp.float32)
    got = {}
    for name, below in (("at once", 10**6), ("per block", 0)):
        monkeypatch.setattr(qtensor, "LANES_AT_ONCE_BELOW", below)
        got[name] = np.asarray(jax.jit(qtensor._q8_block_dot)(x, w))
    np.testing.assert_array_equal(got["at once"], got["per block"])
    xr = np.asarray(round_activations(x, t, qtensor.LLAMACPP_Q8_VARIANT), np.float64)
    want = xr @ wf.astype(np.float64).T
    # f32 sums; Q8_1's block sums s = f16(d·Σq) carry a relative error of 2^-11
    tol = 2e-3 if t in (T.Q4_1, T.Q5_1) else 1e-5
    assert np.abs(got["at once"] - want).max() <= tol * np.abs(want).max()


@pytest.mark.parametrize("t", [T.Q4_1, T.Q8_0, T.Q4_K], ids=lambda t: t.name)
def test_row_chunks_change_no_bit(t, monkeypatch):
    cols = 256
    w, _ = weight(t, 100, cols)
    x = jnp.asarray(np.random.default_rng(1).standard_normal((2, cols)), jnp.float32)
    whole = np.asarray(jax.jit(qtensor.ggml_matmul)(x, w))
    monkeypatch.setattr(qtensor, "CHUNK_ELEMS", 4 * cols * 16)  # chunks of 16 rows, a tail of 4
    chunked = np.asarray(jax.jit(qtensor.ggml_matmul)(x, w))
    np.testing.assert_array_equal(chunked, whole)


def test_layer_scan_of_one_row_matmuls_is_not_one_kernel():
    """Without `keep_on_thunks` XLA CPU compiled this scan (no dot left in it once its
    one-row dots became multiply-reduces) into one single-threaded "small call"."""
    layers, rows, cols = 4, 128, 128
    raw = np.stack([random_blocks(T.Q4_1, rows, cols, s, (0.001, 0.01)) for s in range(layers)])
    w = QTensor.from_raw(raw, T.Q4_1, "llamacpp")

    def forward(x, w):
        def layer(h, i):
            return qtensor.qmatmul(h, w.layer(i)) + h, None

        return jax.lax.scan(layer, x, jnp.arange(layers))[0]

    x = jnp.ones((1, cols), jnp.float32)
    hlo = jax.jit(forward).lower(x, w).compile().as_text()
    entry = hlo[hlo.index("\nENTRY ") :]
    assert " while(" in entry and "xla_cpu_small_call" not in entry
