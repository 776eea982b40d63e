"""Shared layers against direct numpy transcriptions of what llama.cpp computes."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

from llamay.arch import REGISTRY, Rope, get_architecture
from llamay.arch.layers import layer_norm, moe, rope_angles
from llamay.errors import UnknownArchitectureError
from llamay.gguf.constants import GGMLType
from llamay.kernels import attention
from llamay.quant import QTensor

FAMILIES = ("llama", "qwen2", "qwen3", "qwen3moe", "phi3", "gemma2", "gemma3", "olmo2")


def test_every_family_is_registered_and_unknown_ones_list_them():
    assert set(FAMILIES) | {"starcoder2", "bert", "mistral"} <= set(REGISTRY)
    with pytest.raises(UnknownArchitectureError, match="gemma3.*llama.*starcoder2"):
        get_architecture("mamba")


def f32_qtensor(w: np.ndarray) -> QTensor:
    w = np.ascontiguousarray(w, np.float32)
    return QTensor(jnp.asarray(w.view(np.uint8)), GGMLType.F32, w.shape[-1])


def ggml_rope_yarn(pos, n_rot, base, freq_scale, orig_ctx, beta_fast=32.0, beta_slow=1.0):
    """ggml's rope cache (ggml_rope_cache_init + rope_yarn), scalar loop, float64."""

    def corr_dim(n_rotations):
        return n_rot * math.log(orig_ctx / (n_rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(0, math.floor(corr_dim(beta_fast)))
    high = min(n_rot - 1, math.ceil(corr_dim(beta_slow)))
    ext_factor = 1.0 if freq_scale != 1.0 else 0.0
    cos, sin = [], []
    theta_extrap = float(pos)
    for i0 in range(0, n_rot, 2):
        theta_interp = freq_scale * theta_extrap
        theta, mscale = theta_interp, 1.0
        if ext_factor != 0.0:
            y = (i0 // 2 - low) / max(0.001, high - low)
            ramp_mix = (1 - min(1, max(0, y))) * ext_factor
            theta = theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix
            mscale *= 1.0 + 0.1 * math.log(1.0 / freq_scale)
        cos.append(math.cos(theta) * mscale)
        sin.append(math.sin(theta) * mscale)
        theta_extrap *= base ** (-2.0 / n_rot)
    return np.array(cos), np.array(sin)


@pytest.mark.parametrize("scaling, factor", [("none", 1.0), ("linear", 4.0), ("yarn", 4.0)])
def test_rope_scaling_matches_ggml(scaling, factor):
    rope = Rope(kind="neox", base=10000.0, n_rot=64, scaling=scaling, factor=factor, orig_ctx=4096)
    pos = np.array([0, 1, 7, 300, 5000])
    cos, sin = rope_angles(jnp.asarray(pos), rope)
    for r, p in enumerate(pos):
        want_c, want_s = ggml_rope_yarn(p, 64, 10000.0, 1.0 / factor, 4096)
        if scaling == "linear":  # ggml: no ramp, no magnitude correction
            want_c, want_s = ggml_rope_yarn(p / factor, 64, 10000.0, 1.0, 4096)
        np.testing.assert_allclose(cos[r], want_c, atol=2e-4)
        np.testing.assert_allclose(sin[r], want_s, atol=2e-4)


def test_rope_freq_factors_divide_the_frequencies():
    rope = Rope(kind="norm", base=500000.0, n_rot=8)
    ff = jnp.asarray([1.0, 2.0, 8.0, 32.0])
    cos, _ = rope_angles(jnp.asarray([100]), rope, ff)
    inv = 500000.0 ** (-np.arange(0, 8, 2) / 8) / np.array([1, 2, 8, 32])
    np.testing.assert_allclose(cos[0], np.cos(100 * inv), atol=1e-5)


def test_layer_norm():
    rng = np.random.default_rng(0)
    x, w, b = rng.normal(size=(3, 16)), rng.normal(size=16), rng.normal(size=16)
    want = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * w + b
    got = layer_norm(jnp.asarray(x), jnp.asarray(w), jnp.asarray(b), 1e-5)
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_non_causal_attention_ignores_padding_slots():
    """Encoder rows see slots up to their last real position; padding queries sit at S."""
    rng = np.random.default_rng(1)
    B, S, H, D = 1, 8, 2, 4
    q = jnp.asarray(rng.normal(size=(B, S, H, D)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(B, S, H, D)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(B, S, H, D)), jnp.float32)
    pos = jnp.asarray([[0, 1, 2, 3, 4, S, S, S]])
    got = attention(q, k, v, pos, scale=0.5, causal=False)
    s = np.einsum("thd,shd->hts", np.asarray(q[0, :5]), np.asarray(k[0, :5])) * 0.5
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(got[0, :5], np.einsum("hts,shd->thd", p, v[0, :5]), atol=1e-5)


@pytest.mark.parametrize("n_tokens", [1, 5])
def test_moe_gathered_and_dense_agree_with_numpy(n_tokens):
    """Top-2 of 4 experts with renormalised weights; decode gathers, prefill runs dense."""
    rng = np.random.default_rng(2)
    E, d, f = 4, 32, 64
    x = rng.normal(size=(1, n_tokens, d))
    router = rng.normal(size=(E, d))
    gate, up, down = (
        rng.normal(size=(E, f, d)),
        rng.normal(size=(E, f, d)),
        rng.normal(size=(E, d, f)),
    )
    ws = [f32_qtensor(a) for a in (router, gate, up, down)]
    got = moe(jnp.asarray(x, jnp.float32), *ws, n_used=2)
    other = 0 if n_tokens == 1 else 10**6  # the other path: dense for 1 token, else gathered
    forced = moe(jnp.asarray(x, jnp.float32), *ws, n_used=2, gather_limit=other)
    want = np.zeros_like(x)
    for t in range(n_tokens):
        h = x[0, t]
        p = np.exp(router @ h - (router @ h).max())
        p /= p.sum()
        top = np.argsort(-p)[:2]
        for e in top:
            g = gate[e] @ h
            out = down[e] @ (g / (1 + np.exp(-g)) * (up[e] @ h))
            want[0, t] += p[e] / p[top].sum() * out
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(forced, want, rtol=1e-4, atol=1e-3)
