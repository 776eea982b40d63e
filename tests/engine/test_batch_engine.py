"""The continuous-batching engine over the tiny llama: batched paged greedy equals the
dense single-sequence path, prefix-cache hits skip compute, cancellation frees pages,
admission errors, fork, and snapshot -> restore in another process."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from fixture_data import tiny_model_file

import llamay
from llamay.engine.api import Request
from llamay.engine.scheduler import BatchEngine
from llamay.errors import KVCacheFullError, RequestError
from llamay.kv.snapshot import Snapshot
from llamay.sample import GREEDY


@pytest.fixture(scope="module")
def tiny():
    return llamay.load(tiny_model_file("llama"))


@pytest.fixture(scope="module")
def engine(tiny):
    e = BatchEngine(tiny, slots=3, page_size=8, chunk=16, n_pages=96)
    yield e
    e.close()


def ids(e, h):
    return [ev.token_id for ev in h]


def test_batched_paged_greedy_equals_dense(tiny, engine):
    # 5 requests over 3 slots: some wait, and prefill chunks run beside decoding.
    prompts = [list(range(500, 500 + n)) for n in (3, 17, 40, 9, 25)]
    want = [list(tiny.generation(p, 10, GREEDY)) for p in prompts]
    hs = [engine.submit(Request(p, 10, GREEDY)) for p in prompts]
    assert [ids(engine, h) for h in hs] == want
    assert all(h.finish_reason == "length" for h in hs)
    assert engine.stats()["pages_held"] == 0


def test_prefix_cache_hit_skips_the_prefix(tiny, engine):
    prefix = list(range(1000, 1040))  # 5 full pages
    list(engine.submit(Request(prefix + [7], 2, GREEDY)))
    before = engine.stats()
    prompt = prefix + [8, 9, 10]
    h = engine.submit(Request(prompt, 4, GREEDY))
    assert ids(engine, h) == list(tiny.generation(prompt, 4, GREEDY))
    after = engine.stats()
    assert h.usage.cached_tokens == 40
    # only the 3 new prompt tokens and 3 decode tokens went through the model
    assert after["computed_tokens"] - before["computed_tokens"] == 3 + 3
    assert after["cache_hit_tokens"] - before["cache_hit_tokens"] == 40


def test_cancel_frees_pages_at_once(engine):
    h = engine.submit(Request(list(range(300, 330)), 500, GREEDY))
    got = []
    for ev in h:
        got.append(ev.token_id)
        if len(got) == 2:
            engine.cancel(h)
    assert h.finish_reason == "cancelled" and len(got) < 10
    assert engine.stats()["pages_held"] == 0


def test_admission_errors(tiny):
    e = BatchEngine(tiny, slots=2, page_size=8, n_pages=5)  # 4 pages = 32 tokens
    try:
        h = e.submit(Request(list(range(40)), 4, GREEDY))
        with pytest.raises(KVCacheFullError, match="pool"):
            list(h)
        with pytest.raises(RequestError, match="empty"):
            list(e.submit(Request([], 4, GREEDY)))
        # two that fit one at a time: the second waits for the first's pages
        a = e.submit(Request(list(range(600, 620)), 4, GREEDY))
        b = e.submit(Request(list(range(700, 720)), 4, GREEDY))
        assert ids(e, a) == list(tiny.generation(list(range(600, 620)), 4, GREEDY))
        assert ids(e, b) == list(tiny.generation(list(range(700, 720)), 4, GREEDY))
    finally:
        e.close()


def test_fork_children_equal_independent_runs(tiny, engine):
    prompt = list(range(2000, 2013))
    parent = engine.submit(Request(prompt, 5, GREEDY, keep=True))
    head = ids(engine, parent)
    suffixes = [[], [11, 12], [13, 14, 15, 16, 17, 18, 19, 20, 21]]
    kids = engine.fork(parent, [Request(s, 6, GREEDY) for s in suffixes])
    for s, k in zip(suffixes, kids, strict=True):
        assert ids(engine, k) == list(tiny.generation(prompt + head + s, 6, GREEDY))
    assert kids[0].usage.cached_tokens == len(prompt) + len(head) - 1
    engine.release(parent)
    assert engine.stats()["pages_held"] == 0


def test_snapshot_restore_in_a_new_process(tiny, engine, tmp_path):
    prompt = list(range(3000, 3021))
    whole = list(tiny.generation(prompt, 12, GREEDY))
    h = engine.submit(Request(prompt, 6, GREEDY, keep=True))
    first = ids(engine, h)
    path = engine.snapshot(h).save(tmp_path)
    engine.release(h)
    assert Snapshot.load(path).tokens == prompt + first
    code = textwrap.dedent(f"""
        import llamay
        from llamay.engine.api import Request
        from llamay.engine.scheduler import BatchEngine
        from llamay.kv.snapshot import Snapshot
        from llamay.sample import GREEDY
        m = llamay.load({str(tiny_model_file("llama"))!r})
        e = BatchEngine(m, slots=2, page_size=8, n_pages=32)
        h = e.restore(Snapshot.load({str(path)!r}), Request([], 6, GREEDY))
        print([ev.token_id for ev in h])
        e.close()
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert first + eval(out.stdout.strip().splitlines()[-1]) == whole


