"""Streamed log-probabilities: each TokenEvent carries the model's log-probability of its
token and, when asked, the top N alternatives, equal (to float tolerance) to a float64
log-softmax of `Model.logits` over prompt + generated tokens. Requests asking different
N (or none) share one batch."""

from __future__ import annotations

import numpy as np
import pytest
from fixture_data import tiny_model_file
from serial_engine import SerialEngine

import llamay
from llamay.engine.api import Request
from llamay.engine.scheduler import BatchEngine
from llamay.errors import RequestError
from llamay.sample import Sampler

SAMPLER = Sampler(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7)


@pytest.fixture(scope="module")
def tiny():
    return llamay.load(tiny_model_file("llama"))


@pytest.fixture(scope="module")
def engine(tiny):
    e = BatchEngine(tiny, slots=4, page_size=8, chunk=16, n_pages=64)
    yield e
    e.close()


def _log_softmax64(rows):
    rows = np.asarray(rows, np.float64)
    rows = rows - rows.max(-1, keepdims=True)
    return rows - np.log(np.exp(rows).sum(-1, keepdims=True))


def check_events(tiny, prompt, events, n):
    toks = [ev.token_id for ev in events]
    want = _log_softmax64(tiny.logits(prompt + toks)[len(prompt) - 1 : -1])
    for ev, row in zip(events, want, strict=True):
        if n is None:
            assert ev.logprob is None and ev.top_logprobs == ()
            continue
        assert ev.logprob == pytest.approx(row[ev.token_id], abs=1e-4)
        assert len(ev.top_logprobs) == n
        best = np.argsort(-row, kind="stable")[:n]
        assert [i for i, _ in ev.top_logprobs] == best.tolist()
        np.testing.assert_allclose([lp for _, lp in ev.top_logprobs], row[best], atol=1e-4)


def test_different_widths_share_a_batch_and_match_the_logits(tiny, engine):
    prompts = [list(range(400 + 10 * k, 409 + 10 * k)) for k in range(4)]
    asks = [None, 0, 3, 20]
    before = engine.stats()["steps"]
    hs = [
        engine.submit(Request(p, 8, SAMPLER, stop_ids=frozenset(), logprobs=n))
        for p, n in zip(prompts, asks, strict=True)
    ]
    events = [list(h) for h in hs]
    # one prefill and 7 decode steps each: sharing the batch takes far fewer than 32
    assert engine.stats()["steps"] - before < 16
    for p, evs, n in zip(prompts, events, asks, strict=True):
        assert len(evs) == 8
        check_events(tiny, p, evs, n)


def test_sampler_n_probs_and_a_wider_request(tiny, engine):
    prompt = list(range(700, 730))
    h = engine.submit(Request(prompt, 5, Sampler(temperature=0.0, n_probs=30)))
    check_events(tiny, prompt, list(h), 30)
    # afterwards a request without logprobs runs at width 0 again
    h = engine.submit(Request(prompt, 3, Sampler(temperature=0.0)))
    check_events(tiny, prompt, list(h), None)


def test_serial_engine_events_carry_the_same(tiny):
    e = SerialEngine(tiny)
    try:
        prompt = list(range(900, 912))
        h = e.submit(Request(prompt, 4, SAMPLER, stop_ids=frozenset(), logprobs=2))
        check_events(tiny, prompt, list(h), 2)
    finally:
        e.close()


def test_bad_width_is_a_request_error(engine):
    h = engine.submit(Request([1, 2, 3], 2, logprobs=65))
    with pytest.raises(RequestError, match="logprobs"):
        list(h)
