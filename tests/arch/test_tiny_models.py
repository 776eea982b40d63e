"""Every decoder family's tiny random model against its float64 reference (exact
numerics: ~1e-3) and against llama.cpp (within the README's tolerances, top-1 equal
where llama.cpp's top-2 gap exceeds them). See tests/fixtures/tiny/README.md."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import LLAMACPP_TOL, TINY_DECODERS, Tiny

from llamay.sample import GREEDY

EXACT_TOL = 1e-3  # also for the GELU families: llamay computes the exact tanh-GELU
SEQS = ("a", "b")
CASES = [(fam, seq) for fam in TINY_DECODERS for seq in SEQS]
IDS = [f"{fam}-{seq}" for fam, seq in CASES]


@pytest.fixture(params=CASES, ids=IDS)
def case(request, tiny_dir):
    fam, seq = request.param
    return Tiny.get(tiny_dir, fam), seq


def gathered(logits, ids):
    return np.take_along_axis(logits, ids, axis=1)


def lse(logits):
    m = logits.max(1)
    return np.log(np.exp(logits - m[:, None]).sum(1)) + m


def teacher_forced(t: Tiny, seq: str) -> np.ndarray:
    """Rows for tokens + llama.cpp's g_0..g_14: row j produced g_j in llama.cpp."""
    toks = t.exact[f"tokens_{seq}"].tolist()
    logits = t.logits(toks + t.ref[f"greedy_{seq}"].tolist()[:15])
    return logits[len(toks) - 1 :]


def assert_rows_match(rows, ex, prefix: str, seq: str):
    """Logits at the probe ids and the reference's top-16 ids, and log-sum-exp."""
    probe, top = ex["probe_ids"], ex[f"{prefix}top_ids_{seq}"]
    np.testing.assert_allclose(rows[:, probe], ex[f"{prefix}probe_logits_{seq}"], atol=EXACT_TOL)
    np.testing.assert_allclose(gathered(rows, top), ex[f"{prefix}top_logits_{seq}"], atol=EXACT_TOL)
    np.testing.assert_allclose(lse(rows), ex[f"{prefix}lse_{seq}"], atol=EXACT_TOL)


def test_logits_match_float64_reference(case):
    t, seq = case
    assert_rows_match(t.logits(t.exact[f"tokens_{seq}"]), t.exact, "", seq)


def test_a_corrupted_golden_is_caught(tiny_dir):
    """The test of the test: one of the reference's top-16 ids changed in a copy (to the
    row's least likely token), and the comparison above fails."""
    t = Tiny.get(tiny_dir, "llama")
    rows = t.logits(t.exact["tokens_a"])
    corrupted = dict(t.exact)
    corrupted["top_ids_a"] = t.exact["top_ids_a"].copy()
    corrupted["top_ids_a"][5, 0] = rows[5].argmin()
    with pytest.raises(AssertionError):
        assert_rows_match(rows, corrupted, "", "a")


def test_teacher_forced_rows_match_float64_reference(case):
    """The reference's greedy_* rows are teacher-forced on llama.cpp's greedy tokens."""
    t, seq = case
    assert_rows_match(teacher_forced(t, seq), t.exact, "greedy_", seq)


def test_own_greedy_matches_float64_reference(case):
    """Prefill + 15 decode steps through the KV cache give the exact model's own path."""
    t, seq = case
    prompt = t.exact[f"tokens_{seq}"].tolist()
    got = list(t.model.generation(prompt, max_tokens=16, sampler=GREEDY))
    assert got == t.exact[f"own_greedy_{seq}"].tolist()


def test_close_to_llamacpp(case):
    t, seq = case
    tol, ref = LLAMACPP_TOL[t.name], t.ref
    for top_ids, top_logits, logits in (
        (ref[f"top_ids_{seq}"], ref[f"top_logits_{seq}"], t.logits(ref[f"tokens_{seq}"])),
        (ref[f"greedy_top_ids_{seq}"], ref[f"greedy_top_logits_{seq}"], teacher_forced(t, seq)),
    ):
        np.testing.assert_allclose(gathered(logits, top_ids), top_logits, atol=tol)
        sure = top_logits[:, 0] - top_logits[:, 1] > tol
        assert (logits.argmax(1)[sure] == top_ids[sure, 0]).all()


def test_greedy_follows_llamacpp_until_a_near_tie(case):
    """The README's rule: at the first step where the paths differ, llama.cpp's top-2
    margin must be below the tolerance (a near-tie); compare no further."""
    t, seq = case
    ours = t.exact[f"own_greedy_{seq}"]  # equal to ours (test above)
    theirs, margin = t.ref[f"greedy_{seq}"], t.ref[f"greedy_margin_{seq}"]
    differ = np.flatnonzero(ours != theirs)
    if differ.size:
        assert margin[differ[0]] < LLAMACPP_TOL[t.name]
