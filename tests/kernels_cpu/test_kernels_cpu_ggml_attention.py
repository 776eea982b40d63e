"""The native llama.cpp-numerics attention (`llamay.kernels_cpu.ggml_attention`) against
its oracle, the XLA emulation `llamay.kernels.ggml_attention.attention` (which mirrors
ggml's f16 dots, softmax and SIMD lane order, and itself holds the llama.cpp goldens),
**bit for bit**: over a table of GQA ratios, head dims 64/128/256 (and odd ones), page
sizes, contexts not multiples of the page, sliding windows, q prescaled or not, causal or
not, f16 and bf16 caches, rows 1..9, query tokens 1..40 with padding queries, 1..32
query heads a kv head (the kernel's tiles: a kv head's rows together, several token
blocks, groups of rows; and its per-token path where ggml's dots have leftovers), dense
caches (one layer or the layer stack) and paged pools read through the table; score
ranges wide enough that the softmax underflows and values small enough for f16
subnormals. Also: the portable (scalar) build gives the same bits; calls the kernel does
not take return None; the dispatcher runs it on CPU in llamacpp numerics and falls back
to the emulation when the build is missing or LLAMAY_CPU_KERNELS=xla."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_cases import OTHER_BUILDS

from llamay import kernels
from llamay.kernels import ggml_attention
from llamay.kernels_cpu import build, plug
from llamay.kernels_cpu.ggml_attention import ggml_attention_native
from llamay.kernels_pallas.paged_attention import gather_pages

PAD = 1 << 30  # llamay.engine.paged_steps.PAD_POSITION
F16, BF16 = jnp.float16, jnp.bfloat16

# rows, query tokens, q heads, kv heads, head dim, page size, table width, window,
# K dtype, V dtype, q scale (wide: the softmax underflows), causal, prescaled
PAGED = [
    (1, 1, 9, 3, 64, 16, 8, None, F16, F16, 2.0, True, False),  # SmolLM2 decoding
    (1, 1, 4, 1, 256, 16, 6, 40, F16, F16, 1.0, True, True),  # Gemma 3 local layer
    (1, 1, 4, 1, 256, 16, 6, 0, F16, F16, 1.0, True, True),  # ... a global one
    (2, 1, 8, 2, 128, 8, 10, None, F16, F16, 30.0, True, False),  # wide scores
    (3, 1, 8, 8, 64, 4, 12, 9, F16, F16, 2.0, True, False),  # MHA, small pages
    (5, 1, 6, 2, 64, 1, 48, None, F16, F16, 2.0, True, False),  # one-position pages
    (9, 1, 16, 4, 128, 32, 3, 13, F16, F16, 2.0, True, False),
    (1, 5, 9, 3, 64, 16, 4, None, F16, F16, 2.0, True, False),  # a verify chunk
    (2, 16, 4, 1, 128, 8, 12, 8, F16, F16, 3.0, True, False),  # a prefill chunk, window
    (7, 3, 12, 4, 64, 16, 7, 5, F16, F16, 1e-3, True, False),  # f16 subnormal q
    (4, 1, 9, 3, 64, 16, 6, None, BF16, BF16, 2.0, True, False),  # bf16
    (2, 6, 4, 1, 256, 16, 5, 7, F16, BF16, 2.0, True, True),  # mixed K/V types
    (3, 4, 6, 3, 80, 16, 4, None, F16, F16, 2.0, True, False),  # D not a multiple of 64
    (2, 3, 4, 2, 64, 16, 4, None, F16, F16, 2.0, False, False),  # not causal
    (8, 2, 8, 4, 256, 8, 6, 20, F16, F16, 8.0, True, False),
    # tiles: a prefill chunk over many pages (several token blocks a kv head), G = 32
    # rows in P.V groups, one token with D not a multiple of 64 (the per-token path)
    (1, 40, 9, 3, 64, 16, 24, None, F16, F16, 2.0, True, False),
    (2, 24, 32, 2, 128, 16, 8, 30, F16, BF16, 2.0, True, True),
    (2, 1, 32, 1, 64, 16, 6, None, BF16, F16, 2.0, True, False),
    (1, 1, 6, 2, 80, 16, 4, None, F16, F16, 2.0, True, False),
]


def _paged_case(B, T, H, K, D, ps, M, kdt, vdt, qscale, seed, layers=3, pad=0):
    """Pools [L, P, ps, K, D] with random contents (the null page too: masked slots must
    not matter), page tables of distinct pages, each row's T queries at the end of a
    length not a multiple of the page (the last `pad` of row 0 padding)."""
    rng = np.random.default_rng(seed)
    P = B * M + 3
    k = jnp.asarray(rng.standard_normal((layers, P, ps, K, D)), kdt)
    v = jnp.asarray(rng.standard_normal((layers, P, ps, K, D)), vdt)
    q = jnp.asarray(rng.standard_normal((B, T, H, D)) * qscale, jnp.float32)
    perm = rng.permutation(np.arange(1, P))[: B * M].reshape(B, M)
    table = np.zeros((B, M), np.int32)
    pos = np.zeros((B, T), np.int32)
    for b in range(B):
        n = int(rng.integers(T, M * ps + 1))  # positions 0..n-1 written
        if n % ps == 0 and n > T and ps > 1:
            n -= 1
        used = -(-n // ps)
        table[b, :used] = perm[b, :used]  # the rest: the null page
        pos[b] = np.arange(n - T, n)
    if pad:
        pos[0, T - pad :] = PAD
    return q, k, v, jnp.asarray(table), jnp.asarray(pos)


def _emulation(q, k, v, pos, **kw):
    return np.asarray(jax.jit(lambda *a: ggml_attention.attention(*a, **kw))(q, k, v, pos))


def _kw(D, window, causal, prescaled):
    return dict(scale=D**-0.5, window=window, causal=causal, q_prescaled=prescaled)


@pytest.mark.parametrize("case", range(len(PAGED)))
def test_paged_equals_the_emulation_bit_for_bit(case):
    B, T, H, K, D, ps, M, window, kdt, vdt, qscale, causal, pre = PAGED[case]
    q, k, v, table, pos = _paged_case(B, T, H, K, D, ps, M, kdt, vdt, qscale, seed=case,
                                      pad=1 if T > 2 else 0)  # fmt: skip
    kw = _kw(D, window, causal, pre)
    for layer in (0, 2):
        lay = jnp.int32(layer)
        want = _emulation(q, gather_pages(k, table, lay), gather_pages(v, table, lay), pos, **kw)
        got = np.asarray(ggml_attention_native(q, k, v, pos, table, lay, **kw))
        assert np.all(np.isfinite(want))
        np.testing.assert_array_equal(got, want)
    # one layer's pages [P, ps, K, D] (no layer operand)
    want = _emulation(q, gather_pages(k[1], table), gather_pages(v[1], table), pos, **kw)
    np.testing.assert_array_equal(
        np.asarray(ggml_attention_native(q, k[1], v[1], pos, table, **kw)), want
    )


# rows, query tokens, q heads, kv heads, head dim, cache slots, window, dtype, q scale, causal
DENSE = [
    (1, 1, 9, 3, 64, 256, None, F16, 2.0, True),  # SmolLM2 decoding (the bench's context)
    (1, 1, 4, 1, 256, 96, 40, F16, 1.0, True),  # Gemma 3 local layer
    (2, 1, 8, 2, 128, 512, None, F16, 20.0, True),
    (3, 7, 8, 8, 64, 48, 13, F16, 2.0, True),
    (6, 16, 6, 2, 64, 64, None, BF16, 2.0, True),
    (2, 4, 9, 3, 64, 32, None, F16, 2.0, False),  # not causal
    (9, 1, 16, 4, 128, 80, 30, F16, 2.0, True),
]


@pytest.mark.parametrize("case", range(len(DENSE)))
def test_dense_equals_the_emulation_bit_for_bit(case):
    """A dense cache [B, S, K, D], and the stack [L, B, S, K, D] with `layer`, as the
    layer scan hands it."""
    B, T, H, K, D, S, window, dt, qscale, causal = DENSE[case]
    rng = np.random.default_rng(200 + case)
    L = 2
    k = jnp.asarray(rng.standard_normal((L, B, S, K, D)), dt)
    v = jnp.asarray(rng.standard_normal((L, B, S, K, D)), dt)
    q = jnp.asarray(rng.standard_normal((B, T, H, D)) * qscale, jnp.float32)
    n = rng.integers(T, S + 1, B)
    pos = np.stack([np.arange(x - T, x) for x in n]).astype(np.int32)
    if T > 2:
        pos[-1, -1] = PAD
    pos = jnp.asarray(pos)
    kw = _kw(D, window, causal, case % 2 == 1)
    want = _emulation(q, k[1], v[1], pos, **kw)
    np.testing.assert_array_equal(np.asarray(ggml_attention_native(q, k[1], v[1], pos, **kw)), want)
    got = ggml_attention_native(q, k, v, pos, None, jnp.int32(1), **kw)
    np.testing.assert_array_equal(np.asarray(got), want)


def test_under_jit_with_traced_layer_and_window():
    """As the layer scan calls it: layer and window traced (Gemma 3's window is
    jnp.where(local, w, 0)), the whole pool an operand."""
    B, T, H, K, D, ps, M = 3, 1, 4, 1, 256, 16, 6
    q, k, v, table, pos = _paged_case(B, T, H, K, D, ps, M, F16, F16, 1.0, seed=99)

    @jax.jit
    def f(q, k, v, table, pos, layer, local):
        w = jnp.where(local, 24, 0)
        return ggml_attention_native(q, k, v, pos, table, layer, scale=0.0625, window=w,
                                     q_prescaled=True)  # fmt: skip

    for layer, local, w in ((1, True, 24), (2, False, None)):
        lay = jnp.int32(layer)
        got = f(q, k, v, table, pos, lay, jnp.bool_(local))
        want = _emulation(q, gather_pages(k, table, lay), gather_pages(v, table, lay), pos,
                          scale=0.0625, window=w, q_prescaled=True)  # fmt: skip
        np.testing.assert_array_equal(np.asarray(got), want)


@pytest.mark.parametrize("variant", OTHER_BUILDS)
@pytest.mark.parametrize("T, D", [(2, 64), (1, 128), (40, 64), (1, 80)])
def test_other_builds_equal_native_and_the_emulation(T, D, variant):
    """The portable build (no intrinsics) and, on x86, the AVX2 one (what most x86 CPUs
    run, whatever this host has) on the tiles, one token's (vec_dot order) and a batch's
    (sgemm), and on the per-token path (D = 80 for one token)."""
    q, k, v, table, pos = _paged_case(3, T, 8, 2, D, 16, 5, F16, F16, 4.0, seed=7 + T)
    kw = dict(scale=0.125, window=11)
    a = ggml_attention_native(q, k, v, pos, table, jnp.int32(1), **kw)
    b = ggml_attention_native(q, k, v, pos, table, jnp.int32(1), variant=variant, **kw)
    want = _emulation(q, gather_pages(k, table, 1), gather_pages(v, table, 1), pos, **kw)
    np.testing.assert_array_equal(np.asarray(a), want)
    np.testing.assert_array_equal(np.asarray(b), want)


def test_calls_it_does_not_take_return_none():
    q, k, v, table, pos = _paged_case(2, 1, 4, 2, 64, 16, 3, F16, F16, 1.0, seed=3)
    kw = dict(scale=0.2)
    assert ggml_attention_native(q, k, v, pos, table, 0, numerics="exact", **kw) is None
    assert ggml_attention_native(q, k, v, pos, table, 0, softcap=50.0, **kw) is None
    k32, v32 = k.astype(jnp.float32), v.astype(jnp.float32)  # an encoder's f32 K/V
    assert ggml_attention_native(q, k32, v32, pos, table, 0, **kw) is None
    kb = jnp.zeros((*k.shape[:-1], 68), jnp.uint8)  # a q8_0 pool's block bytes
    assert ggml_attention_native(q, kb, kb, pos, table, 0, **kw) is None
    assert ggml_attention_native(q, k, v, pos, table, None, **kw) is None  # pool needs a layer
    odd = jnp.zeros((2, 40, 2, 64), F16)  # S not a multiple of the softmax's 16-chunks
    assert ggml_attention_native(q, odd, odd, pos, **kw) is None


def _native_in_program(fn, *args) -> bool:
    """Whether fn's lowered program calls the kernel (traced afresh: the choice is made
    at trace time)."""
    return "LlamayGgmlAttention" in jax.jit(lambda *a: fn(*a)).lower(*args).as_text()


def test_dispatcher_uses_it_on_cpu_and_falls_back(monkeypatch, drop_compiler):
    q, k, v, table, pos = _paged_case(2, 1, 9, 3, 64, 16, 4, F16, F16, 2.0, seed=5)
    lay = jnp.int32(1)

    def paged(q, k, v, table, pos):
        return kernels.attention(q, k, v, pos, page_table=table, layer=lay, scale=0.125,
                                 numerics="llamacpp")  # fmt: skip

    def dense(q, k, v, table, pos):
        return kernels.attention(q, k[1, :2], v[1, :2], pos, scale=0.125, numerics="llamacpp")

    want_paged = _emulation(q, gather_pages(k, table, lay), gather_pages(v, table, lay), pos,
                            scale=0.125)  # fmt: skip
    want_dense = _emulation(q, k[1, :2], v[1, :2], pos, scale=0.125)
    monkeypatch.delenv("LLAMAY_BACKEND", raising=False)
    monkeypatch.delenv(build.ENV, raising=False)
    for f, want in ((paged, want_paged), (dense, want_dense)):
        assert _native_in_program(f, q, k, v, table, pos)
        np.testing.assert_array_equal(np.asarray(jax.jit(f)(q, k, v, table, pos)), want)

    monkeypatch.setenv(build.ENV, "xla")
    for f in (paged, dense):
        assert not _native_in_program(f, q, k, v, table, pos)

    drop_compiler()  # the build missing (auto): the emulation, the same bits
    assert plug.ggml_attention(q, k, v, pos, table, lay, scale=0.125) is None
    for f, want in ((paged, want_paged), (dense, want_dense)):
        assert not _native_in_program(f, q, k, v, table, pos)
        np.testing.assert_array_equal(np.asarray(jax.jit(f)(q, k, v, table, pos)), want)
