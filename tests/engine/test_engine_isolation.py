"""One bad request fails alone (issue 22): a victim stream in the same batch finishes
equal to its solo run on the dense path, while the attacker's request fails with a
clear error; only a failing step fails every request in flight. Cancelling frees a
request's pages mid-generation for the next one, and closing stops the engine within
seconds with every request ended."""

from __future__ import annotations

import time

import pytest
from fixture_data import tiny_model_file

import llamay
from llamay.engine import scheduler, worker
from llamay.engine.api import Request
from llamay.engine.scheduler import BatchEngine
from llamay.errors import LlamayError, RequestError
from llamay.sample import GREEDY, Sampler

VICTIM = list(range(500, 520))
N = 48  # the victim's tokens: the attacker arrives while it decodes


@pytest.fixture(scope="module")
def tiny():
    return llamay.load(tiny_model_file("llama"))


@pytest.fixture(scope="module")
def solo(tiny):
    return list(tiny.generation(VICTIM, N, GREEDY))


@pytest.fixture
def engine(tiny):
    e = BatchEngine(tiny, slots=4, page_size=8, chunk=16, n_pages=64)
    yield e
    e.close()


def forced(sampler: Sampler, **fields) -> Sampler:
    """A sampler that skipped validation (as one built by code that bypasses it)."""
    for k, v in fields.items():
        object.__setattr__(sampler, k, v)
    return sampler


