"""The native llamacpp-numerics SwiGLU, RMS norm and RoPE
(`llamay.kernels_cpu.ggml_elementwise`) against their oracle, the XLA emulations
`llamay.arch.ggml_ops.swiglu_reference` / `rms_norm_reference` / `apply_rope_reference`
(ggml's vector expf, its double sums, GCC's FMA in rotate_pairs; they hold the llama.cpp
goldens), bit for bit, over shapes of real models (SmolLM2's 1536-wide FFN and 576-wide
rows, per-head norms of 64/128/256, rows 1..9, partial rotary dims, both rope kinds)
and inputs from subnormal to overflowing exp; the scalar build gives the same bits;
`ggml_ops` takes the kernels on CPU and the emulation under LLAMAY_CPU_KERNELS=xla."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from llamay.arch import ggml_ops
from llamay.kernels_cpu import build
from llamay.kernels_cpu.ggml_elementwise import rms_norm_native, rope_native, swiglu_native


def _wide(rng, shape, scale):
    """Normal values times `scale`, with a sprinkle of extremes: tiny, huge, signed zeros."""
    x = rng.standard_normal(shape) * scale
    flat = x.reshape(-1)
    idx = rng.choice(flat.size, size=min(flat.size, 64), replace=False)
    extremes = np.array(
        [0.0, -0.0, 1e-30, -1e-30, 1e-42, 90.0, -90.0, 200.0, -200.0, 88.7, -87.4, 1e-7]
    )
    flat[idx] = extremes[rng.integers(0, extremes.size, idx.size)]
    return jnp.asarray(x, jnp.float32)


SWIGLU = [((1, 1536), 3.0), ((9, 1536), 3.0), ((3, 5, 100), 20.0), ((2, 4096), 0.5), ((7,), 1.0)]


@pytest.mark.parametrize("case", range(len(SWIGLU)))
def test_swiglu_equals_the_emulation_bit_for_bit(case):
    shape, scale = SWIGLU[case]
    rng = np.random.default_rng(case)
    g, u = _wide(rng, shape, scale), _wide(rng, shape, 2.0)
    want = np.asarray(jax.jit(ggml_ops.swiglu_reference)(g, u))
    got = np.asarray(jax.jit(swiglu_native)(g, u))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.asarray(swiglu_native(g, u, variant="scalar")), want)


# x shape, weight?, eps, scale
NORMS = [
    ((1, 1, 576), True, 1e-5, 1.0),  # SmolLM2's rows
    ((9, 576), True, 1e-5, 30.0),
    ((2, 1, 9, 64), True, 1e-6, 1.0),  # per-head q/k norms
    ((3, 4, 128), False, 1e-6, 1e-3),
    ((1, 1, 4, 256), True, 1e-6, 5.0),  # Gemma 3's heads
    ((5, 640), True, 1e-6, 1.0),  # Gemma 3 270M's rows
    ((2, 100), False, 1e-5, 1.0),  # not a power of two, not a multiple of 16
]


@pytest.mark.parametrize("case", range(len(NORMS)))
def test_rms_norm_equals_the_emulation_bit_for_bit(case):
    shape, has_w, eps, scale = NORMS[case]
    rng = np.random.default_rng(50 + case)
    x = jnp.asarray(rng.standard_normal(shape) * scale, jnp.float32)
    w = jnp.asarray(rng.standard_normal(shape[-1]) + 1.0, jnp.float32) if has_w else None
    want = np.asarray(jax.jit(lambda x, w: ggml_ops.rms_norm_reference(x, w, eps))(x, w))
    got = np.asarray(jax.jit(lambda x, w: rms_norm_native(x, w, eps))(x, w))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.asarray(rms_norm_native(x, w, eps, variant="scalar")), want)


# x shape [B, T, H, D], rotated dims, kind, positions up to
ROPES = [
    ((1, 1, 9, 64), 64, "norm", 256),  # SmolLM2 decoding
    ((9, 1, 3, 64), 64, "norm", 4096),
    ((2, 16, 4, 256), 256, "neox", 32768),  # Gemma 3
    ((3, 5, 8, 128), 64, "neox", 1000),  # partial rotary dims
    ((1, 7, 2, 80), 32, "norm", 100),
]


@pytest.mark.parametrize("case", range(len(ROPES)))
def test_rope_equals_the_emulation_bit_for_bit(case):
    shape, n_rot, kind, n_pos = ROPES[case]
    rng = np.random.default_rng(80 + case)
    B, T = shape[:2]
    x = _wide(rng, shape, 3.0)
    pos = rng.integers(0, n_pos, (B, T))
    theta = pos[..., None] * (10000.0 ** (-np.arange(n_rot // 2) * 2 / n_rot))
    cos = jnp.asarray(np.cos(theta), jnp.float32)
    sin = jnp.asarray(np.sin(theta), jnp.float32)
    want = np.asarray(jax.jit(ggml_ops.apply_rope_reference, static_argnums=3)(x, cos, sin, kind))
    got = np.asarray(jax.jit(rope_native, static_argnums=3)(x, cos, sin, kind))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(
        np.asarray(rope_native(x, cos, sin, kind, variant="scalar")), want
    )


def test_calls_they_do_not_take_return_none():
    g = jnp.ones((4, 8), jnp.float32)
    assert swiglu_native(g, jnp.ones((4, 9), jnp.float32)) is None
    assert swiglu_native(g.astype(jnp.float16), g.astype(jnp.float16)) is None
    assert rms_norm_native(g, jnp.ones((9,), jnp.float32), 1e-5) is None
    assert rms_norm_native(g, jnp.ones((4, 8), jnp.float32), 1e-5) is None
    x, cs = jnp.ones((1, 2, 3, 8), jnp.float32), jnp.ones((1, 2, 4), jnp.float32)
    assert rope_native(x, cs, cs, "yarn") is None
    assert rope_native(x, cs[:, :1], cs[:, :1], "norm") is None
    assert (
        rope_native(x, jnp.ones((1, 2, 5), jnp.float32), jnp.ones((1, 2, 5), jnp.float32), "norm")
        is None
    )


def test_ggml_ops_take_the_kernels_on_cpu_and_the_emulation_otherwise(monkeypatch):
    monkeypatch.delenv("LLAMAY_BACKEND", raising=False)
    monkeypatch.delenv(build.ENV, raising=False)
    rng = np.random.default_rng(9)
    g, u = _wide(rng, (2, 1536), 3.0), _wide(rng, (2, 1536), 1.0)
    w = jnp.asarray(rng.standard_normal(1536), jnp.float32)

    def f(g, u, w):
        return ggml_ops.rms_norm(ggml_ops.swiglu(g, u), w, 1e-5)

    def text():
        return jax.jit(lambda *a: f(*a)).lower(g, u, w).as_text()

    want = np.asarray(jax.jit(lambda g, u, w: ggml_ops.rms_norm_reference(
        ggml_ops.swiglu_reference(g, u), w, 1e-5))(g, u, w))  # fmt: skip
    assert "LlamayGgmlSwiglu" in text() and "LlamayGgmlRmsNorm" in text()
    np.testing.assert_array_equal(np.asarray(jax.jit(f)(g, u, w)), want)
    monkeypatch.setenv(build.ENV, "xla")
    assert "LlamayGgml" not in text()
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda *a: f(*a))(g, u, w)), want)
