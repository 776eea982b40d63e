"""The Pallas quantised matmul of the i-quants, TQ1_0/TQ2_0 and MXFP4 in interpret mode:
the codebook types IQ4_NL, IQ4_XS and MXFP4 (nibble indices into ggml's kvalues / doubled
e2m1, looked up in-kernel, `layout.codebook_lookup`) and the grid/ternary types in the 8-bit
plane (`layout.INT8_TYPES`): the repack round trip bit-equal to gguf-py's dequantisation, the
kernel within f32 summation rounding of the reference (dequantise with llamay.quant, dot)
on both platforms' tilings (decode matvec, multi-block grids, split-K, prefill), and the
Mosaic GPU decode kernel (its interpreter) the same."""

from __future__ import annotations

import gguf
import gguf.quants
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_cases import iq_blocks

from llamay.gguf.constants import GGMLType
from llamay.kernels_pallas.layout import (
    CODEBOOK_TYPES,
    INT8_TYPES,
    KERNEL_TYPES,
    dequantize_packed,
    repack,
)
from llamay.kernels_pallas.qmatmul import Tiling, qmatmul_pallas, qmatmul_reference
from llamay.quant import QTensor

T = GGMLType
CODEBOOK = [T.IQ4_NL, T.IQ4_XS, T.MXFP4]
INT8 = [T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M, T.TQ1_0, T.TQ2_0]
TYPES = CODEBOOK + INT8


def random_weight(t: GGMLType, n: int, k: int, seed: int = 0) -> QTensor:
    return QTensor.from_raw(iq_blocks(t, n, k, seed), t)


def random_x(m: int, k: int, seed: int = 1) -> jnp.ndarray:
    return jnp.asarray(np.random.default_rng(seed).standard_normal((m, k)), jnp.float32)


def assert_f32_close(y, ref, x, w: QTensor) -> None:
    scale = jnp.abs(x) @ jnp.abs(w.dequantize()).T
    err = np.asarray(jnp.abs(y - ref) / (scale + 1e-30))
    assert np.all(np.isfinite(np.asarray(y))) and float(jnp.abs(ref).max()) > 0
    assert err.max() < 1e-6, err.max()


def test_the_new_types_are_kernel_types():
    assert CODEBOOK_TYPES == set(CODEBOOK) and set(INT8_TYPES) == set(INT8)
    assert set(TYPES) <= KERNEL_TYPES


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_repack_round_trip_equals_gguf_py(t):
    w = random_weight(t, 7, 512)
    expected = gguf.quants.dequantize(np.asarray(w.data), gguf.GGMLQuantizationType(int(t)))
    got = np.asarray(dequantize_packed(repack(w)))
    np.testing.assert_array_equal(got.view(np.uint32), expected.astype(np.float32).view(np.uint32))


SHAPES = [
    (1, 200, 512, "tpu", Tiling(tm=8, tn=128, tk=256, chunk=256)),  # matvec, 2 N x 2 K blocks
    (3, 40, 512, "gpu", Tiling(tm=16, tn=32, tk=256, chunk=64, split_k=True)),  # split-K
    (9, 37, 256, "tpu", None),  # default prefill tiling, N not a tile multiple
    (130, 48, 256, "gpu", None),  # default GPU prefill: 3 M-blocks
]


CASES = [(t, s) for t in CODEBOOK for s in SHAPES] + [(t, s) for t in INT8 for s in SHAPES[1:3]]


@pytest.mark.parametrize(
    ("t", "shape"), CASES, ids=[f"{t.name}-{s[3]}-M{s[0]}-N{s[1]}-K{s[2]}" for t, s in CASES]
)
def test_qmatmul_kernel_equals_reference(t, shape):
    m, n, k, platform, tiling = shape
    w, x = random_weight(t, n, k, seed=n), random_x(m, k)
    y = qmatmul_pallas(x, repack(w), platform=platform, interpret=True, tiling=tiling)
    assert y.shape == (m, n)
    assert_f32_close(y, qmatmul_reference(x, w), x, w)


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_mosaic_gpu_decode_kernel_equals_reference(t):
    from jax.experimental.pallas import mosaic_gpu as plgpu

    from llamay.kernels_pallas.qmatmul_mosaic import qmatmul_mosaic

    w, x = random_weight(t, 128, 256, seed=3), random_x(2, 256)
    y = qmatmul_mosaic(x, repack(w), interpret=plgpu.InterpretGPUParams())
    assert_f32_close(y, qmatmul_reference(x, w), x, w)
