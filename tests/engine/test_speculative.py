"""Speculative decoding in the batch engine (issue 21.1): with an n-gram or a model
draft, greedy output equals the unpaged reference (`Model.generation`) token for token;
sampled output equals the plain engine's with the same seeds, and the distribution of a
verified token over many seeds is the target's (χ² against the model's own logits);
constraints hold across drafts; the draft counters are reported; a draft model with
another vocabulary is refused."""

from __future__ import annotations

import numpy as np
import pytest
from fixture_data import tiny_model_file

import llamay
from llamay.engine.api import Request
from llamay.engine.drafts import ngram_draft
from llamay.engine.scheduler import BatchEngine
from llamay.engine.speculative import Speculation
from llamay.errors import DraftModelError, RequestError
from llamay.sample import GREEDY, Sampler


@pytest.fixture(scope="module")
def tiny():
    return llamay.load(tiny_model_file("llama"))


@pytest.fixture(scope="module")
def self_draft(tiny):
    """The tiny llama drafting for itself (a second load: its own weights and pool)."""
    d = llamay.load(tiny_model_file("llama"))
    e = BatchEngine(
        tiny, slots=8, page_size=8, chunk=32, n_pages=128, speculative=Speculation(d, 4, 0, 0.0)
    )
    yield e
    e.close()


def ids(h):
    return [ev.token_id for ev in h]


# prompts that repeat themselves (n-gram drafts find something), and one that does not
PROMPTS = [list(range(500, 520)) * 2, [5, 6, 7, 8] * 6, list(range(900, 905)), [42] * 9]


def test_ngram_draft_prompt_lookup():
    # the longest recurring suffix wins, its latest occurrence, what followed it there
    assert ngram_draft([1, 2, 3, 9, 1, 2, 3, 7, 5, 2, 3], 3) == [7, 5, 2]
    assert ngram_draft([1, 2, 3, 4, 2], 2) == [3, 4]
    assert ngram_draft([1, 2, 3], 4) == []
    assert ngram_draft([7, 7], 3) == [7]
    assert ngram_draft([1, 2, 1], 0) == []


def test_greedy_with_ngram_drafts_equals_reference(tiny):
    want = [list(tiny.generation(p, 20, GREEDY)) for p in PROMPTS]
    e = BatchEngine(tiny, slots=3, page_size=8, chunk=32, n_pages=96, speculative=Speculation())
    try:
        hs = [e.submit(Request(p, 20, GREEDY)) for p in PROMPTS]
        assert [ids(h) for h in hs] == want
        st = e.stats()
        assert st["draft_tokens"] > 0 and st["spec_steps"] > 0 and st["pages_held"] == 0
        assert sum(h.usage.draft_n for h in hs) == st["draft_tokens"]
        assert sum(h.usage.draft_n_accepted for h in hs) == st["draft_accepted"]
    finally:
        e.close()


def test_greedy_self_draft_accepts_every_draft(tiny, self_draft):
    want = [list(tiny.generation(p, 17, GREEDY)) for p in PROMPTS]
    hs = [self_draft.submit(Request(p, 17, GREEDY)) for p in PROMPTS]
    assert [ids(h) for h in hs] == want
    # 1 from the prefill, then (CPU: drafts cut to fill T = 4, `fit_bucket`) 4 verify
    # steps of 3 drafts + 1; elsewhere 3 of 4 drafts + 1 and 1 plain decode
    for h in hs:
        assert h.usage.draft_n == 12 and h.usage.draft_n_accepted == 12
    assert self_draft.stats()["pages_held"] == 0


