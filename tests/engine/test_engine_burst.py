"""A burst of requests reaching an idle engine one by one (as a server's clients do)
starts as one batch: its prompts are prefilled together, every step runs over one row
count (one compiled program per kind), and the sampler seeding of the starting requests
compiles one program per power of two; the tokens equal the dense path's."""

from __future__ import annotations

import time

import numpy as np
import pytest
from fixture_data import tiny_model_file

import llamay
from llamay.engine.api import Request
from llamay.engine.paged_steps import _set_rows, set_rows
from llamay.engine.scheduler import BatchEngine
from llamay.sample import GREEDY, Sampler, SamplerState


@pytest.fixture(scope="module")
def tiny():
    return llamay.load(tiny_model_file("llama"))


def traced(e: BatchEngine) -> list[tuple[int, int, int]]:
    """(real rows, bucketed rows, tokens per row) of every step `e` dispatches."""
    steps, dispatch = [], e._dispatch

    def record(plan, tokens=None):
        steps.append((len(plan.idx), *plan.tokens.shape))
        return dispatch(plan, tokens)

    e._dispatch = record
    return steps


def burst(e: BatchEngine, prompts, max_tokens: int, gap_s: float = 0.002):
    hs = []
    for p in prompts:  # one by one, as requests reach a server
        hs.append(e.submit(Request(p, max_tokens, GREEDY)))
        time.sleep(gap_s)
    return [[ev.token_id for ev in h] for h in hs]


def test_a_burst_is_prefilled_together_over_one_row_count(tiny):
    chunk, n = 16, 8
    prompts = [list(range(300 + 40 * i, 300 + 40 * i + 20 + i)) for i in range(n)]
    want = [list(tiny.generation(p, 5, GREEDY)) for p in prompts]
    e = BatchEngine(tiny, slots=n, page_size=8, chunk=chunk, n_pages=64, gather_s=0.5)
    try:
        steps = traced(e)
        assert burst(e, prompts, 5) == want
    finally:
        e.close()
    prefill = [s for s in steps if s[2] > 1]
    decode = [s for s in steps if s[2] == 1]
    # every prompt (20-27 tokens) fed in ceil(27 / 16) steps, all 8 rows in each
    assert [s[0] for s in prefill] == [n] * -(-max(map(len, prompts)) // chunk)
    assert {s[1] for s in steps} == {n}  # one row count: one program per step kind
    assert len(decode) == 5 - 1  # the first token comes from the last prefill step


def test_starting_requests_seed_their_samplers_in_row_buckets(tiny):
    e = BatchEngine(tiny, slots=8, page_size=8, chunk=16, n_pages=64, gather_s=0.5)
    try:
        for n in (3, 5, 6):  # buckets 4 and 8
            prompts = [list(range(100 * k + n, 100 * k + n + 6)) for k in range(n)]
            burst(e, prompts, 2)
            before = _set_rows._cache_size()
        burst(e, [list(range(700 + 10 * k, 706 + 10 * k)) for k in range(7)], 2)
        assert _set_rows._cache_size() == before  # 7 rows: bucket 8, compiled already
    finally:
        e.close()


def test_set_rows_drops_the_padding_rows():
    samplers = [Sampler(temperature=0.5, seed=s) for s in range(4)]
    state = SamplerState.init(samplers, history=8)
    new = SamplerState.init([Sampler(seed=99), Sampler(seed=98)], history=8)
    got = set_rows(state, [2], new)  # one row of two: the second is padding
    keys, want = np.asarray(got.keys), np.array(state.keys)
    want[2] = np.asarray(new.keys)[0]
    assert (keys == want).all()
