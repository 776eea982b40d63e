"""CTC decoders against pyctcdecode: its published expectations (tests/test_decoder.py of
pyctcdecode, on its shipped sample data) and, beam for beam, its output on the same
inputs with and without lexicon / LM / hotwords. The prefix beam search is checked
against exact CTC label probabilities by enumeration."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from fixture_data import oracle
from hypothesis import given, settings
from hypothesis import strategies as st

from llamay.ocr.ctc import Alphabet, greedy_decode, log_probs, prefix_beam_search
from llamay.ocr.lm import ArpaLM
from llamay.ocr.word_beam import WordScorer, beam_search

LIBRI_LABELS = [" ", *"abcdefghijklmnopqrstuvwxyz", "'"]
LIBRI_TEXT = (
    "i have a good deal of will you remember and what i have set my mind upon no doubt "
    "i shall some day achieve"
)
SAMPLE_LABELS = [" ", "b", "g", "n", "s", "u", "y", ""]
VOCAB = {c: n for n, c in enumerate(SAMPLE_LABELS)}


def _onehot(chars) -> np.ndarray:
    m = np.zeros((len(chars), len(VOCAB)))
    for i, c in enumerate(chars):
        m[i, VOCAB[c]] = 1
    return m


BUGS = _onehot("bugs")
BUNNY = _onehot(["b", "u", "n", "", "n", "y"])
BLANK, SPACE = _onehot([""]), _onehot([" "])
TEST_PROBS = np.vstack([np.vstack([BUGS, BLANK, BLANK]) * 0.49 + BUNNY * 0.51, SPACE, BUNNY])
TEST_LOGITS = np.log(np.clip(TEST_PROBS, 1e-15, 1))
SAMPLE = Alphabet.from_labels(SAMPLE_LABELS)
LIBRI = Alphabet.from_labels(LIBRI_LABELS)


def _decode(logits, alphabet=SAMPLE, scorer=None, **kw):
    return beam_search(log_probs(logits), alphabet, scorer, **kw)


@pytest.fixture(scope="module")
def lm(bugs_bunny_arpa) -> ArpaLM:
    return ArpaLM(bugs_bunny_arpa)


# --- published expectations --------------------------------------------------------------


def test_greedy_published(libri_logits):
    assert greedy_decode(log_probs(TEST_LOGITS), SAMPLE).text == "bunny bunny"
    assert greedy_decode(log_probs(libri_logits), LIBRI).text == LIBRI_TEXT


def test_greedy_collapses_and_batches():
    ab = Alphabet.from_labels(["", "a", "b", " "], blank=0)
    seq = [1, 1, 0, 1, 2, 2, 3, 3, 0, 2]  # a a _ a b b ' ' ' ' _ b -> "aab b"
    x = np.full((len(seq), 4), -20.0)
    x[np.arange(len(seq)), seq] = 0.0
    h = greedy_decode(x, ab)
    assert h.text == "aab b" and h.ids == [1, 1, 2, 3, 2]
    assert [(w.text, w.start, w.end) for w in h.words] == [("aab", 0, 6), ("b", 9, 10)]
    batch = greedy_decode(np.stack([x, x[::-1]]), ab, lengths=[10, 4])
    assert [b.text for b in batch] == ["aab b", "b"]


def test_beam_published_no_lm(libri_logits):
    beams = _decode(TEST_LOGITS)
    assert len(beams) == 16
    assert beams[0].text == "bunny bunny" and beams[-1].text == "bugs bunny"
    assert beams[0].word_frames == [("bunny", (0, 6)), ("bunny", (7, 13))]
    assert beams[-1].word_frames == [("bugs", (0, 4)), ("bunny", (7, 13))]
    stretched = [" ", "", "b", "u", "n", "", "n", "n", "y", "", " ", " "]
    top = _decode(_onehot(stretched))[0]
    assert top.text == "bunny" and top.word_frames == [("bunny", (2, 9))]
    beams = _decode(libri_logits, LIBRI)
    assert beams[0].text == LIBRI_TEXT
    assert len(beams[0].words) == len(LIBRI_TEXT.split())


def test_beam_published_lm(lm):
    def top(scorer, **kw):
        return _decode(TEST_LOGITS, SAMPLE, scorer, **kw)[0].text

    assert top(WordScorer(lm=lm, alpha=0.0)) == "bunny bunny"
    assert top(WordScorer(lm=lm, alpha=1.0)) == "bugs bunny"
    assert top(WordScorer(lm=lm, lexicon=[], alpha=1.0)) == "bugs bunny"
    assert top(WordScorer(lm=lm, lexicon=["bunny"], alpha=1.0, unk_score_offset=0.0)) == (
        "bugs bunny"
    )
    assert top(WordScorer(lm=lm, lexicon=["bunny"], alpha=1.0)) == "bunny bunny"
    full = WordScorer(lm=lm, lexicon=lm.unigrams())
    assert top(full) == "bugs bunny"
    assert top(full, token_min_logp=0.0) == "bunny bunny"
    beams = _decode(TEST_LOGITS, SAMPLE, full)
    assert [(h.text, h.word_frames) for h in beams] == [
        ("bugs bunny", [("bugs", (0, 4)), ("bunny", (7, 13))])
    ]
    assert beams[0].logit_score == pytest.approx(-2.853399551509947, abs=1e-9)
    assert beams[0].score == pytest.approx(0.14660044849005294, abs=1e-9)
    beams = _decode(
        TEST_LOGITS, SAMPLE, WordScorer(lm=lm, unk_score_offset=0.0), beam_prune_logp=-20.0
    )
    assert len(beams) == 16 and [b.text for b in beams[:2]] == ["bugs bunny", "bunny bunny"]


def test_beam_published_hotwords(lm):
    def top(hot, with_lm=True, weight=20.0):
        sc = WordScorer(
            lm=lm if with_lm else None,
            lexicon=lm.unigrams() if with_lm else None,
            hotwords=hot,
            hotword_weight=weight,
        )
        return _decode(TEST_LOGITS, SAMPLE, sc)[0].text

    assert top(["bunny"]) == "bunny bunny"
    assert top(["bugs", "bunny"]) == "bugs bunny"
    assert top(["bugs bunny"]) == "bugs bunny"
    assert top(["bugs"], with_lm=False, weight=10.0) == "bugs bunny"


def test_history_pruning_published():
    logits = np.log(np.clip(np.vstack([TEST_PROBS] + [np.vstack([SPACE, BUNNY])] * 5), 1e-15, 1))
    beams = _decode(logits)
    pruned = _decode(logits, prune_history=True)
    assert beams[0].text == pruned[0].text
    assert len(beams) == 16 and len(pruned) == 1


# --- beam for beam against pyctcdecode -------------------------------------------------------


def _pyctc(logits, labels, kenlm_path=None, lm_kw=None, **kw):
    oracle("pyctcdecode")
    from pyctcdecode.alphabet import Alphabet as PAlphabet
    from pyctcdecode.decoder import BeamSearchDecoderCTC
    from pyctcdecode.language_model import LanguageModel

    language_model = None
    if kenlm_path is not None:
        kenlm = oracle("kenlm")
        language_model = LanguageModel(kenlm.Model(str(kenlm_path)), **(lm_kw or {}))
    dec = BeamSearchDecoderCTC(PAlphabet.build_alphabet(list(labels)), language_model)
    return dec.decode_beams(logits, **kw)


def _same(ours, theirs):
    a = [(h.text, h.word_frames) for h in ours]
    b = [(t[0], t[2]) for t in theirs]
    assert a == b
    np.testing.assert_allclose([h.logit_score for h in ours], [t[3] for t in theirs], atol=1e-6)
    np.testing.assert_allclose([h.score for h in ours], [t[4] for t in theirs], atol=1e-6)


def test_libri_beams_equal_pyctcdecode(libri_logits):
    for prune in (False, True):
        ours = _decode(libri_logits, LIBRI, prune_history=prune)
        _same(ours, _pyctc(libri_logits, LIBRI_LABELS, prune_history=prune))


def _random_case(rng, T, words):
    """Peaky random frames spelling random words from `words`, with noise."""
    text = " ".join(rng.choice(words, size=rng.integers(1, 4)))
    frames = []
    for ch in text:
        frames += [ch] * int(rng.integers(1, 3)) + [""] * int(rng.integers(0, 2))
    frames = frames[:T]
    idx = [VOCAB[c] for c in frames]
    x = rng.normal(0, 1.5, (len(idx), len(VOCAB)))
    x[np.arange(len(idx)), idx] += rng.uniform(1.0, 4.0, len(idx))
    return x


@pytest.mark.parametrize("seed", range(6))
def test_random_beams_equal_pyctcdecode(seed, lm, bugs_bunny_arpa):
    rng = np.random.default_rng(seed)
    x = _random_case(rng, 30, ["bugs", "bunny", "buns", "guy", "sun"])
    lex = ["bugs", "bunny", "sun"]
    hot = ["guy"] if seed % 2 else None
    kw = dict(beam_width=int(rng.choice([4, 16, 64])), hotwords=hot, hotword_weight=5.0)
    ours = _decode(
        x, SAMPLE, WordScorer(hotwords=hot, hotword_weight=5.0), beam_width=kw["beam_width"]
    )
    _same(ours, _pyctc(x, SAMPLE_LABELS, **kw))
    for alpha, beta, unk in ((0.5, 1.5, -10.0), (1.2, 0.3, -3.0)):
        sc = WordScorer(
            lm=lm,
            lexicon=lex,
            alpha=alpha,
            beta=beta,
            unk_score_offset=unk,
            hotwords=hot,
            hotword_weight=5.0,
        )
        ours = _decode(x, SAMPLE, sc, beam_width=kw["beam_width"])
        theirs = _pyctc(
            x,
            SAMPLE_LABELS,
            bugs_bunny_arpa,
            dict(unigrams=lex, alpha=alpha, beta=beta, unk_score_offset=unk),
            **kw,
        )
        _same(ours, theirs)


# --- lexicon modes -----------------------------------------------------------------------


def test_hard_lexicon_only_emits_lexicon_words():
    rng = np.random.default_rng(7)
    for _ in range(5):
        x = _random_case(rng, 30, ["bugs", "bunny", "buns", "guy", "sun"])
        sc = WordScorer(lexicon=["bugs", "bunny", "sun"], hard=True)
        for h in _decode(x, SAMPLE, sc):
            assert set(h.text.split()) <= {"bugs", "bunny", "sun"}


def test_soft_lexicon_corrects_a_misspelling():
    # greedy reads "bunsy" (s at 0.55 against n at 0.45); a lexicon pulls it to "bunny"
    probs = np.vstack(
        [
            _onehot(["b", "u", "n", ""]),
            _onehot(["n"]) * 0.45 + _onehot(["s"]) * 0.55,
            _onehot(["y"]),
        ]
    )
    x = np.log(np.clip(probs, 1e-15, 1))
    assert greedy_decode(log_probs(x), SAMPLE).text == "bunsy"
    assert _decode(x, SAMPLE, WordScorer(lexicon=["bunny"]))[0].text == "bunny"
    assert _decode(x, SAMPLE, WordScorer(lexicon=["bunny"], hard=True))[0].text == "bunny"


def test_lm_partial_state_and_arpa_backoff(lm):
    bos = lm.begin_state()
    s, st = lm.score(bos, "bugs")
    assert s == 0.0
    assert lm.score(st, "bunny")[0] == 0.0
    assert lm.score(st, "</s>")[0] == -10.0
    assert lm.score(bos, "bunny")[0] == -10.0
    assert lm.score(bos, "zebra")[0] == -10.0  # <unk>
    assert "bugs" in lm and "zebra" not in lm


# --- prefix beam search vs exact CTC probabilities --------------------------------------------


def _collapse(path, blank):
    out, prev = [], None
    for p in path:
        if p != prev and p != blank:
            out.append(p)
        prev = p
    return tuple(out)


@pytest.mark.parametrize("seed", range(4))
def test_prefix_beam_exact_on_small_inputs(seed):
    rng = np.random.default_rng(seed)
    T, C = 5, 3
    logp = log_probs(rng.normal(size=(T, C)) * 2)
    ab = Alphabet(("", "a", "b"), 0)
    exact: dict = {}
    for path in itertools.product(range(C), repeat=T):
        lab = _collapse(path, 0)
        exact[lab] = np.logaddexp(
            exact.get(lab, -np.inf), sum(logp[t, p] for t, p in enumerate(path))
        )
    hyps = prefix_beam_search(logp, ab, beam_width=1000, beam_prune_logp=-1e9, token_min_logp=-1e9)
    got = {tuple(h.ids): h.score for h in hyps}
    assert set(got) == set(exact)
    for lab, s in exact.items():
        assert got[lab] == pytest.approx(s, abs=1e-9)
    best = max(exact, key=exact.get)
    assert tuple(hyps[0].ids) == best
    assert math.isclose(np.logaddexp.reduce(list(exact.values())), 0.0, abs_tol=1e-9)


def test_batched_decoders_equal_per_row(libri_logits):
    x = log_probs(np.stack([libri_logits, libri_logits[::-1]]))
    rows = beam_search(x, LIBRI, lengths=[371, 200], beam_width=8)
    assert rows[0][0].text == LIBRI_TEXT
    assert [h.text for h in rows[1]] == [
        h.text for h in beam_search(x[1, :200], LIBRI, beam_width=8)
    ]
    pref = prefix_beam_search(x, LIBRI, beam_width=4)
    assert len(pref) == 2 and pref[0][0].text == LIBRI_TEXT


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # pyctcdecode on 0 frames
@settings(max_examples=15, deadline=None)
@given(
    t=st.integers(0, 12),
    seed=st.integers(0, 2**31 - 1),
    beam=st.sampled_from([1, 3, 10]),
    prune=st.booleans(),
)
def test_fuzz_random_logits_equal_pyctcdecode(t, seed, beam, prune):
    """pyctcdecode's fuzz inputs (normal random logit matrices, empty included)."""
    x = np.random.default_rng(seed).normal(size=(t, len(LIBRI_LABELS) + 1))
    ours = beam_search(log_probs(x), LIBRI, beam_width=beam, prune_history=prune)
    theirs = _pyctc(x, LIBRI_LABELS, beam_width=beam, prune_history=prune)
    _same(ours, theirs)
