"""The native exact matmul of the i-quants, TQ1_0/TQ2_0 and MXFP4 (src/blocks.h's
iq_parts over the grids build.py generates from llamay.quant.iq_tables) against the f32
dot over the jnp dequantisation (itself bit-equal to gguf-py: tests/quant/), within 1e-5
of the sum of |products|: types x shapes (K one block and many, N = 37 not a multiple of
the 4-row tile), M = 1..9 (the decode path) and 64 (the tiled path); the portable scalar
build against the SIMD one; the tiny qwen3 in each type (tests/fixtures/quant-types) bound
in the "native" form, every matrix of the type taken by the kernel, its exact logits within
1e-3 of a float64 forward over gguf-py's dequantised weights."""

from __future__ import annotations

import importlib.util
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_cases import acts, assert_close_sums, exact_reference, iq_blocks

from llamay.gguf.constants import GGMLType
from llamay.kernels_cpu import build
from llamay.kernels_cpu.qmatmul import EXACT_TYPES, IQ_TYPES, applies, qmatmul_native
from llamay.quant import LAYOUTS, QTensor

T = GGMLType
MS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 64]
HERE = pathlib.Path(__file__).resolve().parent


pytestmark = pytest.mark.usefixtures("native_kernels")  # conftest.py


def shapes(t: GGMLType) -> list[tuple[int, int]]:
    be = LAYOUTS[t].block_elems
    return [(37, be), (40, be * 5), (37, be * 7)]


def test_every_new_type_is_an_exact_kernel_type():
    assert set(IQ_TYPES) <= EXACT_TYPES and len(set(IQ_TYPES)) == 12


def test_generated_tables_are_the_python_ones():
    """iq_tables.h holds llamay.quant's grids (checked against gguf-py in tests/quant)."""
    from llamay.quant import iquants

    text = build.generated_headers()["iq_tables.h"]
    g = iquants.grid("IQ3S_GRID")
    assert "IQ3S_GRID[512][4]" in text and "IQ1S_GRID[2048][8]" in text
    assert "{" + ", ".join(map(str, g[511])) + "}" in text


@pytest.mark.parametrize("m", MS)
@pytest.mark.parametrize("t", IQ_TYPES, ids=lambda t: t.name)
def test_exact_matches_the_f32_dot_of_the_dequantised_weight(t, m):
    for n, k in shapes(t):
        w = QTensor.from_raw(iq_blocks(t, n, k, n + k), t, "exact")
        x = acts(m, k, m)
        got = np.asarray(jax.jit(lambda x, w: qmatmul_native(x, w, "exact"))(x, w))
        want = np.asarray(jax.jit(exact_reference)(x, w), np.float64)
        assert np.abs(want).max() > 0
        assert_close_sums(got, want, x, w, (t.name, n, k))


@pytest.mark.parametrize("t", IQ_TYPES, ids=lambda t: t.name)
def test_scalar_build_equals_the_simd_build(t):
    for n, k in shapes(t)[:2]:
        for m in (1, 9):
            w, x = QTensor.from_raw(iq_blocks(t, n, k, 3), t, "exact"), acts(m, k, m)
            simd = np.asarray(qmatmul_native(x, w, "exact"))
            scalar = np.asarray(qmatmul_native(x, w, "exact", variant="scalar"))
            assert_close_sums(scalar, simd, x, w, (t.name, n, k, m))


def _load(name: str, path: pathlib.Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("t", IQ_TYPES, ids=lambda t: t.name)
def test_tiny_qwen3_of_each_type_runs_natively_near_float64(t, tmp_path):
    """The quant-types fixture's random-<T> model (every attention/FFN matrix of type T),
    bound as "native": the kernel takes each of those matrices, and the exact logits of
    the fixture's tokens stay within 1e-3 of the float64 forward of tests/quant."""
    from fixture_data import tiny_model_file

    import llamay
    from llamay import kernels
    from llamay.quant import MixedQTensor

    fixtures = HERE.parent / "fixtures" / "quant-types"
    maker = _load("make_quant_types", fixtures / "make_quant_types.py")
    oracle = _load("quant_types_oracle", HERE.parent / "quant" / "test_quant_types_llamacpp.py")
    path = tmp_path / f"qwen3-random-{t.name}.gguf"
    maker.random_model(str(tiny_model_file("qwen3")), str(path), t.name)
    assert kernels.weight_form("exact") == "native"
    m = llamay.load(path)
    tokens = np.load(fixtures / f"qwen3-random-{t.name}.llamacpp.npz")["tokens"].tolist()
    typed = [w for w in m.weights["layers"].values() if isinstance(w, MixedQTensor)]
    stacks = [s for w in typed for s in w.stacks if s.ggml_type == t]
    assert len(stacks) == 7, "the 7 attention/FFN matrices of the type, as native stacks"
    assert all(applies(jnp.zeros((1, s.cols)), s, "exact", jnp.int32(0)) for s in stacks)
    got = m.logits(tokens)
    expect = oracle._qwen3_float64_logits(path, tokens)
    np.testing.assert_allclose(got, expect, atol=1e-3, rtol=0)
