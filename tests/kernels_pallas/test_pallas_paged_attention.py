"""Paged decode attention kernels (TPU: scalar-prefetched page tables; GPU: page loop) in
interpret mode against their jnp reference `paged_attention_reference`."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from llamay.kernels_pallas.paged_attention import (
    page_bounds,
    paged_attention_pallas,
    paged_attention_reference,
)

PAD_POSITION = 1 << 30  # the engine's padding position (llamay.engine.paged_steps)


def make_case(B, T, H, K, D, ps, M, *, pool_layers=None, seed=0, dtype=jnp.float32):
    """Random q, a pool (or one layer's pages), distinct page tables (page 0 = null page),
    and each row's last T positions ending at a random length."""
    rng = np.random.default_rng(seed)
    P = B * M + 3
    lead = () if pool_layers is None else (pool_layers,)
    q = jnp.asarray(rng.standard_normal((B, T, H, D)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((*lead, P, ps, K, D)), dtype)
    v = jnp.asarray(rng.standard_normal((*lead, P, ps, K, D)), dtype)
    table = rng.permutation(np.arange(1, P))[: B * M].reshape(B, M)
    lens = rng.integers(T, M * ps + 1, B)
    pos = np.stack([np.arange(n - T, n) for n in lens])
    return q, k, v, jnp.asarray(table, jnp.int32), jnp.asarray(pos, jnp.int32)


# (B, T, H, K, D, ps, M, pool layers, window, softcap)
CASES = [
    (3, 1, 4, 2, 32, 8, 4, None, None, None),  # decode, GQA 2:1, one layer's pages
    (2, 1, 9, 3, 16, 4, 6, 2, None, None),  # SmolLM2's 9:3 heads, pool + layer
    (2, 1, 4, 1, 16, 4, 6, 3, 5, 50.0),  # MQA, sliding window, softcap (gemma-like)
    (2, 5, 6, 3, 16, 4, 5, 2, 6, None),  # a prefill chunk of 5 under a window
    (1, 3, 2, 2, 8, 16, 2, None, 0, 30.0),  # window 0 = global, one partial page
]


def case_id(c):
    B, T, H, K, D, ps, M, L, w, cap = c
    return f"B{B}T{T}H{H}K{K}D{D}ps{ps}M{M}L{L}w{w}cap{cap}"


@pytest.mark.parametrize("platform", ["tpu", "gpu"])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_paged_attention_kernel_equals_reference(case, platform):
    B, T, H, K, D, ps, M, L, window, cap = case
    q, k, v, table, pos = make_case(B, T, H, K, D, ps, M, pool_layers=L)
    layer = None if L is None else jnp.int32(L - 1)
    w = None if window is None else jnp.int32(window)
    kw = dict(scale=D**-0.5, window=w, softcap=cap)
    y = paged_attention_pallas(q, k, v, table, pos, layer, platform=platform, interpret=True, **kw)
    ref = paged_attention_reference(q, k, v, table, pos, layer, **kw)
    assert y.shape == (B, T, H, D)
    np.testing.assert_allclose(np.asarray(y), np.asarray(ref), rtol=1e-5, atol=2e-6)


def test_tpu_kernel_under_the_tpu_interpreter():
    """The scalar-prefetch grid spec run by Mosaic's interpreter (SMEM/VMEM, DMAs)."""
    q, k, v, table, pos = make_case(2, 2, 4, 2, 16, 4, 5, pool_layers=2, seed=3)
    kw = dict(scale=0.25, window=jnp.int32(7), softcap=None)
    y = paged_attention_pallas(
        q, k, v, table, pos, jnp.int32(1), platform="tpu", interpret=pltpu.InterpretParams(), **kw
    )
    ref = paged_attention_reference(q, k, v, table, pos, jnp.int32(1), **kw)
    np.testing.assert_allclose(np.asarray(y), np.asarray(ref), rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("platform", ["tpu", "gpu"])
def test_pages_outside_the_visible_range_are_never_read(platform):
    """NaN in every page before a row's window or after its last position (and in the
    null page) leaves the kernel's output finite and equal to the reference's on
    zeroed pages; f16 pages (the llama.cpp-style cache) are read as f32."""
    B, T, H, K, D, ps, M, window = 2, 1, 4, 2, 16, 4, 8, 6
    q, k, v, table, pos = make_case(B, T, H, K, D, ps, M, seed=5, dtype=jnp.float16)
    bounds = np.asarray(page_bounds(pos, window, ps, M))
    used = {int(table[b, m]) for b in range(B) for m in range(bounds[b, 0], bounds[b, 1] + 1)}
    unused = np.array([p for p in range(k.shape[0]) if p not in used])
    assert len(unused) > B  # the case really skips pages
    kw = dict(scale=0.25, window=jnp.int32(window), softcap=None)
    ref = paged_attention_reference(q, k.at[unused].set(0), v.at[unused].set(0), table, pos, **kw)
    k_nan, v_nan = k.at[unused].set(jnp.nan), v.at[unused].set(jnp.nan)
    y = paged_attention_pallas(q, k_nan, v_nan, table, pos, platform=platform, interpret=True, **kw)
    np.testing.assert_allclose(np.asarray(y), np.asarray(ref), rtol=1e-5, atol=2e-6)


def test_padding_queries_leave_real_rows_alone():
    """A packed step: row 0 has 2 real tokens and 2 padding slots, row 1 is all padding."""
    q, k, v, table, pos = make_case(2, 4, 4, 2, 16, 4, 3, seed=7)
    pos = jnp.asarray([[5, 6, PAD_POSITION, PAD_POSITION], [PAD_POSITION] * 4], jnp.int32)
    kw = dict(scale=0.25)
    y = paged_attention_pallas(q, k, v, table, pos, platform="gpu", interpret=True, **kw)
    ref = paged_attention_reference(q, k, v, table, pos, **kw)
    np.testing.assert_allclose(np.asarray(y[0, :2]), np.asarray(ref[0, :2]), rtol=1e-5, atol=2e-6)
    assert np.all(np.isfinite(np.asarray(y)))
