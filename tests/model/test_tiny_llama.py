"""The tiny random llama of tests/fixtures/tiny against its float64 reference and llama.cpp."""

from __future__ import annotations

import numpy as np
import pytest
from fixture_data import tiny_model_file

import llamay
from llamay.sample import GREEDY


@pytest.fixture(scope="module")
def tiny_llama(fixtures_dir):
    m = llamay.load(tiny_model_file("llama"))
    exact = np.load(fixtures_dir / "tiny" / "llama.exact.npz")
    ref = np.load(fixtures_dir / "tiny" / "llama.llamacpp.npz")
    return m, exact, ref


def gathered(logits, ids):
    return np.take_along_axis(logits, ids, axis=1)


@pytest.mark.parametrize("seq", ["a", "b"])
def test_logits_match_float64_reference(tiny_llama, seq):
    m, exact, _ = tiny_llama
    logits = m.logits(exact[f"tokens_{seq}"])
    probe = exact["probe_ids"]
    np.testing.assert_allclose(logits[:, probe], exact[f"probe_logits_{seq}"], atol=1e-3)
    top = exact[f"top_ids_{seq}"]
    np.testing.assert_allclose(gathered(logits, top), exact[f"top_logits_{seq}"], atol=1e-3)
    lse = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
    np.testing.assert_allclose(lse, exact[f"lse_{seq}"], atol=1e-3)


@pytest.mark.parametrize("seq", ["a", "b"])
def test_own_greedy_matches_float64_reference(tiny_llama, seq):
    m, exact, _ = tiny_llama
    gen = m.generation(exact[f"tokens_{seq}"].tolist(), max_tokens=16, sampler=GREEDY)
    assert list(gen) == exact[f"own_greedy_{seq}"].tolist()


@pytest.mark.parametrize("seq", ["a", "b"])
def test_teacher_forced_rows_match_float64_reference(tiny_llama, seq):
    """The reference's greedy rows come from feeding tokens + llama.cpp's g_0..g_{j-1}."""
    m, exact, ref = tiny_llama
    toks = exact[f"tokens_{seq}"].tolist()
    greedy = ref[f"greedy_{seq}"].tolist()
    logits = m.logits(toks + greedy[:15])
    rows = logits[len(toks) - 1 :]
    probe = exact["probe_ids"]
    np.testing.assert_allclose(rows[:, probe], exact[f"greedy_probe_logits_{seq}"], atol=1e-3)


@pytest.mark.parametrize("seq", ["a", "b"])
def test_close_to_llamacpp(tiny_llama, seq):
    """llama.cpp rounds activations to int8 blocks: within the README's tolerance (0.5),
    and the same top-1 wherever llama.cpp's top-2 gap exceeds it."""
    m, _, ref = tiny_llama
    logits = m.logits(ref[f"tokens_{seq}"])
    top = ref[f"top_ids_{seq}"]
    np.testing.assert_allclose(gathered(logits, top), ref[f"top_logits_{seq}"], atol=0.5)
    gap = ref[f"top_logits_{seq}"][:, 0] - ref[f"top_logits_{seq}"][:, 1]
    sure = gap > 0.5
    assert (logits.argmax(1)[sure] == top[sure, 0]).all()


def test_long_prompt_prefills_in_chunks_with_the_same_greedy(tiny_llama):
    """A prompt longer than PREFILL_CHUNK prefills chunk by chunk (then a bucketed tail),
    each against the cache the earlier ones wrote: greedy generation equals the argmax of
    the whole sequence's logits in one forward pass (`logits`, held to the float64
    reference above), at every generated position."""
    from llamay.engine import generate

    m, _, _ = tiny_llama
    n = 2 * generate.PREFILL_CHUNK + 77  # two whole chunks and a tail
    ids = np.random.default_rng(5).integers(100, 40000, n).tolist()
    got = list(m.generation(ids, max_tokens=6, sampler=GREEDY))
    assert len(got) == 6
    want = m.logits(ids + got[:-1])[n - 1 :].argmax(-1)
    assert got == want.tolist()