def test_sampled_with_speculation_equals_plain_per_seed(tiny, self_draft):
    # each emitted token is the row's own sampler draw from the target's logits: the same
    # seed gives the same tokens with and without drafts (penalties and top-k included),
    # and rows with and without a draft (draft_max=0) share the verify steps
    plain = BatchEngine(tiny, slots=8, page_size=8, chunk=32, n_pages=128)
    try:
        for s in (
            Sampler(temperature=0.9, seed=3),
            Sampler(temperature=1.2, top_k=20, repeat_penalty=1.3, seed=11),
        ):
            reqs = [(p, n) for p in PROMPTS for n in (None, 0)]
            hs = [self_draft.submit(Request(p, 18, s, draft_max=n)) for p, n in reqs]
            want = [ids(plain.submit(Request(p, 18, s))) for p, _ in reqs]
            assert [ids(h) for h in hs] == want
            assert all(h.usage.draft_n == 0 for h, (_, n) in zip(hs, reqs, strict=True) if n == 0)
            assert any(h.usage.draft_n_accepted < h.usage.draft_n for h in hs)
    finally:
        plain.close()


def test_verified_token_keeps_the_target_distribution(tiny, self_draft):
    # the second token is verified against a greedy draft (a point mass on the target's
    # argmax): accepted with probability p(d), else drawn from the residual. Over many
    # seeds, the pairs (x1, x2) must follow p(x1) p(x2 | x1) of the target (top_k=3,
    # temperature 1.5), computed from the model's dense logits.
    prompt = [11, 29, 301, 7]
    k, temp, n = 3, 1.5, 600
    s = dict(temperature=temp, top_k=k, top_p=1.0, min_p=0.0)

    def dist(ids_):
        lg = np.asarray(tiny.logits(ids_), np.float64)[-1]
        top = np.argsort(-lg)[:k]
        p = np.exp((lg[top] - lg[top].max()) / temp)
        return dict(zip(top.tolist(), (p / p.sum()).tolist(), strict=True))

    p1 = dist(prompt)
    want = {(a, b): pa * pb for a, pa in p1.items() for b, pb in dist(prompt + [a]).items()}
    hs = [self_draft.submit(Request(prompt, 3, Sampler(**s, seed=i))) for i in range(n)]
    got = [tuple(ids(h)[:2]) for h in hs]
    assert sum(h.usage.draft_n for h in hs) == n  # each verified one draft
    acc = sum(h.usage.draft_n_accepted for h in hs) / n
    assert 0.05 < acc < 0.95  # both paths taken: accepted drafts and residual draws
    cells = sorted(want)
    obs = np.array([sum(g == c for g in got) for c in cells], float)
    exp = np.array([want[c] * n for c in cells])
    assert obs.sum() == n
    chi2 = float(((obs - exp) ** 2 / exp).sum())
    assert chi2 < 27.9  # df = 8, p = 0.0005


def test_constraint_masks_drafts_and_draws(tiny, self_draft):
    # a grammar allowing only a few tokens: every emitted token obeys it with drafts too
    con = tiny.constraint(regex="(ab|cd)+")
    h = self_draft.submit(Request([11, 29, 301], 12, GREEDY, constraint=con))
    text = tiny.detokenize(ids(h))
    assert text and set(text) <= set("abcd"), text
    assert h.usage.draft_n > 0  # drafts were cut to the grammar and verified under it
    con2 = tiny.constraint(regex="(ab|cd)+")
    plain = BatchEngine(tiny, slots=2, page_size=8, chunk=32, n_pages=64)
    try:
        want = ids(plain.submit(Request([11, 29, 301], 12, GREEDY, constraint=con2)))
    finally:
        plain.close()
    assert tiny.detokenize(want) == text


def test_bad_draft_settings():
    with pytest.raises(RequestError, match="draft_max"):
        Speculation("ngram", draft_max=-1)
    with pytest.raises(RequestError, match="draft_p_min"):
        Speculation("ngram", p_min=1.5)
    with pytest.raises(RequestError, match="ngram"):
        Speculation("bigram")