class FailingMask:
    """A constraint whose mask computation breaks on its `at`-th call."""

    def __init__(self, vocab_size: int, at: int):
        self.vocab_size, self.at, self.calls = vocab_size, at, 0

    def mask(self):
        import numpy as np

        self.calls += 1
        if self.calls >= self.at:
            raise ValueError("the grammar engine broke")
        return np.full((self.vocab_size + 31) // 32, 0xFFFFFFFF, np.uint32)

    def advance(self, token: int) -> None:
        pass

    done = False
    accepting = False


def run_beside_victim(engine, attack: Request):
    """Start the victim, submit `attack` once the victim decodes, return both handles
    after both ended (the victim's tokens and the attack's error)."""
    victim = engine.submit(Request(VICTIM, N, GREEDY))
    events = iter(victim)
    got = [next(events).token_id, next(events).token_id]
    bad = engine.submit(attack)
    got += [ev.token_id for ev in events]
    with pytest.raises(Exception) as err:
        list(bad)
    return victim, got, bad, err.value


def test_sampler_fields_outside_int32_are_request_errors(tiny):
    for field in ("top_k", "repeat_last_n", "min_keep", "dry_allowed_length"):
        with pytest.raises(RequestError, match=field):
            Sampler(**{field: 2**40})
    with pytest.raises(RequestError, match="xtc_threshold"):
        Sampler(xtc_threshold="a")
    with pytest.raises(RequestError, match="top_k"):
        tiny.generate("hello", max_tokens=2, top_k=2**40)


@pytest.mark.parametrize(
    "attack, error, match",
    [
        # the vocabulary is only known to the engine: refused at admission
        (
            lambda v: Request([1, 2, 3], 4, Sampler(logit_bias={v + 5: 1.0})),
            RequestError,
            "logit_bias",
        ),
        # the int32 overflow, from a sampler that escaped validation
        (lambda v: Request([1, 2, 3], 4, forced(Sampler(), top_k=2**40)), RequestError, "top_k"),
        (lambda v: Request([1, 2, v + 7], 4, GREEDY), RequestError, "token id"),
        (lambda v: Request([1, 2**40], 4, GREEDY), RequestError, "token id"),
        # host work while the request runs: its constraint's mask breaks on the 3rd step
        (
            lambda v: Request([1, 2, 3], 8, GREEDY, constraint=FailingMask(v, 3)),
            ValueError,
            "grammar",
        ),
    ],
    ids=[
        "logit-bias-outside-vocab",
        "forced-top-k-2**40",
        "token-outside-vocab",
        "token-2**40",
        "constraint-mask-raises",
    ],
)
def test_an_attacker_fails_alone(tiny, solo, engine, attack, error, match):
    victim, got, bad, exc = run_beside_victim(engine, attack(tiny.config.vocab))
    assert isinstance(exc, error) and match in str(exc)
    assert bad.finish_reason == "error"
    assert got == solo and victim.finish_reason == "length"
    assert engine.stats()["pages_held"] == 0


def test_a_failure_in_the_parameter_refresh_fails_that_request_only(
    tiny, solo, engine, monkeypatch
):
    # the path: the batch's sampler arrays fail to build (OverflowError in the
    # refresh, which sent every request in flight to `_fail_all`)
    init = scheduler.SamplerState.init

    def init_or_overflow(samplers, *args, **kw):
        if any(s.seed == 666 for s in samplers):
            raise OverflowError("Python int too large to convert to C int32")
        return init(samplers, *args, **kw)

    monkeypatch.setattr(scheduler.SamplerState, "init", staticmethod(init_or_overflow))
    attack = Request([1, 2, 3], 4, Sampler(temperature=0.0, seed=666))
    victim, got, bad, exc = run_beside_victim(engine, attack)
    assert isinstance(exc, OverflowError) and bad.finish_reason == "error"
    assert got == solo and victim.finish_reason == "length"


def test_a_failing_step_fails_every_request_and_the_engine_goes_on(tiny, engine, monkeypatch):
    step, calls = worker.paged_step, []

    def breaks_once(*args):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("device lost")
        return step(*args)

    monkeypatch.setattr(worker, "paged_step", breaks_once)
    hs = [engine.submit(Request(p, 12, GREEDY)) for p in (VICTIM, [7, 8, 9])]
    for h in hs:
        with pytest.raises(RuntimeError, match="device lost"):
            list(h)
    assert engine.stats()["pages_held"] == 0
    after = engine.submit(Request([7, 8, 9], 4, GREEDY))
    assert [ev.token_id for ev in after] == list(tiny.generation([7, 8, 9], 4, GREEDY))


def test_cancel_mid_generation_frees_pages_for_the_next_request(tiny):
    # a pool of 40 pages: the first request reserves 39, the second needs 4 and waits
    e = BatchEngine(tiny, slots=2, page_size=8, chunk=16, n_pages=41)
    try:
        first = e.submit(Request(list(range(300, 310)), 300, GREEDY))
        events = iter(first)
        next(events), next(events)
        later = list(range(700, 720))
        second = e.submit(Request(later, 10, GREEDY))
        deadline = time.monotonic() + 10
        while e.stats()["queued"] != 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert e.stats()["queued"] == 1 and not first.done  # waiting for pages, not a slot
        e.cancel(first)
        assert [ev.token_id for ev in second] == list(tiny.generation(later, 10, GREEDY))
        assert first.finish_reason == "cancelled" and first.usage.completion_tokens < 300
        assert e.stats()["pages_held"] == 0
    finally:
        e.close()


def test_close_stops_within_seconds_and_ends_every_request(tiny):
    e = BatchEngine(tiny, slots=2, page_size=8, chunk=16, n_pages=200)
    # the steps below compiled first (a server warms its up at start): close waits for
    # the step in flight, and a step that compiles takes as long as compiling does
    for h in [e.submit(Request(list(range(600 + k, 630 + k)), 3, GREEDY)) for k in (0, 1)]:
        list(h)
    running = [e.submit(Request(list(range(400 + k, 430 + k)), 700, GREEDY)) for k in (0, 1)]
    waiting = e.submit(Request([5, 6, 7], 700, GREEDY))
    next(iter(running[0]))  # decoding
    t0 = time.monotonic()
    e.close()
    assert time.monotonic() - t0 < 5
    # the worker ended them all before close() returned
    assert [h.finish_reason for h in [*running, waiting]] == ["cancelled"] * 3
    with pytest.raises(LlamayError, match="closed"):
        e.submit(Request([1, 2], 2, GREEDY))
