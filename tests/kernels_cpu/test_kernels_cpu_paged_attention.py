"""The native paged attention (`llamay.kernels_cpu.attention`) against its reference,
`kernels_pallas.paged_attention.paged_attention_reference` (gather the pages, dense
attention in f32), over a table of page sizes, lengths not multiples of the page, GQA
ratios, sliding windows, softcaps, f32, f16 and bf16 pools, rows 1..9, one query token
(decode) and chunks of several (prefill, verify) with padding queries; the portable
(scalar) build equals the native one; calls it does not take return None; the
dispatcher (`llamay.kernels.attention`) runs it on CPU and falls back to the reference
when the build is missing or LLAMAY_CPU_KERNELS=xla."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_cases import OTHER_BUILDS

from llamay import kernels
from llamay.kernels_cpu import build, plug
from llamay.kernels_cpu.attention import paged_attention_native
from llamay.kernels_pallas.paged_attention import paged_attention_reference
from llamay.kv.types import KV_TYPES
from llamay.quant import kv_cache

PAD = 1 << 30  # llamay.engine.paged_steps.PAD_POSITION

# rows, query tokens, q heads, kv heads, head dim, page size, table width, window, softcap, dtype
CASES = [
    (1, 1, 9, 3, 64, 16, 8, None, None, jnp.float32),  # SmolLM2's heads, decode
    (1, 1, 4, 1, 256, 16, 6, 40, None, jnp.float32),  # Gemma 3 270M's, a local layer
    (1, 1, 4, 1, 256, 16, 6, 0, None, jnp.float16),  # ... its global layers (window 0)
    (2, 1, 8, 8, 32, 4, 9, None, 50.0, jnp.float32),  # MHA, softcap (Gemma 2)
    (3, 1, 8, 2, 48, 7, 5, 9, None, jnp.float16),  # odd page size, D not a lane multiple
    (5, 1, 6, 2, 64, 1, 30, None, None, jnp.float32),  # one-position pages
    (8, 1, 9, 3, 64, 16, 4, None, 30.0, jnp.float16),
    (9, 1, 16, 4, 16, 8, 12, 13, None, jnp.float32),
    (1, 5, 9, 3, 64, 16, 4, None, None, jnp.float32),  # a verify chunk
    (2, 16, 4, 1, 128, 4, 12, 8, None, jnp.float16),  # a prefill chunk over the window
    (3, 40, 6, 3, 32, 16, 5, None, 20.0, jnp.float32),  # longer than one task's block
    (7, 3, 12, 4, 64, 8, 7, 5, None, jnp.float16),
    (4, 1, 9, 3, 64, 16, 6, None, None, jnp.bfloat16),  # a bf16 pool
    (2, 6, 4, 1, 40, 4, 9, 7, 50.0, jnp.bfloat16),  # D not a multiple of 16: untiled
    # prefill chunks (the tiles: query rows x key tiles, online softmax)
    (1, 300, 9, 3, 64, 16, 24, None, None, jnp.float32),  # SmolLM2's heads, many key tiles
    (2, 70, 4, 1, 256, 16, 10, 50, None, jnp.float16),  # Gemma 3's, a local layer
    (1, 64, 8, 8, 32, 8, 20, None, 50.0, jnp.bfloat16),  # MHA (64 tokens a tile), softcap
    (3, 24, 16, 2, 16, 4, 12, 13, None, jnp.float32),  # 8 query heads a kv head
    (1, 33, 12, 4, 80, 16, 5, None, None, jnp.float32),  # D 80, a partial token block
    (2, 4, 6, 2, 48, 16, 9, None, None, jnp.float32),  # the fewest tokens tiled: keys split
]


def _case(B, T, H, K, D, ps, M, dtype, seed, layers=3, pad=0):
    """Pools [L, P, ps, K, D] with random contents (the null page too: it must not be
    read where it is masked), page tables of distinct pages, and each row's T queries
    at the end of a length not a multiple of the page (the last `pad` of row 0 padding)."""
    rng = np.random.default_rng(seed)
    P = B * M + 3
    k = jnp.asarray(rng.standard_normal((layers, P, ps, K, D)), dtype)
    v = jnp.asarray(rng.standard_normal((layers, P, ps, K, D)), dtype)
    q = jnp.asarray(rng.standard_normal((B, T, H, D)) * 2, jnp.float32)
    perm = rng.permutation(np.arange(1, P))[: B * M].reshape(B, M)
    table = np.zeros((B, M), np.int32)
    pos = np.zeros((B, T), np.int32)
    for b in range(B):
        n = int(rng.integers(T, M * ps + 1))  # positions 0..n-1 written
        if n % ps == 0 and n > T:
            n -= 1
        used = -(-n // ps)
        table[b, :used] = perm[b, :used]  # the rest: the null page
        pos[b] = np.arange(n - T, n)
    if pad:
        pos[0, T - pad :] = PAD
    return q, k, v, jnp.asarray(table), jnp.asarray(pos)


def _check(got, want, pos, S):
    got, want, pos = np.asarray(got), np.asarray(want), np.asarray(pos)
    real = (pos >= 0) & (pos < S)
    assert np.all(got[~real] == 0)  # padding queries: 0 (the reference's are unused)
    g, w = got[real], want[real]
    assert np.all(np.isfinite(w))
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * np.abs(w).max())


@pytest.mark.parametrize("case", range(len(CASES)))
def test_native_equals_reference(case):
    B, T, H, K, D, ps, M, window, softcap, dtype = CASES[case]
    q, k, v, table, pos = _case(B, T, H, K, D, ps, M, dtype, seed=case, pad=1 if T > 2 else 0)
    kw = dict(scale=D**-0.5, window=window, softcap=softcap)
    for layer in (0, 2):
        lay = jnp.int32(layer)
        got = paged_attention_native(q, k, v, table, pos, lay, **kw)
        assert got is not None and got.dtype == jnp.float32 and got.shape == q.shape
        want = paged_attention_reference(q, k, v, table, pos, lay, **kw)
        _check(got, want, pos, M * ps)
    # one layer's pages [P, ps, K, D] (no layer operand)
    got = paged_attention_native(q, k[1], v[1], table, pos, None, **kw)
    _check(got, paged_attention_reference(q, k[1], v[1], table, pos, None, **kw), pos, M * ps)


def test_under_jit_with_traced_layer_and_window():
    """As the layer scan calls it: layer and window traced (Gemma 3's window is
    jnp.where(local, w, 0)), the whole pool an operand."""
    B, T, H, K, D, ps, M = 4, 1, 4, 1, 256, 16, 6
    q, k, v, table, pos = _case(B, T, H, K, D, ps, M, jnp.float32, seed=99)

    @jax.jit
    def f(q, k, v, table, pos, layer, local):
        w = jnp.where(local, 24, 0)
        return paged_attention_native(q, k, v, table, pos, layer, scale=0.0625, window=w)

    for layer, local, w in ((1, True, 24), (2, False, None)):
        got = f(q, k, v, table, pos, jnp.int32(layer), jnp.bool_(local))
        want = paged_attention_reference(q, k, v, table, pos, jnp.int32(layer), scale=0.0625,
                                         window=w)  # fmt: skip
        _check(got, want, pos, M * ps)


@pytest.mark.parametrize("variant", OTHER_BUILDS)
@pytest.mark.parametrize("T", [2, 40])  # a verify chunk; a prefill chunk (the tiles)
def test_other_builds_equal_native(T, variant):
    q, k, v, table, pos = _case(3, T, 8, 2, 64, 16, 5, jnp.float16, seed=7)
    kw = dict(scale=0.125, window=11, softcap=None)
    a = paged_attention_native(q, k, v, table, pos, jnp.int32(1), **kw)
    b = paged_attention_native(q, k, v, table, pos, jnp.int32(1), variant=variant, **kw)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)


def test_calls_it_does_not_take_return_none():
    q, k, v, table, pos = _case(2, 1, 4, 2, 32, 4, 3, jnp.float32, seed=3)
    kw = dict(scale=0.2)
    assert paged_attention_native(q, k, v, table, pos, 0, numerics="llamacpp", **kw) is None
    assert paged_attention_native(q, k, v, table, pos, 0, causal=False, **kw) is None
    for dt in (jnp.int8, jnp.uint8):  # e.g. a quantised pool's block bytes
        kb, vb = k.astype(dt), v.astype(dt)
        assert paged_attention_native(q, kb, vb, table, pos, 0, **kw) is None
    assert paged_attention_native(q, k, v, table, pos, None, **kw) is None  # pool needs a layer
    assert paged_attention_native(q[..., :16], k, v, table, pos, 0, **kw) is None


def _native_in_program(fn, *args) -> bool:
    """Whether fn's lowered program calls the native kernel (fn traced afresh: jit's
    trace cache is keyed by the function, and the choice is made at trace time)."""
    text = jax.jit(lambda *a: fn(*a)).lower(*args).as_text()
    return "LlamayPagedAttention" in text


def test_dispatcher_uses_it_on_cpu_and_falls_back(monkeypatch, drop_compiler):
    q, k, v, table, pos = _case(3, 1, 9, 3, 64, 16, 4, jnp.float32, seed=5)

    def f(q, k, v, table, pos):
        return kernels.attention(q, k, v, pos, page_table=table, layer=jnp.int32(1), scale=0.125)

    want = paged_attention_reference(q, k, v, table, pos, jnp.int32(1), scale=0.125)
    monkeypatch.delenv("LLAMAY_BACKEND", raising=False)
    monkeypatch.delenv(build.ENV, raising=False)
    assert _native_in_program(f, q, k, v, table, pos)
    _check(jax.jit(lambda *a: f(*a))(q, k, v, table, pos), want, pos, 64)

    monkeypatch.setenv(build.ENV, "xla")
    assert not _native_in_program(f, q, k, v, table, pos)

    drop_compiler()  # the build missing (auto): the reference, same values
    assert plug.paged_attention(q, k, v, table, pos, jnp.int32(1), scale=0.125) is None
    assert not _native_in_program(f, q, k, v, table, pos)
    _check(jax.jit(lambda *a: f(*a))(q, k, v, table, pos), want, pos, 64)


def test_prefill_chunks_run_native(monkeypatch):
    """The dispatch policy: every query length natively, decode steps to long prefill
    chunks (each equal to the reference)."""
    monkeypatch.delenv(build.ENV, raising=False)
    for T in (1, 16, 17, 200):
        q, k, v, table, pos = _case(2, T, 6, 2, 32, 8, 30, jnp.float32, seed=T)
        got = plug.paged_attention(q, k, v, table, pos, jnp.int32(0), scale=0.2)
        assert got is not None
        want = paged_attention_reference(q, k, v, table, pos, jnp.int32(0), scale=0.2)
        _check(got, want, pos, 240)


# rows, query tokens, q heads, kv heads, head dim, cache slots, window, softcap, dtype
DENSE_CASES = [
    (1, 1, 9, 3, 64, 256, None, None, jnp.float32),  # SmolLM2 decoding (bench's context)
    (1, 1, 4, 1, 256, 100, 40, None, jnp.float16),  # Gemma 3 local layer, S not a multiple
    (3, 1, 8, 8, 32, 37, None, 50.0, jnp.float32),  # MHA, softcap, odd S
    (2, 5, 9, 3, 64, 64, None, None, jnp.bfloat16),  # a verify chunk
    (8, 1, 16, 4, 16, 48, 13, None, jnp.float32),
    (1, 1, 9, 3, 64, 80, None, None, "q8_0"),  # block KV types (llamay.kv.types)
    (2, 3, 4, 1, 128, 50, 20, None, "q4_0"),
]


@pytest.mark.parametrize("case", range(len(DENSE_CASES)))
def test_dense_cache_runs_native_and_equals_reference(monkeypatch, case):
    """A dense cache — one layer [B, S, K, D], or the stack [L, B, S, K, D] the layer scan
    hands with `layer`; float or a block type — goes to the native kernel (read in place
    as one page per row) on CPU and equals the dense reference at each row's queries."""
    monkeypatch.delenv("LLAMAY_BACKEND", raising=False)
    monkeypatch.delenv(build.ENV, raising=False)
    B, T, H, K, D, S, window, softcap, dtype = DENSE_CASES[case]
    rng = np.random.default_rng(100 + case)
    k = jnp.asarray(rng.standard_normal((3, B, S, K, D)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((3, B, S, K, D)), jnp.float32)
    if isinstance(dtype, str):  # a block type: rows of its GGUF blocks
        t = KV_TYPES[dtype]
        k, v = (kv_cache.encode(a, jnp.zeros((1, t.row_width(D)), t.dtype)) for a in (k, v))
    else:
        k, v = k.astype(dtype), v.astype(dtype)
    q = jnp.asarray(rng.standard_normal((B, T, H, D)) * 2, jnp.float32)
    ends = rng.integers(T, S + 1, size=B)
    pos = jnp.asarray(np.stack([np.arange(n - T, n) for n in ends]), jnp.int32)
    kw = dict(scale=D**-0.5, window=window, softcap=softcap)

    def ref(layer):  # the dense reference (a block cache: dequantised first)
        return kernels.dense_reference(q, k[layer], v[layer], pos, **kw)

    def stacked(q, k, v, pos, layer):
        return kernels.attention(q, k, v, pos, layer=layer, **kw)

    def one_layer(q, k, v, pos):
        return kernels.attention(q, k, v, pos, **kw)

    for layer in (0, 2):
        want = ref(layer)
        args = (q, k, v, pos, jnp.int32(layer))
        assert _native_in_program(stacked, *args)
        _check(jax.jit(stacked)(*args), want, pos, S)
        assert _native_in_program(one_layer, q, k[layer], v[layer], pos)
        _check(jax.jit(one_layer)(q, k[layer], v[layer], pos), want, pos, S)
    monkeypatch.setenv(build.ENV, "xla")  # the reference, the layer read out of the stack
    assert not _native_in_program(stacked, q, k, v, pos, jnp.int32(1))
    want = ref(1)
    _check(jax.jit(stacked)(q, k, v, pos, jnp.int32(1)), want, pos, S)
