"""Gemma 3 270M's sliding-window layers through the paged pool, well past the window:
two prompts past the 512-token window and a short one decode together as the unpaged
reference path does (greedy), while the local layers' pool (`llamay.kv.pages`) keeps
each sequence to its window's pages and the global pool grows with the sequence."""

from __future__ import annotations

import pytest

import llamay
from llamay.engine.api import Request
from llamay.engine.scheduler import BatchEngine
from llamay.sample import GREEDY

pytestmark = pytest.mark.model

PS = 16


def test_gemma3_past_the_window_equals_the_reference(gemma3_path):
    m = llamay.load(gemma3_path, n_ctx=1024)
    window = m.config.window
    assert window == 512 and m.config.swa_pattern == 6 and m.config.n_layers == 18
    text = "The river ran past the old mill, and the miller counted the sacks. " * 60
    toks = m.tokenize(text, add_special=True, parse_special=True)
    short = m.tokenize("The capital of France is", add_special=True, parse_special=True)
    prompts = [toks[: window + 40], short, toks[: window + 200]]
    n = 16  # the long ones decode ever further past the window
    want = [list(m.generation(p, n, GREEDY)) for p in prompts]
    # local pool: room for the three at once (two windows and a short one), no more
    e = BatchEngine(m, slots=3, page_size=PS, chunk=128, local_pages=2 * 42 + 2 + 1)
    seen = []
    ensure = e.mgr.ensure

    def spy(seq, upto):
        ensure(seq, upto)
        seen.append((seq.n_cached, upto, len(seq.pages), sum(1 for p in seq.local if p)))

    e.mgr.ensure = spy
    try:
        hs = [e.submit(Request(p, n, GREEDY)) for p in prompts]
        assert [[ev.token_id for ev in h] for h in hs] == want
        assert e.kv.n_local_pages == 87  # it never had to grow
        assert e.kv.k.shape[0] == 3 and e.kv.local_k.shape[0] == 15
        # 3 global layers x 193 pages + 15 local x 87, against 18 x 193 in one pool
        assert e.kv.k.size + e.kv.local_k.size < 0.55 * 18 * 193 * PS * e.kv.k[0, 0, 0].size
    finally:
        e.close()
    decode = [s for s in seen if s[1] - s[0] <= 2]
    prefill = [s for s in seen if s[1] - s[0] > 2]
    longest = len(prompts[2]) + n - 1
    assert max(s[2] for s in seen) == -(-longest // PS)  # the global pages grow (46)
    assert max(s[3] for s in decode) <= -(-window // PS) + 2  # 34 local pages
    assert max(s[3] for s in prefill) <= e.mgr.local_bound(longest) == 42
    assert any(s[0] > window for s in decode)
