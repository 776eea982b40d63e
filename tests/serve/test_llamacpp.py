"""llama.cpp's server API over httpx: /completion (streaming and not, grammar, json_schema,
ignore_eos), /tokenize, /detokenize, /apply-template, /health, /metrics, /slots, rerank.
(llamay's context API: test_contexts.py.)"""

from __future__ import annotations

import json

import httpx
import pytest

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


def test_completion_n_probs(http):
    r = http.post(
        "/completion", json={"prompt": "The sea", "n_predict": 3, "temperature": 0, "n_probs": 2}
    ).json()
    probs = r["completion_probabilities"]
    assert len(probs) == 3
    assert all(p["top_logprobs"][0]["id"] == p["id"] and len(p["top_logprobs"]) == 2 for p in probs)


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


def test_rerank(http):
    r = http.post(
        "/v1/rerank",
        json={
            "model": "bert",
            "query": "a cat",
            "documents": ["a cat", "stock prices", "a kitten"],
            "top_n": 2,
        },
    )
    assert r.status_code == 200, r.text
    res = r.json()["results"]
    assert len(res) == 2 and res[0]["index"] == 0
    assert res[0]["relevance_score"] >= res[1]["relevance_score"]
    assert (
        http.post(
            "/v1/rerank", json={"model": "tiny", "query": "q", "documents": ["d"]}
        ).status_code
        == 400
    )
