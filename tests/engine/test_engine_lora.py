"""Per-request LoRA adapters in the batch engine (the tiny llama, tests/fixtures/lora's
adapters): a batch mixing two adapters, both and none equals each request run alone and the
dense reference path with only that adapter attached; the first token and its log-probability
equal llama.cpp's with the same adapter and scale; prefix KV is never shared across adapter
settings; new scales are new values, not new programs."""

from __future__ import annotations

import numpy as np
import pytest
from fixture_data import FIXTURES, fixture_module, oracle, tiny_model_file

import llamay
from llamay.engine.api import Request
from llamay.engine.paged_steps import paged_step
from llamay.engine.scheduler import BatchEngine
from llamay.errors import RequestError
from llamay.sample import GREEDY

LORA = FIXTURES / "lora"


make_lora = fixture_module("lora", "make_lora.py")

#: (request's lora field, the adapters that setting means) per row of the mixed batch
ROWS = [
    ({0: 0.7}, [("wide", 0.7)]),
    ({1: 1.5}, [("narrow", 1.5)]),
    ({0: 0.3, 1: -0.5}, [("wide", 0.3), ("narrow", -0.5)]),
    ({}, []),
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    oracle("gguf")
    base = tiny_model_file("llama")
    paths = make_lora.write_adapters(base, "tiny-llama", tmp_path_factory.mktemp("lora"))
    gold = np.load(LORA / "tiny-llama.llamacpp.npz")
    for name, path in paths.items():
        assert make_lora.sha256(path) == str(gold[f"sha256_{name}"]), name
    return base, paths, gold


@pytest.fixture(scope="module")
def exact(tiny):
    base, paths, _ = tiny
    m = llamay.load(base, lora=[(paths["wide"], 1.0), (paths["narrow"], 1.0)])
    e = BatchEngine(m, slots=4, page_size=4, chunk=16)
    yield m, e
    e.close()


def _run(engine, prompt, lora, n=6, logprobs=None):
    h = engine.submit(Request(prompt, n, GREEDY, lora=lora, logprobs=logprobs))
    return h, [ev for ev in h]


def test_a_mixed_batch_equals_each_alone_and_the_dense_path(tiny, exact):
    base, paths, gold = tiny
    m, e = exact
    toks = [int(t) for t in gold["tokens"]]
    prompts = [toks, toks[:11], toks[3:], toks[:7]]
    handles = [
        e.submit(Request(p, 6, GREEDY, lora=lora))
        for p, (lora, _) in zip(prompts, ROWS, strict=True)
    ]
    mixed = [[ev.token_id for ev in h] for h in handles]
    alone = [
        [ev.token_id for ev in _run(e, p, lora)[1]]
        for p, (lora, _) in zip(prompts, ROWS, strict=True)
    ]
    assert mixed == alone
    for p, (_, members), got in zip(prompts, ROWS, mixed, strict=True):
        ref = m.with_lora([(paths[a], s) for a, s in members])
        assert list(ref.generation(p, max_tokens=6, sampler=GREEDY)) == got, members
    # the adapters matter: the base model continues the first prompt otherwise
    assert mixed[0] != list(m.with_lora([]).generation(prompts[0], 6, GREEDY))


def test_first_token_and_logprob_equal_llamacpp(tiny):
    """llama.cpp's logits with each adapter at its scale (lora_path goldens) at the
    prompt's last position: the engine's first greedy token and its log-probability,
    within the tiny README's 0.5, every case in one batch."""
    base, paths, gold = tiny
    m = llamay.load(base, numerics="llamacpp", lora=[(paths["wide"], 1.0), (paths["narrow"], 1.0)])
    toks = [int(t) for t in gold["tokens"]]
    cases = {"wide": {0: 0.7}, "narrow": {1: 1.5}, "both": {0: 0.7, 1: 1.5}, "none": {}}
    e = BatchEngine(m, slots=4, page_size=4, chunk=16)
    try:
        handles = {
            c: e.submit(Request(toks, 1, GREEDY, lora=lora, logprobs=0))
            for c, lora in cases.items()
        }
        firsts = {c: next(iter(h)) for c, h in handles.items()}
    finally:
        e.close()
    for c, ev in firsts.items():
        top, lse = gold[f"top_logits_{c}"][-1], gold[f"lse_{c}"][-1]
        if top[0] - top[1] > 0.5:
            assert ev.token_id == int(gold[f"top_ids_{c}"][-1, 0]), c
        assert ev.token_id in gold[f"top_ids_{c}"][-1][:4], c
        want = top[list(gold[f"top_ids_{c}"][-1]).index(ev.token_id)] - lse
        assert abs(ev.logprob - want) < 0.5, (c, ev.logprob, want)
    assert len({ev.token_id for ev in firsts.values()}) > 1  # the settings differ


def test_prefix_kv_is_not_shared_across_adapter_settings(tiny, exact):
    _, _, gold = tiny
    m, e = exact
    prompt = [int(t) for t in gold["tokens"]][::-1]  # 16 tokens: four pages of 4
    h1, first = _run(e, prompt, {0: 0.7})
    h2, base = _run(e, prompt, {})
    assert h2.usage.cached_tokens == 0  # the adapter's K/V are not the base model's
    h3, again = _run(e, prompt, {0: 0.7})
    assert h3.usage.cached_tokens >= 12  # the same setting shares them
    assert [ev.token_id for ev in again] == [ev.token_id for ev in first]
    h4, other = _run(e, prompt, {0: 0.5})
    assert h4.usage.cached_tokens == 0
    assert [ev.token_id for ev in base] == list(m.with_lora([]).generation(prompt, 6, GREEDY))


def test_new_scales_do_not_recompile_and_global_scales_apply(tiny, exact):
    _, paths, gold = tiny
    m, e = exact
    prompt = [int(t) for t in gold["tokens"][:9]]
    _run(e, prompt, {0: 0.2})
    before = paged_step._cache_size()
    got = {}
    for s in (0.1, 0.9, -1.3):
        got[s] = [ev.token_id for ev in _run(e, prompt, {0: s, 1: s})[1]]
    assert paged_step._cache_size() == before
    e.set_lora_scales({1: 1.5})  # requests naming no adapters: narrow at 1.5 only
    try:
        plain = [ev.token_id for ev in _run(e, prompt, None)[1]]
    finally:
        e.set_lora_scales([1.0, 1.0])
    want = list(m.with_lora([(paths["narrow"], 1.5)]).generation(prompt, 6, GREEDY))
    assert plain == want


@pytest.mark.parametrize(
    "lora, message",
    [
        ({2: 1.0}, "invalid LoRA adapter id 2"),
        ({0: float("nan")}, "finite"),
        ([1.0], "1 scales given, the model has 2 adapters"),
        ({0: "x"}, "must be a number"),
    ],
)
def test_bad_lora_fails_the_request_alone(exact, lora, message):
    _, e = exact
    with pytest.raises(RequestError, match=message):
        _run(e, [5, 6, 7], lora)


def test_a_model_without_adapters_refuses_them():
    m = llamay.load(tiny_model_file("llama"))
    e = BatchEngine(m, slots=2, page_size=4)
    try:
        with pytest.raises(RequestError, match="has none loaded"):
            _run(e, [5, 6, 7], {0: 1.0})
        assert [ev.token_id for ev in _run(e, [5, 6, 7], None)[1]] == list(
            m.generation([5, 6, 7], 6, GREEDY)
        )
    finally:
        e.close()


def test_smollm2_engine_mixes_its_adapter_and_none(smollm2_path, tmp_path):
    """A real model (SmolLM2 Q4_1, llamacpp numerics, the qv adapter of
    tests/fixtures/lora): rows with the adapter and without, in one batch, give the
    library path's log-probabilities (`Model.logits`, itself held to llama.cpp in
    tests/model/test_lora.py) and llama.cpp's own: bit-near without the adapter, within
    its README's 1.0 with it."""
    oracle("gguf")
    gold = np.load(LORA / "smollm2.llamacpp.npz")
    paths = make_lora.write_adapters(smollm2_path, "smollm2", tmp_path)
    assert make_lora.sha256(paths["qv"]) == str(gold["sha256_qv"])
    m = llamay.load(smollm2_path, numerics="llamacpp", lora=[(paths["qv"], 1.0)])
    toks = [int(t) for t in gold["tokens"]]
    rows = [(16, {0: 1.0}), (16, {}), (14, {0: 1.0}), (11, {})]
    e = BatchEngine(m, slots=4, page_size=16, chunk=16)
    try:
        handles = [e.submit(Request(toks[:k], 1, GREEDY, lora=lo, logprobs=8)) for k, lo in rows]
        firsts = [next(iter(h)) for h in handles]
    finally:
        e.close()
    for (k, lora), ev in zip(rows, firsts, strict=True):
        case = "qv" if lora else "none"
        lib = (m if lora else m.with_lora([])).logits(toks[:k])[-1].astype(np.float64)
        lib = lib - lib.max() - np.log(np.exp(lib - lib.max()).sum())
        got = dict(ev.top_logprobs)
        assert ev.token_id == int(np.argmax(lib))
        for i, lp in got.items():
            assert abs(lp - lib[i]) < 1e-2, (k, case, i, lp, lib[i])
        ids, logits = gold[f"top_ids_{case}"][k - 1], gold[f"top_logits_{case}"][k - 1]
        want = dict(zip(ids, logits, strict=True))
        lse = gold[f"lse_{case}"][k - 1]
        tol = 1.0 if lora else 0.05
        common = [i for i in got if i in want]
        assert len(common) >= 4, (k, case)
        for i in common:
            assert abs(got[i] - (want[i] - lse)) < tol, (k, case, i, got[i], want[i] - lse)


def test_model_generate_takes_a_lora_per_call(tiny, exact):
    """`Model.generate(..., lora=...)`: calls with different adapters on one model (its one
    engine) equal the model with only those adapters."""
    _, paths, _ = tiny
    m, _ = exact
    text = "Once upon a time"
    for lora, members in ROWS:
        got = m.generate(text, max_tokens=6, temperature=0, lora=lora)
        ref = m.with_lora([(paths[a], s) for a, s in members])
        assert got == ref.generate(text, max_tokens=6, temperature=0), members
        ref.close()
    assert m.generate(text, max_tokens=6, temperature=0, lora={}) != m.generate(
        text, max_tokens=6, temperature=0, lora={0: 0.7}
    )
    m.close()


def test_speculative_verify_steps_apply_each_rows_adapters(tiny, exact):
    """Speculative decoding (n-gram drafts, llamay.engine.speculative) over rows with
    different adapters: its verify steps carry each row's scales, so greedy output equals
    the plain engine's."""
    from llamay.engine.speculative import Speculation

    m, e = exact
    prompts = [[42] * 9, [42] * 12, [42] * 10, [5, 6, 7, 8] * 6]  # n-gram drafts from repeats
    plain = [
        [ev.token_id for ev in _run(e, p, lora, n=20)[1]]
        for p, (lora, _) in zip(prompts, ROWS, strict=True)
    ]
    spec = BatchEngine(
        m, slots=4, page_size=4, chunk=16, speculative=Speculation("ngram", 4, 0, 0.0)
    )
    try:
        hs = [
            spec.submit(Request(p, 20, GREEDY, lora=lo))
            for p, (lo, _) in zip(prompts, ROWS, strict=True)
        ]
        got = [[ev.token_id for ev in h] for h in hs]
        drafted = [h.usage.draft_n for h in hs]
    finally:
        spec.close()
    assert got == plain
    # the verify path ran for rows with adapters
    assert any(d > 0 for d, (lora, _) in zip(drafted, ROWS, strict=True) if lora), drafted
