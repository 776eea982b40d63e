"""Multi-step decode (`BatchEngine(decode_steps=k)`: k decode steps per dispatch while
every slot decodes and nothing arrives) against the one-sequence dense path one step per
dispatch: greedy and seeded tokens equal, stop tokens end a row mid-dispatch, a request
arriving meanwhile and log-probability rows still come out right, and the pool is left
clean. The dense path's own multi-step (`Generation.decode_steps`) against one step."""

from __future__ import annotations

import pytest
from fixture_data import tiny_model_file

import llamay
from llamay.engine.api import Request
from llamay.engine.scheduler import BatchEngine
from llamay.sample import GREEDY, Sampler


@pytest.fixture(scope="module")
def tiny():
    return llamay.load(tiny_model_file("llama"))


@pytest.fixture(scope="module")
def engine(tiny):
    e = BatchEngine(tiny, slots=4, page_size=8, chunk=16, n_pages=96, decode_steps=4)
    yield e
    e.close()


def dense(m, prompt, n, sampler):
    """The one-sequence dense path, one decode step per dispatch (the reference)."""
    return list(m.generation(prompt, n, sampler, decode_steps=1))


def ids(h):
    return [ev.token_id for ev in h]


def test_multistep_greedy_equals_dense(tiny, engine):
    prompts = [list(range(300 + 7 * i, 300 + 7 * i + n)) for i, n in enumerate((3, 12, 5, 9))]
    want = [dense(tiny, p, 23, GREEDY) for p in prompts]
    before = engine.stats()["steps"]
    hs = [engine.submit(Request(p, 23, GREEDY)) for p in prompts]
    assert [ids(h) for h in hs] == want
    # one dispatch per decode step would be at least 23 (a prefill, then 22 decode steps
    # for any one of them); 4 per dispatch once all decode takes far fewer
    assert engine.stats()["steps"] - before < 23
    assert engine.stats()["pages_held"] == 0


def test_multistep_seeded_sampler_equals_dense(tiny, engine):
    s = Sampler(temperature=0.9, top_k=40, seed=5, repeat_penalty=1.1)
    p = list(range(800, 806))
    want = dense(tiny, p, 17, s)
    assert ids(engine.submit(Request(p, 17, s))) == want


def test_stop_token_mid_dispatch_ends_the_row(tiny, engine):
    p = list(range(400, 404))
    full = dense(tiny, p, 20, GREEDY)
    stop = full[9]  # the 10th token: inside a 4-step dispatch, not at its edge
    first = full.index(stop)
    h = engine.submit(Request(p, 20, GREEDY, stop_ids=frozenset({stop})))
    other = engine.submit(Request(list(range(900, 905)), 20, GREEDY))
    assert ids(h) == full[:first]
    assert h.finish_reason == "stop"
    assert ids(other) == dense(tiny, list(range(900, 905)), 20, GREEDY)
    assert engine.stats()["pages_held"] == 0


def test_arrival_and_logprobs_during_multistep(tiny, engine):
    a = list(range(600, 605))
    b = list(range(700, 703))
    ha = engine.submit(Request(a, 30, GREEDY))
    it = iter(ha)
    got = [next(it).token_id for _ in range(6)]  # decoding, multi-step by now
    hb = engine.submit(Request(b, 8, GREEDY, logprobs=2))
    evs = list(hb)
    got += [ev.token_id for ev in it]
    assert got == dense(tiny, a, 30, GREEDY)
    assert [ev.token_id for ev in evs] == dense(tiny, b, 8, GREEDY)
    assert all(ev.logprob is not None and len(ev.top_logprobs) == 2 for ev in evs)
    assert all(ev.top_logprobs[0][0] == ev.token_id for ev in evs)  # greedy: the best


@pytest.mark.parametrize(
    "sampler",
    [GREEDY, Sampler(temperature=0.9, top_k=40, seed=5, repeat_penalty=1.1)],
    ids=["greedy", "seeded"],
)
@pytest.mark.parametrize("n", [1, 2, 5, 13, 16])  # 4 per dispatch, then the rest one by one
def test_dense_multistep_equals_one_step(tiny, sampler, n):
    p = list(range(500, 509))
    got = tiny.generation(p, n, sampler, decode_steps=4)
    assert list(got) == dense(tiny, p, n, sampler)
    assert got.n_generated == n and got.finish_reason == "length"


def test_dense_multistep_stops_mid_dispatch(tiny):
    p = list(range(600, 605))
    full = dense(tiny, p, 20, GREEDY)
    stop = full[6]  # inside the second 4-token dispatch
    gen = tiny.generation(p, 20, GREEDY, decode_steps=4)
    gen.stop_ids = frozenset({stop})
    assert list(gen) == full[: full.index(stop)]
    assert gen.finish_reason == "stop"
