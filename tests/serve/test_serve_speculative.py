"""Speculative decoding over HTTP, as llama-server reports it: a server whose default
model drafts with a draft model (`llamay serve --model-draft`; here the tiny llama drafting
for itself) answers /completion exactly as the library's plain greedy generation, with
`timings.draft_n` / `timings.draft_n_accepted`; a request's `speculative.n_max` 0 turns
drafting off for it (no draft timings, as llama-server omits them); a bad
`speculative.p_min` is a 400; /metrics counts draft tokens."""

from __future__ import annotations

import httpx
import pytest
from fixture_data import oracle

from llamay.sample import GREEDY
from llamay.serve import create_app
from llamay.serve.models import Models
from tests.serve.conftest import running

PROMPT = [1, 400, 401, 402, 403, 404, 405, 406, 407, 408, 409]  # token ids: no template


@pytest.fixture(scope="module")
def http(tiny_paths, serve_home):
    models = Models(
        {"tiny": tiny_paths["tiny"]}, use_store=False, default_keep_alive=-1, parallel=2
    )
    models.speculative = {"draft": tiny_paths["tiny"], "draft_max": 4, "p_min": 0.0}
    with running(create_app(models, max_tokens_limit=64)) as s:
        with httpx.Client(base_url=s.url, timeout=300) as c:
            yield c


def _want(tiny, n):
    out = list(tiny.generation(PROMPT, n, GREEDY))
    stops = set(tiny.tokenizer.stop_ids)
    return out[: next((i for i, t in enumerate(out) if t in stops), len(out))]


def test_completion_reports_drafts(http, tiny):
    body = {"prompt": PROMPT, "n_predict": 12, "temperature": 0, "return_tokens": True}
    r = http.post("/completion", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["tokens"] == _want(tiny, 12)
    t = out["timings"]
    assert t["draft_n"] > 0 and t["draft_n_accepted"] == t["draft_n"]  # greedy self-draft

    off = http.post("/completion", json={**body, "speculative.n_max": 0})
    assert off.status_code == 200, off.text
    assert off.json()["tokens"] == out["tokens"]
    assert "draft_n" not in off.json()["timings"]

    nested = http.post("/completion", json={**body, "speculative": {"n_max": 2}})
    assert nested.status_code == 200, nested.text
    assert nested.json()["tokens"] == out["tokens"]
    assert 0 < nested.json()["timings"]["draft_n"] <= 2 * 12

    m = http.get("/metrics").text
    line = next(x for x in m.splitlines() if x.startswith("llamay_draft_tokens_total "))
    assert float(line.split()[1]) >= t["draft_n"] + nested.json()["timings"]["draft_n"]


def test_bad_draft_field_is_400(http):
    r = http.post("/completion", json={"prompt": PROMPT, "n_predict": 2, "speculative.p_min": 2})
    assert r.status_code == 400, r.text
    assert "draft_p_min" in r.text


def test_openai_endpoints_take_draft_fields(http, tiny):
    # llama-server's OpenAI-compatible endpoints read the same per-request fields, sent
    # here by the official client as extra body fields
    openai = oracle("openai")
    oa = openai.OpenAI(base_url=str(http.base_url) + "/v1", api_key="x", max_retries=0)
    want = _want(tiny, 12)
    on = oa.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=12, temperature=0, extra_body={"n_draft": 4}
    )
    t = on.model_extra["timings"]
    assert t["draft_n"] > 0 and t["draft_n_accepted"] == t["draft_n"]  # greedy self-draft
    assert on.usage.completion_tokens == len(want)
    off = oa.completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=12,
        temperature=0,
        extra_body={"speculative": {"n_max": 0}},
    )
    assert off.choices[0].text == on.choices[0].text
    assert "draft_n" not in off.model_extra["timings"]
    two = oa.completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=12,
        temperature=0,
        extra_body={"speculative.n_max": 2},
    )
    assert two.choices[0].text == on.choices[0].text
    assert 0 < two.model_extra["timings"]["draft_n"] <= 2 * 12
    with pytest.raises(openai.BadRequestError, match="draft_max"):
        oa.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=2,
            extra_body={"speculative.n_max": -1},
        )
