"""llama.cpp's server API over httpx: /completion (streaming and not, grammar, json_schema,
ignore_eos), /tokenize, /detokenize, /apply-template, /health, /metrics, /slots, rerank
by cosine (the cross-encoder: test_rerank.py). (llamay's context API: test_contexts.py.)"""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from llamay.sample import GREEDY
from tests.serve.conftest import chat_prompt, greedy


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


def test_completion_equals_generate(http, tiny):
    r = http.post("/completion", json={"prompt": "The sea", "n_predict": 8, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["content"] == greedy(tiny, "The sea", 8)
    assert body["stop"] is True and body["stop_type"] == "limit"
    assert body["tokens_predicted"] == 8
    assert body["tokens_evaluated"] == len(tiny.tokenize("The sea", parse_special=True))
    assert body["timings"]["predicted_n"] == 8


@pytest.mark.parametrize("stream", [False, True])
def test_completion_n_probs_equal_the_logits(http, tiny, stream):
    body = {"prompt": "The sea", "n_predict": 4, "temperature": 0, "n_probs": 3}
    if stream:
        with http.stream("POST", "/completion", json={**body, "stream": True}) as r:
            events = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: ")]
        probs = [p for e in events for p in e.get("completion_probabilities", [])]
        assert sum(1 for e in events if e.get("completion_probabilities")) > 1  # streamed
    else:
        probs = http.post("/completion", json=body).json()["completion_probabilities"]
    ids = tiny.tokenize("The sea", parse_special=True)
    toks = list(tiny.generation(ids, 4, GREEDY))
    rows = np.asarray(tiny.logits(ids + toks)[len(ids) - 1 : -1], np.float64)
    want = rows - rows.max(-1, keepdims=True)
    want = want - np.log(np.exp(want).sum(-1, keepdims=True))
    assert [p["id"] for p in probs] == toks
    for p, t, row in zip(probs, toks, want, strict=True):
        assert p["logprob"] == pytest.approx(row[t], abs=1e-4)
        best = np.argsort(-row, kind="stable")[:3]
        assert [a["id"] for a in p["top_logprobs"]] == best.tolist()
        np.testing.assert_allclose([a["logprob"] for a in p["top_logprobs"]], row[best], atol=1e-4)


def test_completion_stream(http, tiny):
    with http.stream(
        "POST",
        "/completion",
        json={"prompt": "The sea", "n_predict": 6, "temperature": 0, "stream": True},
    ) as r:
        datas = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert all(not d["stop"] for d in datas[:-1]) and datas[-1]["stop"]
    assert "".join(d["content"] for d in datas) == greedy(tiny, "The sea", 6)


def test_completion_grammar_and_schema(http):
    r = http.post(
        "/completion",
        json={"prompt": "x", "n_predict": 10, "temperature": 0, "grammar": 'root ::= "yes" | "no"'},
    )
    assert r.json()["content"] in ("yes", "no")
    schema = {
        "type": "object",
        "properties": {"k": {"type": "integer"}},
        "required": ["k"],
        "additionalProperties": False,
    }
    r = http.post(
        "/completion",
        json={"prompt": "x", "n_predict": 30, "temperature": 0, "json_schema": schema},
    )
    assert isinstance(json.loads(r.json()["content"])["k"], int)
    r = http.post("/completion", json={"prompt": "x", "grammar": "root ::= ("})
    assert r.status_code == 400 and "error" in r.json()


def test_tokenize_detokenize_template(http, tiny):
    r = http.post("/tokenize", json={"content": "Hello world"}).json()
    assert r["tokens"] == tiny.tokenize("Hello world", add_special=False, parse_special=True)
    pieces = http.post("/tokenize", json={"content": "Hello", "with_pieces": True}).json()
    assert "".join(p["piece"] for p in pieces["tokens"]) == "Hello"
    assert http.post("/detokenize", json={"tokens": r["tokens"]}).json()["content"] == (
        "Hello world"
    )
    msgs = [{"role": "user", "content": "hi"}]
    assert http.post("/apply-template", json={"messages": msgs}).json()["prompt"] == (
        chat_prompt(tiny, msgs)
    )
    assert http.post("/detokenize", json={"tokens": [10**9]}).status_code == 400


def test_health_metrics_slots(http):
    assert http.get("/health").json() == {"status": "ok"}
    http.post("/completion", json={"prompt": "a", "n_predict": 2, "temperature": 0})
    text = http.get("/metrics").text
    values = {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert values["llamacpp:tokens_predicted_total"] >= 2
    assert values["llamacpp:prompt_tokens_total"] >= 1
    assert "llamay_kv_pages_used" in values and "llamay_prefix_cache_hit_tokens_total" in values
    slots = http.get("/slots").json()
    assert any(s["model"] == "tiny" for s in slots)


def test_rerank_by_embedding_cosine(http, tiny_paths):
    import numpy as np

    import llamay

    docs = ["a cat", "stock prices", "a kitten"]
    r = http.post(
        "/v1/rerank",
        json={"model": "bert", "query": "a cat", "documents": docs, "top_n": 2},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["method"] == "embedding_cosine"  # no rank head: the labelled fallback
    bert = llamay.load(tiny_paths["bert"])
    vec = [np.asarray(bert.embed(bert.tokenize(t)), np.float64) for t in ["a cat", *docs]]
    cos = [float(v @ vec[0] / np.linalg.norm(v) / np.linalg.norm(vec[0])) for v in vec[1:]]
    want = sorted(range(3), key=lambda i: -cos[i])[:2]
    assert [x["index"] for x in body["results"]] == want
    got = [x["relevance_score"] for x in body["results"]]
    np.testing.assert_allclose(got, [cos[i] for i in want], rtol=1e-5, atol=1e-6)
    r = http.post("/v1/rerank", json={"model": "tiny", "query": "q", "documents": ["d"]})
    assert r.status_code == 400 and "--pooling" in r.text  # a decoder pooling none
