"""A fork or restore the engine refuses (here: a prompt past the context) leaves the KV
pool as it found it: the child's pages go back, and no earlier child keeps running."""

from __future__ import annotations

import pytest
from fixture_data import tiny_model_file

import llamay
from llamay.engine.api import Request
from llamay.engine.scheduler import BatchEngine
from llamay.errors import ContextOverflowError
from llamay.sample import GREEDY

N_CTX = 64


@pytest.fixture(scope="module")
def engine():
    m = llamay.load(tiny_model_file("llama"), n_ctx=N_CTX)
    e = BatchEngine(m, slots=2, page_size=8, chunk=16, n_pages=60)  # room past the context
    yield e
    e.close()


@pytest.fixture(scope="module")
def parent(engine):
    h = engine.submit(Request(list(range(300, 320)), 3, GREEDY, keep=True))
    assert len(list(h)) == 3
    return h


def used(engine) -> tuple[int, int]:
    s = engine.stats()
    return s["pages_used"], s["pages_held"]


def test_fork_past_the_context_frees_its_pages(engine, parent):
    before = used(engine)
    too_long = Request(list(range(500, 500 + N_CTX)), 4, GREEDY)
    with pytest.raises(ContextOverflowError):
        engine.fork(parent, [too_long])
    assert used(engine) == before
    # a good child before the bad one is undone too: the caller got no handle for it
    with pytest.raises(ContextOverflowError):
        engine.fork(parent, [Request([7], 4, GREEDY), too_long])
    assert used(engine) == before and engine.stats()["queued"] == 0
    (ok,) = engine.fork(parent, [Request([7], 4, GREEDY)])  # the engine still forks
    assert len(list(ok)) == 4


def test_restore_past_the_context_frees_its_pages(engine, parent):
    snap = engine.snapshot(parent)
    before = used(engine)
    with pytest.raises(ContextOverflowError):
        engine.restore(snap, Request(list(range(500, 500 + N_CTX)), 4, GREEDY))
    assert used(engine) == before
