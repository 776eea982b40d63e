"""`Model.generate` runs on the model's BatchEngine: its text equals the unpaged
reference path (`Model.generation`, dense KV) with every sampler feature, closing a
stream cancels the request, concurrent callers share the batch (up to `use_parallel`
slots), the pool grows for a request longer than it started with; token-id prompts are
taken as they are, and `stop` strings end the text before them as llama-server's `stop`
does (the reference's text cut at the first one, the request's slot freed)."""

from __future__ import annotations

import threading

import pytest
from fixture_data import tiny_model_file

import llamay
from llamay.engine.api import Request
from llamay.engine.scheduler import BatchEngine
from llamay.sample import GREEDY, Sampler


@pytest.fixture(scope="module")
def tiny():
    m = llamay.load(tiny_model_file("llama"))
    yield m
    m.close()


def reference(m, prompt: str, n: int, **kw) -> str:
    ids = m.tokenize(prompt, add_special=True, parse_special=True)
    return m.detokenize(list(m.generation(ids, n, Sampler(**kw))))


@pytest.mark.parametrize(
    "kw",
    [
        dict(temperature=0.0),
        dict(temperature=0.9, seed=7),
        dict(temperature=0.8, top_k=5, repeat_penalty=1.3, seed=3),
        dict(temperature=0.0, dry_multiplier=0.8, dry_allowed_length=1),
    ],
    ids=["greedy", "seeded", "penalties", "dry"],
)
def test_generate_equals_the_reference_path(tiny, kw):
    prompt = "Once upon a time, the"
    want = reference(tiny, prompt, 12, **kw)
    assert tiny.generate(prompt, max_tokens=12, **kw) == want
    assert "".join(tiny.generate(prompt, max_tokens=12, stream=True, **kw)) == want


def test_closing_a_stream_cancels_it(tiny):
    stream = tiny.generate("A long story:", max_tokens=500, temperature=0.0, stream=True)
    next(stream)
    stream.close()
    # the cancel is handled before the worker's next step, so before this request's
    list(tiny.engine.submit(Request([1, 2, 3], 1, GREEDY)))
    stats = tiny.engine.stats()
    assert stats["active"] == 0 and stats["pages_held"] == 0


def concurrently(m, prompts: list[str], n: int) -> list[str]:
    """`m.generate` of each prompt (n tokens, greedy), each call from its own thread."""
    got = [None] * len(prompts)

    def run(i):
        got[i] = m.generate(prompts[i], max_tokens=n, temperature=0.0)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got


def test_concurrent_callers_share_the_engine(tiny):
    prompts = ["The cat", "A dog and a", "Numbers: 1, 2,"]
    want = [reference(tiny, p, 8, temperature=0.0) for p in prompts]
    assert concurrently(tiny, prompts, 8) == want


def test_token_ids_prompt(tiny):
    ids = tiny.tokenize("Once upon a time, the", add_special=True, parse_special=True)
    want = reference(tiny, "Once upon a time, the", 10, temperature=0.0)
    assert tiny.generate(ids, max_tokens=10, temperature=0.0) == want
    with pytest.raises(llamay.errors.RequestError, match="empty"):
        tiny.generate([], max_tokens=4)


def test_stop_strings_cut_the_text(tiny):
    prompt = "Numbers: 1, 2,"
    full = reference(tiny, prompt, 24, temperature=0.0)
    assert len(full) > 8
    for stop in ([full[5:7]], [full[6:9], full[3:5]], [full[-2:]], ["\x00never"]):
        at = min((full.find(s) for s in stop if s in full), default=len(full))
        want = full[:at]
        assert tiny.generate(prompt, max_tokens=24, temperature=0.0, stop=stop) == want
        streamed = tiny.generate(prompt, max_tokens=24, temperature=0.0, stop=stop, stream=True)
        assert "".join(streamed) == want
    stats = tiny.engine.stats()
    assert stats["active"] == 0 and stats["pages_held"] == 0  # the stopped ones freed


def test_use_parallel_sizes_the_engine(tiny):
    prompts = [f"Item {i}:" for i in range(6)]
    want = [reference(tiny, p, 6, temperature=0.0) for p in prompts]
    try:
        assert tiny.use_parallel(6) is tiny and len(tiny.engine.slots) == 6
        assert concurrently(tiny, prompts, 6) == want
        with pytest.raises(llamay.errors.RequestError, match="parallel"):
            tiny.use_parallel(0)
    finally:
        tiny.use_parallel(4)


def test_close_stops_the_engine_and_the_model_stays_usable():
    m = llamay.load(tiny_model_file("llama"))
    first = m.generate("Hello", max_tokens=4, temperature=0.0)
    engine = m.engine
    m.close()
    assert engine._closed and not engine._worker.is_alive()
    with m:
        assert m.generate("Hello", max_tokens=4, temperature=0.0) == first
        assert m.engine is not engine
    assert m._engine is None


def test_the_pool_grows_for_a_long_request(tiny):
    e = BatchEngine(tiny, slots=2, page_size=8, n_pages=3, max_pages=20)  # 16 -> 152 tokens
    try:
        prompt = list(range(100, 160))
        h = e.submit(Request(prompt, 20, GREEDY))
        assert [ev.token_id for ev in h] == list(tiny.generation(prompt, 20, GREEDY))
        assert e.kv.n_pages == e.mgr.alloc.n_pages > 3
        too_long = e.submit(Request(list(range(200)), 4, GREEDY))
        with pytest.raises(llamay.errors.KVCacheFullError, match="pool has 19"):
            list(too_long)
        e.mgr.check()
    finally:
        e.close()


DECODERS = ["gemma2", "gemma3", "olmo2", "phi3", "qwen2", "qwen3", "qwen3moe", "starcoder2"]


@pytest.mark.parametrize("family", DECODERS)
def test_every_family_generates_as_the_reference(family):
    m = llamay.load(tiny_model_file(family))
    try:
        prompt = "Some words to continue, long enough to pass a small window:"
        assert m.generate(prompt, max_tokens=10, temperature=0.0) == reference(
            m, prompt, 10, temperature=0.0
        )
    finally:
        m.close()


def test_an_encoder_does_not_generate():
    m = llamay.load(tiny_model_file("bert"))
    with pytest.raises(llamay.errors.RequestError, match="encoder"):
        m.generate("hello", max_tokens=2)
