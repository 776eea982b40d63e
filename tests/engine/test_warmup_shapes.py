"""`llamay.engine.warmup.step_shapes` covers every step the engine really dispatches: requests
of many prompt lengths, alone and concurrently, run on an engine that records each step's
(rows, tokens, page-table width); every one must be among the shapes warmup compiles for
that many sequences and that length, and `warmup` compiles exactly those shapes."""

from __future__ import annotations

import pytest
from fixture_data import tiny_model_file

import llamay
from llamay.engine.api import Request
from llamay.engine.planning import table_width
from llamay.engine.scheduler import BatchEngine
from llamay.engine.warmup import StepShape, step_shapes, warmup
from llamay.errors import RequestError
from llamay.sample import GREEDY

pytestmark = pytest.mark.slow


class RecordingEngine(BatchEngine):
    def __init__(self, *args, **kwargs):
        self.seen: set[StepShape] = set()
        super().__init__(*args, **kwargs)

    def _dispatch(self, plan, tokens=None):
        R, T = plan.tokens.shape
        self.seen.add(StepShape(R, T, plan.table.shape[1]))
        return super()._dispatch(plan, tokens)


@pytest.fixture(scope="module")
def tiny():
    return llamay.load(tiny_model_file("llama"))


def test_every_dispatched_step_is_warmed_up(tiny):
    length = 270
    e = RecordingEngine(tiny, slots=4, page_size=16, chunk=64, n_pages=100)
    try:
        # alone: prefill chunks of every bucket; the last one decodes past 256 positions
        for n, new in ((3, 4), (17, 4), (40, 4), (65, 4), (250, 20)):
            list(e.submit(Request(list(range(100, 100 + n)), new, GREEDY)))
        together = [e.submit(Request(list(range(200, 200 + n)), 6, GREEDY)) for n in (5, 33, 70)]
        for h in together:
            list(h)
        covered = set(step_shapes(e, rows=(1, 2, 3), length=length))
        assert e.seen, "nothing dispatched"
        assert e.seen <= covered, sorted(e.seen - covered, key=str)
        assert {s.rows for s in e.seen} == {1, 2, 4}  # 3 concurrent rows: bucket 4
        assert {s.tokens for s in e.seen} == {1, 16, 32, 64}
        # longer chunks: page tables on the ladder (256 positions: no prompt reaches 384)
        assert {s.pages for s in e.seen if s.tokens > 16} == {16}
        # up to 16 tokens per row: where the native kernel reads the pool (its work bounded
        # by the rows' positions), one width, the whole context's; else the ladder, 256
        # positions, then 384 (the last request decodes past 256)
        short = {s.pages for s in e.seen if s.tokens <= 16}
        whole = table_width(-(-tiny.n_ctx // 16), 16)
        assert short == ({whole} if e._native_tables() else {16, 24})

        report = warmup(e, rows=(1,), length=64, prefill=[16])
        assert [s for s, _ in report.steps] == step_shapes(e, (1,), 64, [16])
    finally:
        e.close()


def test_prefill_buckets_past_the_chunk_are_refused(tiny):
    e = BatchEngine(tiny, slots=2, page_size=8, chunk=32, n_pages=40)
    try:
        with pytest.raises(RequestError, match="chunk"):
            step_shapes(e, prefill=[64])
    finally:
        e.close()
