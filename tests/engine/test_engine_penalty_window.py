"""Penalty windows span the whole context in both engines: with repeat_last_n=-1 a token
seen more than 512 positions back is still penalised, as the sorted-array restatement of
llama.cpp's chain (tests/sample/llamacpp_reference.py) says."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from fixture_data import tiny_model_file

import llamay
from llamay.engine.api import Request
from llamay.sample import Sampler

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sample"))
from llamacpp_reference import chain  # noqa: E402

PENALISED = Sampler(
    temperature=0.0,
    presence_penalty=50.0,
    repeat_last_n=-1,
    samplers=["penalties", "temperature"],
)
OLD_RING = 512  # the ring length the engines used to cap every window at


def _pick(logits, history) -> int:
    final = chain(logits, PENALISED, history)
    return max(final, key=final.get)


@pytest.fixture(scope="module")
def tiny():
    m = llamay.load(tiny_model_file("llama"))
    yield m
    m.close()


@pytest.fixture(scope="module")
def case(tiny):
    """A 700-token prompt whose best token under a 512-token window was seen only
    further back, so the full window picks a different token."""
    rng = np.random.default_rng(0)
    vocab = tiny.config.vocab
    ids = rng.permutation(np.arange(300, vocab))[:700].tolist()
    for _ in range(8):
        lg = tiny.logits(ids)[-1].astype(np.float64)
        capped = _pick(lg, ids[-OLD_RING:])
        if capped in ids[:-OLD_RING]:
            full = _pick(lg, ids)
            assert full != capped
            return ids, full
        ids[len(ids) - OLD_RING - 1 - _] = capped  # move it out of the short window
    pytest.fail("no prompt found whose capped window differs from the full one")


def test_dense_generation_penalises_the_whole_context(tiny, case):
    ids, want = case
    assert list(tiny.generation(ids, 1, PENALISED)) == [want]


def test_batch_engine_penalises_the_whole_context(tiny, case):
    ids, want = case
    h = tiny.engine.submit(Request(ids, 1, PENALISED, stop_ids=frozenset()))
    assert [ev.token_id for ev in h] == [want]