@pytest.mark.model
def test_draft_with_another_tokenizer_is_refused(smollm2_path, gemma3_path):
    target = llamay.load(smollm2_path, n_ctx=512)
    other = llamay.load(gemma3_path, n_ctx=512)
    with pytest.raises(DraftModelError, match="tokenizer"):
        BatchEngine(target, slots=1, page_size=16, speculative=Speculation(other))


@pytest.mark.model
def test_smollm2_greedy_with_drafts_equals_reference(smollm2_path):
    # SmolLM2 drafting for itself, and n-gram drafts on a prompt the answer copies from
    m = llamay.load(smollm2_path, n_ctx=1024)
    d = llamay.load(smollm2_path, n_ctx=1024)
    text = (
        "<|im_start|>user\nRepeat this sentence exactly: the quick brown fox jumps over "
        "the lazy dog near the river bank.<|im_end|>\n<|im_start|>assistant\n"
    )
    prompts = [
        m.tokenize(text, add_special=True, parse_special=True),
        m.tokenize("The capital of France is", add_special=True, parse_special=True),
    ]
    want = [list(m.generation(p, 16, GREEDY)) for p in prompts]
    for spec in (Speculation(d, 4, 0, 0.0), Speculation("ngram", 8)):
        e = BatchEngine(m, slots=2, page_size=16, chunk=64, speculative=spec)
        try:
            hs = [e.submit(Request(p, 16, GREEDY)) for p in prompts]
            assert [ids(h) for h in hs] == want
            assert e.stats()["draft_accepted"] > 0
        finally:
            e.close()


def test_load_with_draft_and_prefix_cache(tiny):
    # llamay.load(..., draft="ngram"): Model.generate through the speculative engine, and a
    # second request sharing the first's prefix hits the cache yet decodes the same tokens
    m = llamay.load(tiny_model_file("llama"), draft="ngram")
    try:
        p = PROMPTS[1]
        want = list(tiny.generation(p, 16, GREEDY))
        h1 = m.engine.submit(Request(p, 16, GREEDY))
        assert ids(h1) == want and h1.usage.draft_n > 0
        h2 = m.engine.submit(Request(p + want[:3], 10, GREEDY))
        assert ids(h2) == list(tiny.generation(p + want[:3], 10, GREEDY))
        assert h2.usage.cached_tokens > 0
        assert m.engine.stats()["pages_held"] == 0
    finally:
        m.close()


def test_sliding_window_model_with_ngram_drafts():
    # the tiny gemma3's local layers (window 8, pages of 8): verify steps feed k+1 tokens
    # through the local pool too, and rejected positions roll back there as well
    m = llamay.load(tiny_model_file("gemma3"))
    prompts = [list(range(500, 540)) * 2, [5, 6, 7, 8] * 20, [42] * 9]
    want = [list(m.generation(p, 40, GREEDY)) for p in prompts]
    e = BatchEngine(
        m, slots=3, page_size=8, chunk=32, n_pages=96, speculative=Speculation("ngram", 6)
    )
    try:
        hs = [e.submit(Request(p, 40, GREEDY)) for p in prompts]
        assert [ids(h) for h in hs] == want
        assert all(h.usage.draft_n_accepted > 0 for h in hs)
        assert e.stats()["pages_held"] == 0
    finally:
        e.close()


def test_a_new_request_in_the_same_buckets_compiles_nothing(tiny, self_draft):
    # verify steps are bucketed (rows, T from 4, page-table widths): after one request,
    # another of a different prompt length within the same buckets compiles no program
    import jax

    compiles = []

    def count(event, duration, **kw):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(kw)

    want = list(tiny.generation(list(range(800, 809)), 13, GREEDY))
    list(self_draft.submit(Request(list(range(700, 712)), 13, GREEDY)))
    jax.monitoring.register_event_duration_secs_listener(count)
    try:
        h = self_draft.submit(Request(list(range(800, 809)), 13, GREEDY))
        got = ids(h)
    finally:
        jax.monitoring.unregister_event_duration_listener(count)
    assert got == want and h.usage.draft_n > 0
    assert compiles == []
