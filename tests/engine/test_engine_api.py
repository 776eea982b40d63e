"""The engine interface over the tiny llama, for the batching engine and the serial test
reference alike: tokens equal direct generation, async iteration, cancellation, and
request errors that reach the consumer."""

from __future__ import annotations

import asyncio

import pytest
from fixture_data import tiny_model_file
from serial_engine import SerialEngine

import llamay
from llamay.engine.api import Request
from llamay.engine.scheduler import BatchEngine
from llamay.errors import RequestError
from llamay.sample import GREEDY


@pytest.fixture(scope="module", params=[BatchEngine, SerialEngine], ids=["batch", "serial"])
def engine(request):
    m = llamay.load(tiny_model_file("llama"))
    e = request.param(m)
    yield m, e
    e.close()


def test_tokens_equal_direct_generation(engine):
    m, e = engine
    prompt = list(range(500, 520))
    direct = list(m.generation(prompt, max_tokens=10, sampler=GREEDY))
    h = e.submit(Request(prompt, max_tokens=10, sampler=GREEDY))
    assert [ev.token_id for ev in h] == direct
    assert h.finish_reason == "length"
    assert (h.usage.prompt_tokens, h.usage.completion_tokens) == (20, 10)


def test_async_iteration_and_concurrent_submits(engine):
    m, e = engine

    async def collect(prompt):
        h = e.submit(Request(prompt, max_tokens=6, sampler=GREEDY))
        return [ev.token_id async for ev in h]

    async def main():
        return await asyncio.gather(collect([1000, 1001, 1002]), collect([2000, 2001]))

    a, b = asyncio.run(main())
    assert a == list(m.generation([1000, 1001, 1002], 6, GREEDY))
    assert b == list(m.generation([2000, 2001], 6, GREEDY))


def test_cancel_stops_the_request(engine):
    _, e = engine
    h = e.submit(Request(list(range(300, 310)), max_tokens=500, sampler=GREEDY))
    got = []
    for ev in h:
        got.append(ev.token_id)
        if len(got) == 3:
            e.cancel(h)
    assert h.finish_reason == "cancelled"
    assert len(got) < 500


def test_bad_request_raises_in_the_consumer_and_the_engine_survives(engine):
    _, e = engine
    h = e.submit(Request([], max_tokens=4, sampler=GREEDY))
    with pytest.raises(RequestError, match="empty"):
        list(h)
    assert h.finish_reason == "error"
    ok = e.submit(Request([5, 6, 7], max_tokens=2, sampler=GREEDY))
    assert len(list(ok)) == 2


def test_async_consumers_need_no_executor_threads():
    # 24 streams iterated on one loop whose executor refuses work: the engine's thread
    # wakes each consumer on the loop (a blocked executor thread per stream would queue
    # streams behind each other, and behind tokenisation, past cpu_count + 4 of them)
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from llamay.engine.api import Handle

    class Refusing(ThreadPoolExecutor):
        def submit(self, *a, **k):
            raise AssertionError("an executor thread was asked for")

    handles = [Handle(Request([1])) for _ in range(24)]

    def produce():
        for k in range(5):
            for h in handles:
                h._emit(k)
        for h in handles[:-1]:
            h._finish("length")
        handles[-1]._finish("error", RequestError("bad"))

    async def collect(h):
        return [ev.token_id async for ev in h]

    async def main():
        asyncio.get_running_loop().set_default_executor(Refusing())
        tasks = [asyncio.ensure_future(collect(h)) for h in handles]
        await asyncio.sleep(0.01)  # every consumer waiting before the first event
        threading.Thread(target=produce).start()
        return await asyncio.gather(*tasks, return_exceptions=True)

    got = asyncio.run(main())
    assert got[:-1] == [[0, 1, 2, 3, 4]] * 23
    assert isinstance(got[-1], RequestError)
