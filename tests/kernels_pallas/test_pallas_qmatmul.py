"""Pallas quantised matmul (exact and W4A8) in interpret mode against the references:
the repack round trip against gguf-py, the kernel against llamay.quant's dequantise-and-dot
to f32 rounding, W4A8 against the exact product within its derived error bound."""

from __future__ import annotations

import gguf
import gguf.quants
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from llamay.errors import UnsupportedTensorTypeError
from llamay.gguf.constants import GGMLType
from llamay.kernels_pallas.layout import (
    CODEBOOK_TYPES,
    FORMATS,
    INT8_TYPES,
    dequantize_packed,
    repack,
)
from llamay.kernels_pallas.qmatmul import Tiling, qmatmul_pallas, qmatmul_reference, tiling_for
from llamay.kernels_pallas.w4a8 import error_bound, w4a8_pallas, w4a8_reference
from llamay.quant import QTensor
from llamay.quant.quantize import random_blocks

T = GGMLType
# Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4_K Q5_K Q6_K (the i-quants, TQ*, MXFP4: test_pallas_qmatmul_iquants.py)
TYPES = [t for t in FORMATS if t not in CODEBOOK_TYPES and t not in INT8_TYPES]


def random_weight(t: GGMLType, n: int, k: int, seed: int = 0) -> QTensor:
    """Random blocks of type t (every quant bit pattern) with finite f16 scales."""
    return QTensor.from_raw(random_blocks(t, n, k, seed), t)


def random_x(m: int, k: int, seed: int = 1) -> jnp.ndarray:
    return jnp.asarray(np.random.default_rng(seed).standard_normal((m, k)), jnp.float32)


def assert_f32_close(y, ref, x, w: QTensor) -> None:
    """|y - ref| within f32 summation rounding: 1e-6 relative to Σ|x|·|w| (K <= 1024)."""
    scale = jnp.abs(x) @ jnp.abs(w.dequantize()).T
    err = np.asarray(jnp.abs(y - ref) / (scale + 1e-30))
    assert np.all(np.isfinite(np.asarray(y)))
    assert err.max() < 1e-6, err.max()


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_repack_round_trip_equals_gguf_py(t):
    w = random_weight(t, 7, 512)
    expected = gguf.quants.dequantize(np.asarray(w.data), gguf.GGMLQuantizationType(int(t)))
    got = np.asarray(dequantize_packed(repack(w)))
    np.testing.assert_array_equal(got, expected)


def test_repack_keeps_leading_dims():
    w = random_weight(T.Q5_K, 6, 256)
    stacked = QTensor(w.data.reshape(2, 3, -1), w.ggml_type, w.cols)
    p = repack(stacked)
    assert p.shape == (2, 3, 256)
    one = repack(QTensor(w.data[3:], w.ggml_type, w.cols))
    for name in ("q", "high", "scale", "offset"):
        np.testing.assert_array_equal(getattr(p, name)[1], getattr(one, name))


def test_repack_refuses_types_without_kernel():
    w = random_weight(T.Q3_K, 2, 256)
    with pytest.raises(UnsupportedTensorTypeError, match="Q3_K"):
        repack(w)


# (M, N, K, platform, tiling): decode (M <= 8) and prefill (M > tile) tilings of both
# platforms, multi-block grids on every axis, odd row counts (partial N blocks), M = 1.
SHAPES = [
    (1, 200, 512, "tpu", Tiling(tm=8, tn=128, tk=256, chunk=256)),  # 2 N-blocks, 2 K-steps
    (3, 40, 512, "gpu", Tiling(tm=16, tn=32, tk=256, chunk=64, split_k=True)),  # 2 splits x 4
]
# (type, shape): the default tilings and a multi-tile prefill, each on one K-quant
TILING_CASES = [
    (T.Q4_K, (1, 96, 256, "tpu", None)),  # the default decode tiling: a matvec block
    (T.Q6_K, (130, 72, 512, "tpu", Tiling(tm=64, tn=32, tk=256, chunk=128))),  # M > tile
    (T.Q6_K, (130, 48, 256, "gpu", None)),  # default GPU prefill tiling: 3 M-blocks
    (T.Q4_K, (1, 64, 1024, "gpu", None)),  # default GPU decode tiling: 4 K ranges, matvec
]


