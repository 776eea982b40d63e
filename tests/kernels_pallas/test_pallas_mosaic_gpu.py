"""The Mosaic GPU quantised matmul (`qmatmul_mosaic`) in Mosaic GPU interpret mode (TMA
copies, barriers and the pipeline simulated on CPU) against the jnp reference, for every
kernel type over a table of shapes and tilings; and the dispatch rule that picks it."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu
from test_pallas_qmatmul import TYPES, assert_f32_close, random_weight, random_x

from llamay import kernels
from llamay.gguf.constants import GGMLType
from llamay.kernels_pallas import repack
from llamay.kernels_pallas.layout import FORMATS
from llamay.kernels_pallas.qmatmul import qmatmul_reference
from llamay.kernels_pallas.qmatmul_mosaic import (
    SMEM_BUDGET,
    MosaicTiling,
    mosaic_tiling_for,
    qmatmul_mosaic,
    step_bytes,
)

T = GGMLType
INTERPRET = plgpu.InterpretGPUParams()

# (M, N, K, tiling): the default decode tiling of one row, split K, with N = 200 (no
# multiple of 16: the planes padded to 208, the 256-column tile reading zeros past that);
# several rows over two K ranges of two pipeline steps each.
SHAPES = [
    (1, 200, 512, None),
    (3, 128, 512, MosaicTiling(tm=3, tn=128, chunk=128, splits=2)),
]
# (type, shape): V = 2 (256-column tiles), edge blocks past M and N (SmolLM2's 192), Q6_K's
# 16-element scale groups in 32-element chunks
TILING_CASES = [
    (T.Q4_K, (2, 512, 256, MosaicTiling(tm=2, tn=256, chunk=64, splits=2))),
    (T.Q5_0, (10, 192, 256, MosaicTiling(tm=8, tn=128, chunk=256, splits=1))),
    (T.Q6_K, (1, 128, 256, MosaicTiling(tm=1, tn=128, chunk=32, splits=4))),
]


def shape_id(s):
    m, n, k, til = s
    return f"M{m}-N{n}-K{k}" + ("" if til is None else f"-tn{til.tn}c{til.chunk}s{til.splits}")


def run_case(t, shape, seed=0):
    m, n, k, tiling = shape
    w, x = random_weight(t, n, k, seed), random_x(m, k, seed + 1)
    y = qmatmul_mosaic(x, repack(w), interpret=INTERPRET, tiling=tiling)
    assert y.shape == (m, n)
    assert_f32_close(y, qmatmul_reference(x, w), x, w)


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_mosaic_qmatmul_equals_reference(t, shape):
    run_case(t, shape)


@pytest.mark.parametrize(
    ("t", "shape"), TILING_CASES, ids=[f"{t.name}-{shape_id(s)}" for t, s in TILING_CASES]
)
def test_mosaic_tilings_equal_reference(t, shape):
    run_case(t, shape, seed=2)


def test_mosaic_leading_dims_and_vmapped_experts():
    """x [B, T, K]; and the kernel under vmap over stacked expert weights (MoE)."""
    w = random_weight(T.Q4_0, 128, 256, seed=5)
    x = random_x(2, 256, seed=6).reshape(2, 1, 256)
    y = qmatmul_mosaic(x, repack(w), interpret=INTERPRET)
    assert y.shape == (2, 1, 128)
    assert_f32_close(y.reshape(2, -1), qmatmul_reference(x, w).reshape(2, -1), x[:, 0], w)
    experts = [random_weight(T.Q4_K, 128, 256, seed=s) for s in (7, 8)]
    packed = jax.tree_util.tree_map(lambda *a: np.stack(a), *map(repack, experts))
    ys = jax.vmap(lambda x, e: qmatmul_mosaic(x, e, interpret=INTERPRET))(x, packed)
    for i, e in enumerate(experts):
        assert_f32_close(ys[i], qmatmul_reference(x[i], e), x[i], e)


def test_mosaic_tiling_fits_decode_shapes():
    q41, q8, q6k = FORMATS[T.Q4_1], FORMATS[T.Q8_0], FORMATS[T.Q6_K]
    # SmolLM2's 576 columns: 5 tiles of 128 (the last one an edge), split K to fill the GPU
    assert mosaic_tiling_for(1, 576, 576, q41) == MosaicTiling(1, 128, 192, 3, stages=4)
    assert mosaic_tiling_for(1, 4096, 4096, q41) == MosaicTiling(1, 256, 128, 16, stages=3)
    # the vocabulary head has CTAs enough without split K
    assert mosaic_tiling_for(8, 49152, 576, q8).splits == 1
    # every step of every type fits twice in the SMEM budget, in flight as many as fit
    for fmt in (q41, q8, q6k):
        for m, n, k in [(8, 4096, 4096), (1, 262144, 640), (8, 1536, 576)]:
            t = mosaic_tiling_for(m, n, k, fmt)
            assert 2 <= t.stages and t.stages * step_bytes(fmt, t.tm, t.tn, t.chunk) <= SMEM_BUDGET
    with pytest.raises(ValueError, match="chunk·splits divide K"):
        qmatmul_mosaic(random_x(1, 256), repack(random_weight(T.Q8_0, 128, 256)),
                       interpret=INTERPRET, tiling=MosaicTiling(1, 128, 96, 1))  # fmt: skip


class FakeGPU:
    def __init__(self, capability):
        self.compute_capability = capability


@pytest.mark.parametrize(
    ("env", "capability", "want"),
    [
        ("auto", "9.0", "mosaic"),  # H100/H200
        ("auto", "10.0", "mosaic"),  # Blackwell
        ("auto", "8.0", "triton"),  # A100: no TMA
        ("auto", "gfx942", "triton"),  # ROCm
        ("triton", "9.0", "triton"),
        ("mosaic", "8.9", "mosaic"),
    ],
)
def test_gpu_kernels_rule(monkeypatch, env, capability, want):
    monkeypatch.setenv(kernels.GPU_KERNELS_ENV, env)
    assert kernels.gpu_kernels(FakeGPU(capability)) == want


def test_gpu_kernels_refuses_unknown(monkeypatch):
    monkeypatch.setenv(kernels.GPU_KERNELS_ENV, "cutlass")
    with pytest.raises(ValueError, match="LLAMAY_GPU_KERNELS"):
        kernels.gpu_kernels(FakeGPU("9.0"))


@pytest.mark.parametrize(("rows", "kernel"), [(1, "mosaic_gpu"), (9, "pallas_call")])
def test_dispatch_sends_decode_to_mosaic(monkeypatch, rows, kernel):
    """`pallas-interpret-mosaic-gpu`: decode rows take the Mosaic GPU kernel, prefill rows
    the Triton one; both equal the reference."""
    monkeypatch.setenv(kernels.ENV, "pallas-interpret-mosaic-gpu")
    w, x = random_weight(T.Q4_1, 128, 256, seed=9), random_x(rows, 256, seed=10)
    be = kernels.backend()
    assert be.mosaic and be.platform == "gpu" and be.interpret
    # a fresh function: jax caches a function's jaxpr, and the backend the environment
    # chooses is not part of that cache's key
    jaxpr = str(jax.make_jaxpr(lambda x, w: kernels.matmul(x, w))(x, w))
    assert ("qmatmul_mosaic_q4_1" in jaxpr) == (kernel == "mosaic_gpu")
    assert_f32_close(kernels.matmul(x, w), qmatmul_reference(x, w), x, w)
