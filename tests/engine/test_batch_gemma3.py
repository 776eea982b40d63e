"""Gemma 3's sliding-window layers through the paged pool, past the window: the pool
keeps every page of a sequence (see `llamay.kv.pages` on why nothing is released
early), and the local layers' mask hides the positions outside the window, so a
prompt longer than the window, batched beside a short one, decodes as the unpaged
reference path does (greedy)."""

from __future__ import annotations

import pytest

import llamay
from llamay.engine.api import Request
from llamay.engine.scheduler import BatchEngine
from llamay.sample import GREEDY

pytestmark = pytest.mark.model


def test_gemma3_past_the_window_equals_the_reference(gemma3_path):
    m = llamay.load(gemma3_path, n_ctx=1024)
    window = m.config.window
    assert 0 < window < 1024 and m.config.swa_pattern > 1
    text = "The river ran past the old mill, and the miller counted the sacks. " * 60
    long = m.tokenize(text, add_special=True, parse_special=True)[: window + 40]
    short = m.tokenize("The capital of France is", add_special=True, parse_special=True)
    n = 12  # the long one decodes ever further past the window
    want = [list(m.generation(p, n, GREEDY)) for p in (long, short)]
    e = BatchEngine(m, slots=2, page_size=16, chunk=128)
    try:
        hs = [e.submit(Request(p, n, GREEDY)) for p in (long, short)]
        assert [[ev.token_id for ev in h] for h in hs] == want
    finally:
        e.close()
