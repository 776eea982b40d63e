"""Scoring: `score` / `loglikelihood_rolling` against log-softmax of `Model.logits`."""

from __future__ import annotations

import numpy as np
import pytest
from fixture_data import tiny_model_file

from llamay.errors import RequestError
from llamay.eval import encode_pair, loglikelihood_rolling, rolling_windows, score
from llamay.eval.scoring import Row, prefix_token, score_rows
from llamay.model.score import head_chunk, prefix_logprobs

CONTEXTS = ["The capital of France is", "Once upon a time", "", "A B C ", "x"]
CONTINUATIONS = [" Paris", " there was a princess", "Hello world", "D", " y z" * 12]


def reference(m, ctx, cont):
    x = np.asarray(m.logits([*ctx, *cont]), np.float64)
    ls = x - x.max(-1, keepdims=True)
    ls = ls - np.log(np.exp(ls).sum(-1, keepdims=True))
    n = len(ctx)
    lp = sum(ls[n - 1 + j, t] for j, t in enumerate(cont))
    greedy = all(ls[n - 1 + j].argmax() == t for j, t in enumerate(cont))
    return lp, greedy


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_score_equals_logits(tiny_llama_model, batch):
    m = tiny_llama_model
    got = score(m, CONTEXTS, CONTINUATIONS, batch=batch)
    for c, x, (lp, greedy) in zip(CONTEXTS, CONTINUATIONS, got, strict=True):
        ref_lp, ref_greedy = reference(m, *encode_pair(m, c, x))
        assert lp == pytest.approx(ref_lp, abs=1e-3)
        assert greedy == ref_greedy


@pytest.fixture
def steps(monkeypatch):
    """The steps `score_rows` runs: (prefixes with rows, rows per prefix, picks a row)."""
    from llamay.eval import scoring

    seen = []
    real = scoring.run_prefix_step

    def spy(model, prefix, prefix_pos, suffix, suffix_pos, picks):
        pad = prefix.shape[1] + suffix.shape[2]
        used = int((suffix_pos < pad).any(axis=(1, 2)).sum())
        seen.append((used, suffix.shape[1], picks.shape[-1]))
        return real(model, prefix, prefix_pos, suffix, suffix_pos, picks)

    monkeypatch.setattr(scoring, "run_prefix_step", spy)
    return seen


def check_against_reference(m, contexts, continuations, got):
    for (lp, greedy), c, x in zip(got, contexts, continuations, strict=True):
        ref_lp, ref_greedy = reference(m, *encode_pair(m, c, x))
        assert lp == pytest.approx(ref_lp, abs=1e-3)
        assert greedy == ref_greedy


def test_one_token_answers_after_one_context_run_as_one_row(tiny_llama_model, steps):
    """MMLU's shape: four one-token answers after one context are one row of the step,
    each answer's log-probability and greedy flag still its own."""
    m = tiny_llama_model
    ctx = "Question: which letter? Answer:"
    answers = [" A", " B", " C", " D"]
    assert all(len(m.tokenize(a, add_special=False)) == 1 for a in answers)
    contexts, continuations = [ctx] * 4 + ["Other:"], answers + [" A"]
    got = score(m, contexts, continuations, batch=8)
    assert steps == [(2, 1, 4)]  # two prefixes of one row each, four picks a row
    check_against_reference(m, contexts, continuations, got)
    best = int(np.argmax(m.logits(encode_pair(m, ctx, " A")[0])[-1]))
    assert [g for _, g in got[:4]] == [m.tokenize(a, add_special=False)[0] == best for a in answers]


def test_endings_after_one_context_share_its_prefix(tiny_llama_model, steps):
    """HellaSwag's shape: multi-token endings after one context run the context once (one
    prefix, a row per ending), each ending's log-likelihood as if scored alone."""
    m = tiny_llama_model
    ctx = "A man is sitting on a roof. He"
    endings = [" is using wrap to wrap a pair of skis.", " starts pulling up roofing.",
               " is ripping level tiles off.", " holds a rubiks cube."]  # fmt: skip
    got = score(m, [ctx] * 4, endings, batch=8)
    assert steps == [(1, 4, 1)]
    check_against_reference(m, [ctx] * 4, endings, got)
    steps.clear()
    # with other requests beside them, and a batch smaller than the endings
    contexts, continuations = [ctx] * 4 + CONTEXTS, endings + CONTINUATIONS
    got = score(m, contexts, continuations, batch=2)
    check_against_reference(m, contexts, continuations, got)
    assert max(r for _, r, _ in steps) == 2  # the four endings in two pieces of two
    steps.clear()
    # two contexts' endings in one step: each row continues its own context's KV
    other = "The recipe calls for flour, then"
    contexts, continuations = [ctx] * 4 + [other] * 4, endings + endings[::-1]
    got = score(m, contexts, continuations, batch=8)
    assert steps == [(2, 4, 1)]
    check_against_reference(m, contexts, continuations, got)


