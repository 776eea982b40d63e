"""Sliding-window models in the batch engine: their local layers keep a pool of their own
and release its pages behind the window (see `llamay.kv.pages`). Over the tiny gemma2
and gemma3 files (window 8, pages of 4 tokens), well past the window: batched decoding,
prefix-cache hits, fork, snapshot -> restore, cancellation and pool growth each equal
an independent dense run (greedy), and the pools' counts come back."""

from __future__ import annotations

import numpy as np
import pytest
from fixture_data import tiny_model_file

import llamay
from llamay.engine.api import Request
from llamay.engine.scheduler import BatchEngine
from llamay.sample import GREEDY

PS = 4


@pytest.fixture(scope="module")
def gemma3():
    return llamay.load(tiny_model_file("gemma3"), n_ctx=512)


@pytest.fixture(scope="module")
def engine(gemma3):
    e = BatchEngine(gemma3, slots=3, page_size=PS, chunk=8, n_pages=128, local_pages=40)
    yield e
    e.close()


def ids(h):
    return [ev.token_id for ev in h]


def held_local(e) -> int:
    return sum(1 for s in e.mgr.live.values() for p in s.local if p)


def tree_local(e) -> int:
    return len(e.mgr.tree.owned_local_pages())


def record_ensure(e) -> list[tuple[int, int, int, int]]:
    """(sequence, positions cached, global pages, local pages held) after each ensure."""
    seen = []
    ensure = e.mgr.ensure

    def spy(seq, n):
        ensure(seq, n)
        seen.append((seq.id, seq.n_cached, len(seq.pages), sum(1 for p in seq.local if p)))

    e.mgr.ensure = spy
    return seen


def test_pools_split_by_layer_kind(gemma3, engine):
    cfg = gemma3.config
    assert cfg.window == 8 and cfg.swa_pattern == 6 and cfg.n_layers == 6
    assert engine.kv.k.shape[0] == 1 and engine.kv.local_k.shape[0] == 5  # layer 5 global
    assert engine.kv.n_local_pages == 40 < engine.kv.n_pages


