"""A prefill-only request (max_tokens=0, keep=True) computes its prompt's KV, emits
nothing, and keeps the KV: a fork continues from it computing only its new tokens, with
the tokens an independent run of the whole text gives."""

from __future__ import annotations

import pytest
from fixture_data import tiny_model_file

import llamay
from llamay.engine.api import Request
from llamay.engine.scheduler import BatchEngine
from llamay.sample import GREEDY


@pytest.fixture(scope="module")
def tiny():
    return llamay.load(tiny_model_file("llama"))


def test_prefill_only_keeps_the_prompt_kv(tiny):
    e = BatchEngine(tiny, slots=2, page_size=8, chunk=16, n_pages=40, prefix_cache=False)
    try:
        prompt = list(range(600, 630))
        h = e.submit(Request(prompt, 0, GREEDY, keep=True))
        assert list(h) == [] and h.finish_reason == "length"
        computed = e.stats()["computed_tokens"]
        assert computed == len(prompt)
        assert e.snapshot(h).tokens == prompt
        (kid,) = e.fork(h, [Request([5, 6], 4, GREEDY)])
        assert [ev.token_id for ev in kid] == list(tiny.generation(prompt + [5, 6], 4, GREEDY))
        # the fork fed only its own two tokens and its decode steps
        assert e.stats()["computed_tokens"] - computed == 2 + 3
        e.release(h)
        # without keep, max_tokens=0 still ends at once, computing nothing
        h = e.submit(Request(prompt, 0, GREEDY))
        assert list(h) == [] and e.stats()["computed_tokens"] - computed == 5
    finally:
        e.close()