def test_model_methods(tiny_llama_model):
    m = tiny_llama_model
    assert m.score(CONTEXTS[:2], CONTINUATIONS[:2]) == score(m, CONTEXTS[:2], CONTINUATIONS[:2])
    assert m.loglikelihood_rolling(["abc def"]) == loglikelihood_rolling(m, ["abc def"])


def test_greedy_flag_true_on_argmax_continuation(tiny_llama_model):
    m = tiny_llama_model
    ctx = m.tokenize("Hello there", add_special=False)
    seq = list(ctx)
    for _ in range(4):
        seq.append(int(m.logits(seq)[-1].argmax()))
    [(lp, greedy)] = score_rows(m, [Row(tuple(seq), 4)])
    assert greedy
    [(_, greedy)] = score_rows(m, [Row(tuple(seq[:-1]) + ((seq[-1] + 1) % 1000,), 4)])
    assert not greedy


def test_encode_pair_moves_trailing_spaces(tiny_llama_model):
    m = tiny_llama_model
    ctx, cont = encode_pair(m, "A B C ", "D")
    assert m.detokenize(ctx) == "A B C"
    assert m.detokenize(cont) == " D"
    ctx, cont = encode_pair(m, "", "Hello")
    assert ctx == [prefix_token(m)]


def test_truncation_keeps_the_last_tokens(tiny_llama_model):
    m = tiny_llama_model
    [(lp, _)] = score(m, ["a b c d e f g h i j k l"], [" m n"], max_length=6)
    ctx, cont = encode_pair(m, "a b c d e f g h i j k l", " m n")
    full = [*ctx, *cont][-7:]
    ref, _ = reference(m, full[: -len(cont)], cont)
    assert lp == pytest.approx(ref, abs=1e-3)


def test_errors(tiny_llama_model):
    with pytest.raises(RequestError, match="contexts"):
        score(tiny_llama_model, ["a"], [])
    with pytest.raises(RequestError, match="empty"):
        score(tiny_llama_model, ["a"], [""])


@pytest.mark.parametrize("n", [1, 5, 8, 9, 17, 30])
def test_rolling_windows_score_every_token_once(n):
    toks = list(range(100, 100 + n))
    windows = rolling_windows(toks, prefix=7, max_length=8)
    assert [t for _, cont in windows for t in cont] == toks
    assert windows[0][0] == [7]
    full = [7, *toks]
    for ctx, cont in windows:
        end = toks.index(cont[-1]) + 2  # just past cont in full
        assert 1 <= len(ctx) and len(ctx) + len(cont) <= 8 + 1
        assert full[end - len(ctx) - len(cont) : end] == ctx + cont


def test_rolling_equals_one_pass_when_it_fits(tiny_llama_model, log_softmax):
    m = tiny_llama_model
    text = "the quick brown fox jumps over the lazy dog " * 3
    ids = m.tokenize(text, add_special=False)
    full = [prefix_token(m), *ids]
    ls = log_softmax(m.logits(full[:-1]))
    ref = sum(ls[j, full[j + 1]] for j in range(len(ids)))
    [got] = loglikelihood_rolling(m, [text], max_length=len(ids) + 4)
    assert got == pytest.approx(ref, abs=1e-3)
    # in windows of 8: each window scored with its own (shorter) context
    [windowed] = loglikelihood_rolling(m, [text], max_length=8)
    ref_w = sum(reference(m, c, x)[0] for c, x in rolling_windows(ids, prefix_token(m), 8))
    assert windowed == pytest.approx(ref_w, abs=1e-3)


def test_head_chunk():
    # HEAD_CHUNK_BYTES of f32 logits: 524 rows of 32,000, 64 of 262,144
    assert head_chunk(512, 1, 32000) == 512
    assert head_chunk(256, 32, 32000) == 16
    assert head_chunk(256, 1, 262144) == 64
    assert head_chunk(48, 1, 1000) == 16
    assert head_chunk(7, 4, 1000) == 1
    assert head_chunk(8, 4, 10**9) == 1  # one row per batch row at least


def test_one_compile_per_bucket(tiny_llama_model):
    m = tiny_llama_model
    score(m, ["a b c"], [" d"], batch=2)
    before = prefix_logprobs._cache_size()
    score(m, ["a b c d e f"], [" g h"], batch=2)  # same [2, 16] bucket
    score(m, ["x"], [" y"], batch=2)
    assert prefix_logprobs._cache_size() == before
    np.testing.assert_equal(before >= 1, True)


@pytest.mark.parametrize("arch", ["gemma3", "qwen3moe"])
def test_score_other_families(arch):
    import llamay

    m = llamay.load(tiny_model_file(arch))
    got = score(m, CONTEXTS[:3], CONTINUATIONS[:3], batch=2)
    for c, x, (lp, greedy) in zip(CONTEXTS, CONTINUATIONS, got, strict=False):
        ref_lp, ref_greedy = reference(m, *encode_pair(m, c, x))
        assert lp == pytest.approx(ref_lp, abs=1e-3)
        assert greedy == ref_greedy