def test_batched_past_the_window_releases_local_pages(gemma3, engine):
    # past 256 positions the global tables widen (M = 128 pages); the local ones do not
    assert engine._local_width(1, 128) == engine._local_width(8, 128) == 64
    prompts = [list(range(100, 100 + n)) for n in (300, 5, 23)]
    want = [list(gemma3.generation(p, 12, GREEDY)) for p in prompts]
    seen = record_ensure(engine)
    try:
        hs = [engine.submit(Request(p, 12, GREEDY)) for p in prompts]
        assert [ids(h) for h in hs] == want
    finally:
        del engine.mgr.ensure
    decode = [s for s in seen if s[1] > 300]  # the long one's decode steps
    assert decode and max(s[2] for s in decode) == -(-311 // PS)  # the global pages grow
    # the local ones stay within the window: ceil(8/4) + 2 while decoding
    assert max(s[3] for s in decode) <= 8 // PS + 2
    bound = engine.mgr.local_bound(10_000)
    assert max(s[3] for s in seen) <= bound < 311 // PS
    assert held_local(engine) == 0 and engine.stats()["pages_held"] == 0
    assert engine.stats()["local_pages_used"] == tree_local(engine)
    engine.mgr.check()


def test_prefix_hit_past_the_window(gemma3, engine):
    prefix = list(range(1000, 1040))  # 10 full pages, 5 windows
    list(engine.submit(Request(prefix + [7], 2, GREEDY)))
    before = engine.stats()
    prompt = prefix + [8, 9, 10]
    h = engine.submit(Request(prompt, 4, GREEDY))
    assert ids(h) == list(gemma3.generation(prompt, 4, GREEDY))
    after = engine.stats()
    assert h.usage.cached_tokens == 40
    assert after["computed_tokens"] - before["computed_tokens"] == 3 + 3
    engine.mgr.check()


def test_prefix_hit_while_the_first_still_decodes(gemma3, engine):
    # the tree takes a share of the prompt's last window when its prompt is computed
    prefix = list(range(1100, 1132))
    first = engine.submit(Request(prefix + [7], 40, GREEDY))
    next(iter(first))  # its prompt is in; it decodes on, releasing that window
    prompt = prefix + [8, 9]
    h = engine.submit(Request(prompt, 4, GREEDY))
    assert ids(h) == list(gemma3.generation(prompt, 4, GREEDY))
    assert h.usage.cached_tokens == 32
    assert len(ids(first)) == 39
    engine.mgr.check()


def test_no_hit_where_the_window_was_released(gemma3, engine):
    # the rule: a cached prefix is reusable only up to a page boundary whose window
    # (the `window` positions before it) the local pool still holds. Mid-prompt
    # boundaries of a long prompt were slid past, so the prefix is recomputed.
    prefix = list(range(1200, 1240))
    list(engine.submit(Request(prefix + [7], 2, GREEDY)))
    prompt = prefix[:24] + [5, 6]
    h = engine.submit(Request(prompt, 4, GREEDY))
    assert ids(h) == list(gemma3.generation(prompt, 4, GREEDY))
    assert h.usage.cached_tokens == 0
    engine.mgr.check()


def test_fork_past_the_window_equals_independent_runs(gemma3, engine):
    prompt = list(range(2000, 2030))
    parent = engine.submit(Request(prompt, 5, GREEDY, keep=True))
    head = ids(parent)
    suffixes = [[], [11, 12], [13, 14, 15, 16, 17, 18, 19, 20, 21]]
    kids = engine.fork(parent, [Request(s, 9, GREEDY) for s in suffixes])
    for s, k in zip(suffixes, kids, strict=True):
        assert ids(k) == list(gemma3.generation(prompt + head + s, 9, GREEDY))
    assert kids[0].usage.cached_tokens == len(prompt) + len(head) - 1
    engine.release(parent)
    assert held_local(engine) == 0 and engine.stats()["pages_held"] == 0
    engine.mgr.check()


def test_snapshot_restore_past_the_window(gemma3, engine):
    prompt = list(range(3000, 3031))
    whole = list(gemma3.generation(prompt, 14, GREEDY))
    h = engine.submit(Request(prompt, 6, GREEDY, keep=True))
    first = ids(h)
    snap = engine.snapshot(h)
    engine.release(h)
    n = snap.n_cached
    local = engine.local_layers
    # the local layers keep only their window; the global one every position
    assert not snap.k[local, : n - 8 - 2 * PS].any()
    assert np.abs(snap.k[local, n - 8 :]).sum(axis=(2, 3)).all()
    assert np.abs(snap.k[~local]).sum(axis=(2, 3)).all()
    again = engine.restore(snap, Request([], 8, GREEDY))
    assert first + ids(again) == whole
    # and in an engine whose local pool starts smaller (it grows to take it)
    other = BatchEngine(gemma3, slots=1, page_size=PS, chunk=8, n_pages=64, local_pages=2)
    try:
        assert first + ids(other.restore(snap, Request([], 8, GREEDY))) == whole
        assert other.kv.n_local_pages == other.mgr.local.n_pages > 2
    finally:
        other.close()
    engine.mgr.check()


def test_cancel_returns_local_pages(engine):
    before = engine.stats()["local_pages_free"] + tree_local(engine)
    h = engine.submit(Request(list(range(300, 330)), 200, GREEDY))
    got = []
    for ev in h:
        got.append(ev.token_id)
        if len(got) == 3:
            engine.cancel(h)
    assert h.finish_reason == "cancelled" and held_local(engine) == 0
    assert engine.stats()["local_pages_free"] + tree_local(engine) == before
    engine.mgr.check()


def test_gemma2_batched_past_the_window():
    m = llamay.load(tiny_model_file("gemma2"), n_ctx=256)
    assert m.config.window == 8
    prompts = [list(range(100, 100 + n)) for n in (41, 6)]
    want = [list(m.generation(p, 10, GREEDY)) for p in prompts]
    e = BatchEngine(m, slots=2, page_size=PS, chunk=8, n_pages=64, local_pages=3)
    try:
        assert list(np.flatnonzero(e.local_layers)) == [0, 2] and e.kv.k.shape[0] == 2
        assert [ids(e.submit(Request(p, 10, GREEDY))) for p in prompts] == want
        assert e.kv.n_local_pages == e.mgr.local.n_pages > 3  # the local pool grew
        e.mgr.check()
    finally:
        e.close()


def test_models_without_windows_keep_one_pool():
    m = llamay.load(tiny_model_file("llama"))
    e = BatchEngine(m, slots=1, page_size=8, n_pages=8)
    try:
        assert e.kv.local_k is None and e.mgr.local is None
        assert "local_pages_total" not in e.stats()
    finally:
        e.close()


@pytest.mark.slow  # ggml-order attention compiles slowly: ~2 min on a busy 2-core CPU
def test_f16_split_pools_equal_dense():
    # llamacpp numerics: both pools f16, attention rounded as ggml does, paged or not
    m = llamay.load(tiny_model_file("gemma3"), numerics="llamacpp", n_ctx=512)
    prompts = [list(range(400, 400 + n)) for n in (270, 9)]
    want = [list(m.generation(p, 8, GREEDY)) for p in prompts]
    e = BatchEngine(m, slots=2, page_size=PS, chunk=16, n_pages=96, local_pages=24)
    try:
        assert e.kv.k.dtype == e.kv.local_k.dtype == "float16"
        hs = [e.submit(Request(p, 8, GREEDY)) for p in prompts]
        assert [ids(h) for h in hs] == want
    finally:
        e.close()
