"""The batch engine's paged steps through the native paged attention (the CPU default):
greedy decoding of several prompts of different lengths together equals, token for
token, the dense single-sequence path (`Model.generation`, dense KV, the reference
attention), on SmolLM2 and on the tiny Gemma 3 (sliding-window layers with their own
pool, decoding well past the window, prefill chunks through the kernel too). A spy
on the kernel's entry proves the steps were traced through it."""

from __future__ import annotations

import pytest
from fixture_data import tiny_model_file

import llamay
from llamay.engine.api import Request
from llamay.engine.paged_steps import paged_step
from llamay.engine.scheduler import BatchEngine
from llamay.kernels_cpu import build, plug
from llamay.sample import GREEDY


@pytest.fixture
def native_calls(monkeypatch):
    """The query lengths of the calls the native kernel took while tracing (paged_step's
    traces cleared first, so this test's steps are traced afresh)."""
    monkeypatch.delenv(build.ENV, raising=False)
    monkeypatch.delenv("LLAMAY_BACKEND", raising=False)
    monkeypatch.setenv("LLAMAY_NO_PROGRAM_CACHE", "1")  # traced, not read from disk
    taken = []
    real = plug.paged_attention_native

    def spy(q, *a, **kw):
        y = real(q, *a, **kw)
        if y is not None:
            taken.append(q.shape[1])
        return y

    monkeypatch.setattr(plug, "paged_attention_native", spy)
    paged_step.clear_cache()
    yield taken
    paged_step.clear_cache()


def _paged(m, ids, n, **engine):
    e = BatchEngine(m, **engine)
    try:
        hs = [e.submit(Request(i, n, GREEDY)) for i in ids]
        return [[ev.token_id for ev in h] for h in hs]
    finally:
        e.close()


PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "List three prime numbers greater than one hundred and explain how you checked them:",
]


@pytest.mark.model
def test_smollm2_paged_native_equals_dense(smollm2_path, native_calls):
    m = llamay.load(smollm2_path, n_ctx=512)
    ids = [m.tokenize(p, add_special=True, parse_special=True) for p in PROMPTS]
    n = 12
    want = [list(m.generation(i, n, GREEDY)) for i in ids]
    got = _paged(m, ids, n, slots=3, page_size=16, chunk=16)
    assert native_calls and 1 in native_calls and max(native_calls) > 1  # decode and prefill
    assert got == want


def test_tiny_gemma3_sliding_windows_paged_native_equals_dense(native_calls):
    m = llamay.load(tiny_model_file("gemma3"), n_ctx=512)
    cfg = m.config
    assert cfg.window == 8 and cfg.swa_pattern == 6  # local layers, their own pool
    ids = [[(7 * r + 3 * i) % 200 + 5 for i in range(n)] for r, n in enumerate((5, 13, 22))]
    n = 30  # past the window of 8 and several pages of 4
    want = [list(m.generation(i, n, GREEDY)) for i in ids]
    got = _paged(m, ids, n, slots=3, page_size=4, chunk=8, n_pages=64, local_pages=40)
    assert native_calls and 1 in native_calls and max(native_calls) > 1
    assert got == want


@pytest.mark.model
def test_gemma3_270m_paged_native_equals_dense(gemma3_path, native_calls):
    """The real Gemma 3 (head dim 256, one kv head, local and global layers in their own
    pools)."""
    m = llamay.load(gemma3_path, n_ctx=512)
    ids = [m.tokenize(p, add_special=True, parse_special=True) for p in PROMPTS[:2]]
    n = 10
    want = [list(m.generation(i, n, GREEDY)) for i in ids]
    got = _paged(m, ids, n, slots=2, page_size=16, chunk=16)
    assert native_calls and 1 in native_calls
    assert got == want