def test_f16_cache_batched_equals_dense():
    # llamacpp numerics: an f16 cache, rounded in attention as ggml does, paged or not.
    m = llamay.load(tiny_model_file("llama"), numerics="llamacpp")
    prompts = [list(range(800, 800 + n)) for n in (5, 21)]
    want = [list(m.generation(p, 8, GREEDY)) for p in prompts]
    e = BatchEngine(m, slots=2, page_size=8, chunk=32, n_pages=16)
    try:
        assert e.kv.k.dtype == "float16"
        assert [ids(e, e.submit(Request(p, 8, GREEDY))) for p in prompts] == want
    finally:
        e.close()


def test_new_lengths_inside_a_bucket_do_not_recompile(engine):
    from llamay.engine.paged_steps import paged_step

    list(engine.submit(Request(list(range(900, 912)), 3, GREEDY)))
    size = paged_step._cache_size()
    list(engine.submit(Request(list(range(950, 964)), 5, GREEDY)))
    assert paged_step._cache_size() == size


def test_constrained_rows_beside_free_ones(tiny, engine):
    ids_ = tiny.tokenize("Code:", add_special=True, parse_special=True)
    regex = "[0-9]{3}-[a-z]{2}"
    want = list(tiny.generation(ids_, 16, GREEDY, tiny.constraint(regex=regex)))
    free = engine.submit(Request(list(range(40, 60)), 6, GREEDY))
    h = engine.submit(Request(ids_, 16, GREEDY, constraint=tiny.constraint(regex=regex)))
    assert ids(engine, h) == want and h.finish_reason == "stop"
    assert ids(engine, free) == list(tiny.generation(list(range(40, 60)), 6, GREEDY))
    out = tiny.detokenize(want)
    assert len(out) == 6 and out[3] == "-"


def test_per_slot_seeded_samplers_equal_dense(tiny, engine):
    from llamay.sample import Sampler

    prompts = [list(range(1500, 1507)), list(range(1600, 1619))]
    samplers = [Sampler(temperature=0.9, seed=1), Sampler(temperature=0.7, top_k=5, seed=2)]
    want = [list(tiny.generation(p, 8, s)) for p, s in zip(prompts, samplers, strict=True)]
    hs = [engine.submit(Request(p, 8, s)) for p, s in zip(prompts, samplers, strict=True)]
    assert [ids(engine, h) for h in hs] == want


def test_sliding_window_family_batched_equals_dense():
    # gemma3's tiny file: window 8, five local layers per global one; prompts past it.
    m = llamay.load(tiny_model_file("gemma3"))
    prompts = [list(range(100, 105)), list(range(100, 130))]
    want = [list(m.generation(p, 8, GREEDY)) for p in prompts]
    e = BatchEngine(m, slots=2, page_size=8, chunk=32, n_pages=32)
    try:
        assert [ids(e, e.submit(Request(p, 8, GREEDY))) for p in prompts] == want
    finally:
        e.close()
