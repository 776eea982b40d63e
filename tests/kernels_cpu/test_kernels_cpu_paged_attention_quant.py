"""The native paged attention over quantised KV pools (q8_0, q5_1, q5_0, q4_1, q4_0:
uint8 rows of GGUF blocks, `llamay.kv.types`), read in place, against its reference: the
pages gathered, dequantised (`llamay.quant.kv_cache.decode`), then dense attention in f32
(`llamay.kernels.attention.paged_reference`, what the dispatcher ran before). Also against
gguf-py's dequantisation and float64 attention (the bytes read as GGUF defines them).
Types x shapes: every block type for K and for V, K and V of different types (a float
one too), GQA, head dims 32..256, contexts not multiples of the page, sliding windows,
softcaps, rows 1..9, decode steps, short chunks of query tokens (the transposed-key path)
and prefill chunks (the tiles) with padding queries; the scalar build equals the native
one; the dispatcher takes the kernel for quantised pools on CPU."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fixture_data import oracle
from kernel_cases import make_case

from llamay import kernels
from llamay.kernels.attention import paged_reference
from llamay.kernels_cpu import build
from llamay.kernels_cpu.attention import paged_attention_native
from llamay.kv.types import KV_TYPES

BLOCK = ["q8_0", "q5_1", "q5_0", "q4_1", "q4_0"]
# (K type, V type): each block type for both, then mixed pairs
PAIRS = [(t, t) for t in BLOCK] + [
    ("q8_0", "f16"),
    ("f32", "q4_1"),
    ("q4_0", "q8_0"),
    ("bf16", "q5_1"),
    ("q5_0", "q4_0"),
]

# rows, query tokens, q heads, kv heads, head dim, page size, table width, window, softcap
SHAPES = [
    (1, 1, 9, 3, 64, 16, 8, None, None),  # SmolLM2's heads, decode
    (1, 1, 4, 1, 256, 16, 6, 40, None),  # Gemma 3 270M's, a local layer
    (2, 1, 8, 8, 32, 4, 9, None, 50.0),  # MHA, softcap (Gemma 2)
    (3, 1, 8, 2, 128, 7, 5, 9, None),  # odd page size, head dim 128
    (8, 1, 9, 3, 64, 16, 4, None, 30.0),
    (9, 1, 16, 4, 32, 8, 12, 13, None),
    (1, 5, 9, 3, 64, 16, 4, None, None),  # a verify chunk
    (2, 16, 4, 1, 128, 4, 12, 8, None),  # a chunk over the window (keys transposed)
    (7, 3, 12, 4, 64, 8, 7, 5, None),
    (3, 12, 6, 3, 32, 16, 5, None, 20.0),
    (1, 70, 9, 3, 64, 16, 6, None, None),  # a prefill chunk (the tiles)
    (2, 40, 4, 1, 256, 16, 5, 30, None),  # ... over a window, head dim 256
]


def check(got, want, pos, S, rtol=1e-5):
    got, want, pos = np.asarray(got), np.asarray(want), np.asarray(pos)
    real = (pos >= 0) & (pos < S)
    assert np.all(got[~real] == 0)  # padding queries: 0 (the reference's are unused)
    g, w = got[real], want[real]
    assert np.all(np.isfinite(w))
    np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * np.abs(w).max())


def run_case(shape, kt, vt, seed):
    B, T, H, K, D, ps, M, window, softcap = shape
    q, k, v, table, pos = make_case(B, T, H, K, D, ps, M, kt, vt, seed, pad=1 if T > 2 else 0)
    assert (k.dtype == jnp.uint8) == KV_TYPES[kt].quantised
    kw = dict(scale=D**-0.5, window=window, softcap=softcap)
    for layer in (0, 1):
        lay = jnp.int32(layer)
        got = paged_attention_native(q, k, v, table, pos, lay, **kw)
        assert got is not None and got.dtype == jnp.float32 and got.shape == q.shape
        check(got, paged_reference(q, k, v, table, pos, lay, **kw), pos, M * ps)
    # one layer's pages [P, ps, K, row] (no layer operand)
    got = paged_attention_native(q, k[1], v[1], table, pos, None, **kw)
    check(got, paged_reference(q, k[1], v[1], table, pos, None, **kw), pos, M * ps)


@pytest.mark.parametrize("i", range(len(SHAPES)))
def test_shapes(i):
    """Every shape, with the type pairs in turn."""
    kt, vt = PAIRS[i % len(PAIRS)]
    run_case(SHAPES[i], kt, vt, seed=i)


@pytest.mark.parametrize("kt,vt", PAIRS, ids=lambda t: t)
@pytest.mark.parametrize(
    "shape", [SHAPES[0], SHAPES[8], SHAPES[7]], ids=["decode", "chunk", "tiles"]
)
def test_type_pairs(shape, kt, vt):
    run_case(shape, kt, vt, seed=100 + PAIRS.index((kt, vt)))


@pytest.mark.parametrize("name", BLOCK)
def test_values_are_gguf_blocks(name):
    """The oracle independent of llamay's dequantisation: gguf-py's, then attention in
    float64 (numpy) over each row's gathered pages."""
    gguf = oracle("gguf")
    B, T, H, K, D, ps, M = 3, 2, 8, 2, 64, 8, 5
    q, k, v, table, pos = make_case(B, T, H, K, D, ps, M, name, name, seed=11, layers=1)
    qt = gguf.GGMLQuantizationType[name.upper()]
    kf = gguf.quants.dequantize(np.asarray(k[0]), qt).astype(np.float64)  # [P, ps, K, D]
    vf = gguf.quants.dequantize(np.asarray(v[0]), qt).astype(np.float64)
    scale = 0.125
    got = np.asarray(paged_attention_native(q, k, v, table, pos, jnp.int32(0), scale=scale))
    tb, qp, qn = np.asarray(table), np.asarray(pos), np.asarray(q, np.float64)
    want = np.zeros_like(got, np.float64)
    for b in range(B):
        kb = kf[tb[b]].reshape(M * ps, K, D)
        vb = vf[tb[b]].reshape(M * ps, K, D)
        for t in range(T):
            n = qp[b, t] + 1
            for h in range(H):
                s = kb[:n, h // (H // K)] @ qn[b, t, h] * scale
                p = np.exp(s - s.max())
                want[b, t, h] = p @ vb[:n, h // (H // K)] / p.sum()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_scalar_build_equals_native():
    """The portable build (blocks.h's scalar dequantisation, no vectors) against the
    SIMD one, each path (decode, a short chunk, a prefill chunk's tiles)."""
    for T, (kt, vt) in ((1, ("q5_1", "q4_0")), (3, ("q4_1", "q8_0")), (6, ("q8_0", "q5_0"))):
        q, k, v, table, pos = make_case(3, T, 8, 2, 64, 16, 5, kt, vt, seed=7)
        kw = dict(scale=0.125, window=11, softcap=None)
        a = paged_attention_native(q, k, v, table, pos, jnp.int32(1), **kw)
        b = paged_attention_native(q, k, v, table, pos, jnp.int32(1), variant="scalar", **kw)
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)


def test_pools_it_does_not_read_return_none():
    q, k, v, table, pos = make_case(2, 1, 4, 2, 64, 4, 3, "q8_0", "q4_0", seed=3)
    kw = dict(scale=0.2)
    assert paged_attention_native(q, k, v, table, pos, 0, **kw) is not None
    assert paged_attention_native(q, k[..., :-2], v, table, pos, 0, **kw) is None  # no type
    assert paged_attention_native(q, k.astype(jnp.int8), v, table, pos, 0, **kw) is None
    assert paged_attention_native(q, k, v[:, :-1], table, pos, 0, **kw) is None  # pools differ
    assert paged_attention_native(q, k, v, table, pos, 0, numerics="llamacpp", **kw) is None
    # head dim 48: 1.5 blocks a row (a float pool of it is read, a block one cannot exist)
    q48 = q[..., :48]
    k48 = jnp.zeros((*k.shape[:-1], 51), jnp.uint8)
    assert paged_attention_native(q48, k48, k48, table, pos, 0, **kw) is None


def test_dispatcher_runs_it_for_quantised_pools(monkeypatch):
    """kernels.attention on CPU: a quantised paged pool goes to the native kernel (the
    program calls it), with the reference's values; LLAMAY_CPU_KERNELS=xla keeps the
    reference."""
    q, k, v, table, pos = make_case(3, 1, 9, 3, 64, 16, 4, "q4_0", "q8_0", seed=5)

    def f(q, k, v, table, pos):
        return kernels.attention(q, k, v, pos, page_table=table, layer=jnp.int32(1), scale=0.125)

    def native_in(fn):
        return (
            "LlamayPagedAttention"
            in jax.jit(lambda *a: fn(*a)).lower(q, k, v, table, pos).as_text()
        )

    want = paged_reference(q, k, v, table, pos, jnp.int32(1), scale=0.125)
    monkeypatch.delenv("LLAMAY_BACKEND", raising=False)
    monkeypatch.delenv(build.ENV, raising=False)
    assert native_in(f)
    check(jax.jit(lambda *a: f(*a))(q, k, v, table, pos), want, pos, 64)
    monkeypatch.setenv(build.ENV, "xla")
    assert not native_in(f)
    check(jax.jit(lambda *a: f(*a))(q, k, v, table, pos), want, pos, 64)