def shape_id(s):
    m, n, k, plat, til = s
    return f"{plat}-M{m}-N{n}-K{k}" + ("" if til is None else f"-tm{til.tm}tn{til.tn}tk{til.tk}")


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_qmatmul_kernel_equals_reference(t, shape):
    m, n, k, platform, tiling = shape
    w, x = random_weight(t, n, k), random_x(m, k)
    y = qmatmul_pallas(x, repack(w), platform=platform, interpret=True, tiling=tiling)
    assert y.shape == (m, n)
    assert_f32_close(y, qmatmul_reference(x, w), x, w)


@pytest.mark.parametrize(
    ("t", "shape"), TILING_CASES, ids=[f"{t.name}-{shape_id(s)}" for t, s in TILING_CASES]
)
def test_qmatmul_tilings_equal_reference(t, shape):
    m, n, k, platform, tiling = shape
    w, x = random_weight(t, n, k, seed=3), random_x(m, k, seed=4)
    y = qmatmul_pallas(x, repack(w), platform=platform, interpret=True, tiling=tiling)
    assert_f32_close(y, qmatmul_reference(x, w), x, w)


def test_qmatmul_leading_dims_and_tpu_interpreter():
    """x [B, T, K]; run by the TPU interpreter (Mosaic's memory model, not just HLO)."""
    w = random_weight(T.Q4_0, 136, 512, seed=5)
    x = random_x(6, 512, seed=6).reshape(2, 3, 512)
    tiling = Tiling(tm=8, tn=128, tk=256, chunk=256)
    y = qmatmul_pallas(x, repack(w), interpret=pltpu.InterpretParams(), tiling=tiling)
    assert y.shape == (2, 3, 136)
    assert_f32_close(y.reshape(6, -1), qmatmul_reference(x, w).reshape(6, -1), x.reshape(6, -1), w)


def test_tilings_fit_the_shapes():
    assert tiling_for(1, 576, 576, "tpu") == Tiling(tm=1, tn=512, tk=576, chunk=576)
    assert tiling_for(256, 1536, 2048, "tpu") == Tiling(tm=256, tn=256, tk=512, chunk=512)
    gpu = tiling_for(3, 49152, 640, "gpu")
    assert (gpu.tm, gpu.tk) == (16, 640) and 640 % gpu.chunk == 0
    # one row of a 4096² matrix: 64 column blocks, split-K to fill the GPU
    assert tiling_for(1, 4096, 4096, "gpu") == Tiling(1, 64, 256, 256, split_k=True)
    with pytest.raises(ValueError, match="tk must divide K"):
        qmatmul_pallas(
            random_x(1, 256),
            repack(random_weight(T.Q8_0, 8, 256)),
            interpret=True,
            tiling=Tiling(8, 8, 96, 32),
        )


W4A8_TPU = (1, 200, 512, "tpu", Tiling(tm=8, tn=128, tk=256, chunk=256))
W4A8_CHUNKED = (20, 40, 512, "tpu", Tiling(tm=16, tn=32, tk=512, chunk=64))  # K in 8 chunks
# each type under one of the two tilings (both tilings are covered by the exact kernel)
# (the reference models' types: Q8_0 Q4_0 Q4_1 Q5_0 Q4_K Q6_K)
MODEL_TYPES = [t for t in TYPES if t not in (T.Q5_1, T.Q5_K)]
W4A8_CASES = [(t, W4A8_TPU if i % 2 else W4A8_CHUNKED) for i, t in enumerate(MODEL_TYPES)]


@pytest.mark.parametrize(
    ("t", "shape"), W4A8_CASES, ids=[f"{t.name}-chunk{s[4].chunk}" for t, s in W4A8_CASES]
)
def test_w4a8_within_its_quantisation_error(t, shape):
    m, n, k, platform, tiling = shape
    w, x = random_weight(t, n, k, seed=7), random_x(m, k, seed=8)
    p = repack(w)
    y = w4a8_pallas(x, p, platform=platform, interpret=True, tiling=tiling)
    # the same numbers as the quantised-activation reference, to f32 rounding
    assert_f32_close(y, w4a8_reference(x, p), x, w)
    # and the exact product within the derived bound (and not trivially: the error is real)
    ratio = np.asarray(jnp.abs(y - qmatmul_reference(x, w)) / error_bound(x, p))
    assert ratio.max() <= 1.0, ratio.max()
    assert ratio.max() > 1e-3


def test_w4a8_refuses_gpu():
    w = repack(random_weight(T.Q4_0, 8, 256))
    with pytest.raises(ValueError, match="TPU kernel"):
        w4a8_pallas(random_x(1, 256), w, platform="gpu", interpret=True)
