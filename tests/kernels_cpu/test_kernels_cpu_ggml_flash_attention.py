"""The native kernel of llama.cpp's flash attention over an f16 cache
(`llamay.kernels_cpu.ggml_attention.ggml_flash_attention_native`) against its oracle, the XLA
emulation `llamay.kernels.ggml_attention.flash_attention` (which holds llama.cpp's goldens:
tests/model/test_flash_attn.py), **bit for bit**, on each of ggml's three paths: tiled (a
step of >= 64 real tokens), one pass per query row (fewer; one token over < 512 cells; a
step of several decoding rows), split over llama.cpp's threads (one token over >= 512
cells: 2 and 3 threads); head dims 16..256, GQA ratios, sliding windows, q prescaled or not,
causal or not, dense caches (one layer or the stack) and paged pools, padding queries. Also:
calls it does not take return None, and the dispatcher runs it on CPU with flash_attn."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_cases import OTHER_BUILDS, PAD, make_case

from llamay import kernels
from llamay.kernels import ggml_attention
from llamay.kernels_cpu import build
from llamay.kernels_cpu.ggml_attention import ggml_flash_attention_native
from llamay.kernels_pallas.paged_attention import gather_pages
from llamay.quant import ggml_rows

pytestmark = pytest.mark.usefixtures("native_kernels")  # conftest.py


def _emulation(q, k, v, pos, rows, threads, **kw):
    def f(q, k, v, pos):
        with ggml_rows.real_rows(jnp.int32(rows), of=q.shape[0] * q.shape[1]):
            return ggml_attention.flash_attention(q, k, v, pos, threads=threads, **kw)

    return np.asarray(jax.jit(f)(q, k, v, pos))


# rows, query tokens, q heads, kv heads, head dim, cache slots, cells written, real rows
# of the step, threads, window, prescaled, causal
DENSE = [
    (1, 1, 9, 3, 64, 1024, 700, 1, 2, None, False, True),  # SmolLM2 decoding at depth: split
    (1, 1, 4, 1, 256, 1024, 900, 1, 3, 300, True, True),  # Gemma 3 local layer, 3 threads
    (1, 1, 9, 3, 64, 512, 200, 1, 2, None, False, True),  # below 512 cells: one pass
    (3, 1, 8, 2, 64, 1024, 700, 3, 2, None, False, True),  # 3 rows decoding: one pass each
    (1, 128, 9, 3, 64, 256, 128, 128, 2, None, False, True),  # a prefill: tiled
    (2, 96, 4, 2, 16, 512, 400, 192, 2, 50, False, True),  # tiny models' head dim, window
    (1, 64, 4, 4, 256, 256, 70, 64, 2, None, True, False),  # not causal, D 256
    (1, 80, 4, 2, 32, 256, 80, 40, 2, None, False, True),  # 40 real rows: one pass a row
    (2, 16, 6, 2, 128, 512, 300, 32, 2, 8, False, True),  # a short chunk: one pass a row
    (1, 70, 4, 2, 80, 256, 70, 70, 2, None, False, True),  # D 80: vector and scalar parts
]


@pytest.mark.parametrize("case", range(len(DENSE)))
def test_dense_equals_the_emulation_bit_for_bit(case):
    B, T, H, K, D, S, n, rows, threads, window, pre, causal = DENSE[case]
    rng = np.random.default_rng(300 + case)
    k = jnp.asarray(rng.standard_normal((2, B, S, K, D)) * 1.5, jnp.float16)
    v = jnp.asarray(rng.standard_normal((2, B, S, K, D)), jnp.float16)
    q = jnp.asarray(rng.standard_normal((B, T, H, D)) * 2, jnp.float32)
    pos = np.tile(np.arange(n - T, n, dtype=np.int32), (B, 1))
    if rows < B * T:  # the step's padding: positions past the cache
        pos.reshape(-1)[rows:] = PAD
    pos = jnp.asarray(pos)
    kw = dict(scale=D**-0.5, window=window, causal=causal, q_prescaled=pre)
    want = _emulation(q, k[1], v[1], pos, rows, threads, **kw)
    assert np.all(np.isfinite(want))
    for cache, layer in (((k[1], v[1]), None), ((k, v), jnp.int32(1))):
        got = ggml_flash_attention_native(q, *cache, pos, None, layer, rows=jnp.int32(rows),
                                          threads=threads, **kw)  # fmt: skip
        np.testing.assert_array_equal(np.asarray(got), want)


# rows, query tokens, q heads, kv heads, head dim, page size, table width, real-row padding
PAGED = [
    (2, 70, 8, 2, 64, 16, 12, 3),  # tiled over pages
    (1, 1, 9, 3, 64, 16, 48, 0),  # one token (split where its length passes 512)
    (3, 5, 4, 1, 128, 8, 20, 1),  # a verify chunk: one pass a row
]


@pytest.mark.parametrize("case", range(len(PAGED)))
def test_paged_equals_the_emulation_bit_for_bit(case):
    B, T, H, K, D, ps, M, pad = PAGED[case]
    for seed in range(3):
        q, k, v, table, pos = make_case(B, T, H, K, D, ps, M, "f16", "f16", seed + 10 * case,
                                        pad=pad)  # fmt: skip
        rows, lay = B * T - pad, jnp.int32(1)
        kw = dict(scale=D**-0.5, window=None)
        want = _emulation(q, gather_pages(k, table, lay), gather_pages(v, table, lay), pos,
                          rows, 2, **kw)  # fmt: skip
        got = ggml_flash_attention_native(q, k, v, pos, table, lay, rows=jnp.int32(rows),
                                          threads=2, **kw)  # fmt: skip
        np.testing.assert_array_equal(np.asarray(got), want)


def test_calls_it_does_not_take_return_none():
    q, k, v, table, pos = make_case(2, 1, 4, 2, 64, 16, 3, "f16", "f16", 3)
    kw = dict(scale=0.2, rows=2, threads=2)
    assert ggml_flash_attention_native(q, k, v, pos, table, 1, numerics="exact", **kw) is None
    assert ggml_flash_attention_native(q, k, v, pos, table, 1, softcap=50.0, **kw) is None
    kb, vb = k.astype(jnp.bfloat16), v.astype(jnp.bfloat16)  # a bf16 cache: the emulation's
    assert ggml_flash_attention_native(q, kb, vb, pos, table, 1, **kw) is None


def test_dispatcher_uses_it_with_flash_attn_on_cpu(monkeypatch):
    q, k, v, table, pos = make_case(1, 1, 9, 3, 64, 16, 40, "f16", "f16", 5)
    lay = jnp.int32(1)

    def f(q, k, v, table, pos):
        return kernels.attention(q, k, v, pos, page_table=table, layer=lay, scale=0.125,
                                 numerics="llamacpp", flash_attn=True, threads=2)  # fmt: skip

    def program(*a) -> str:  # traced afresh: the choice is made at trace time
        return jax.jit(lambda *b: f(*b)).lower(*a).as_text()

    def run(*a):
        return np.asarray(jax.jit(lambda *b: f(*b))(*a))

    want = _emulation(q, gather_pages(k, table, lay), gather_pages(v, table, lay), pos, 1, 2,
                      scale=0.125)  # fmt: skip
    monkeypatch.delenv("LLAMAY_BACKEND", raising=False)
    assert "LlamayGgmlFlashAttention" in program(q, k, v, table, pos)
    np.testing.assert_array_equal(run(q, k, v, table, pos), want)
    monkeypatch.setenv(build.ENV, "xla")
    assert "LlamayGgmlFlashAttention" not in program(q, k, v, table, pos)
    np.testing.assert_array_equal(run(q, k, v, table, pos), want)


@pytest.mark.parametrize("variant", OTHER_BUILDS)
@pytest.mark.parametrize("case", [0, 4, 6, 9])
def test_other_builds_equal_the_emulation(case, variant):
    """The portable build (no intrinsics) and, on x86, the AVX2 one (whatever this host
    has): the split path, the tiled path (D 64, 256 and 80)."""
    B, T, H, K, D, S, n, rows, threads, window, pre, causal = DENSE[case]
    rng = np.random.default_rng(400 + case)
    k = jnp.asarray(rng.standard_normal((B, S, K, D)), jnp.float16)
    v = jnp.asarray(rng.standard_normal((B, S, K, D)), jnp.float16)
    q = jnp.asarray(rng.standard_normal((B, T, H, D)) * 2, jnp.float32)
    pos = jnp.asarray(np.tile(np.arange(n - T, n, dtype=np.int32), (B, 1)))
    kw = dict(scale=D**-0.5, window=window, causal=causal, q_prescaled=pre)
    want = _emulation(q, k, v, pos, rows, threads, **kw)
    got = ggml_flash_attention_native(q, k, v, pos, rows=jnp.int32(rows), threads=threads,
                                      variant=variant, **kw)  # fmt: skip
    np.testing.assert_array_equal(np.asarray(got), want)
