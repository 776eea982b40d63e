"""The done-when test of paging: on SmolLM2, several sequences of different lengths
decoded together in one batch through the paged pool give, token for token, what the
unpaged single-sequence reference path (`Model.generation`, dense KV) gives."""

from __future__ import annotations

import pytest

import llamay
from llamay.engine.api import Request
from llamay.engine.scheduler import BatchEngine
from llamay.sample import GREEDY

pytestmark = pytest.mark.model

PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "List three prime numbers greater than one hundred and explain how you checked them:",
    "Once upon a time, in a small village at the edge of a dark forest, there lived an old "
    "clockmaker who had never left home. One morning",
]


def test_paged_batch_equals_unpaged_reference(smollm2_path):
    m = llamay.load(smollm2_path, n_ctx=1024)
    ids = [m.tokenize(p, add_special=True, parse_special=True) for p in PROMPTS]
    assert len({len(i) for i in ids}) == len(ids)  # different lengths
    n = 16
    want = [list(m.generation(i, n, GREEDY)) for i in ids]
    e = BatchEngine(m, slots=4, page_size=16, chunk=64)
    try:
        hs = [e.submit(Request(i, n, GREEDY)) for i in ids]
        got = [[ev.token_id for ev in h] for h in hs]
    finally:
        e.close()
    assert got == want
