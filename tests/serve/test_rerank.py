"""A real cross-encoder through /v1/rerank and /rerank: the tiny random BERT reranker
(tests/fixtures/embeddings/reranker.py: pooling_type 4 RANK, llama.cpp's cls / cls.output
head) against llama.cpp's rank pooling (llama-cpp-python; goldens in
tests/fixtures/embeddings/reranker.json, README.md), Jina/Cohere request shapes."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
from fixture_data import fixture, fixture_module, tiny_cache_dir, tiny_model_file

import llamay
from llamay.model.embed import rank_head
from llamay.serve import create_app
from llamay.serve.models import Models
from tests.serve.conftest import running

# The head is llama.cpp's to 1e-6 (from llama.cpp's own CLS state), and the BERT trunk
# under it too (per-token states within 5e-7; scores within 5e-7 end to end, measured:
# tests/fixtures/embeddings/README.md), so both are held to the 1e-4.
HEAD_TOL = 1e-4
SCORE_TOL = 1e-4
STATE_TOL = 1e-5  # the CLS state the head reads: 3.6e-7 measured


@pytest.fixture(scope="module")
def goldens():
    return json.loads(fixture("embeddings", "reranker.json").read_text())


@pytest.fixture(scope="module")
def reranker_path(goldens):
    path = tiny_cache_dir() / "bert-reranker.gguf"
    gen = fixture_module("embeddings", "reranker.py")
    if not path.exists() or gen.sha256_of(path) != goldens["sha256"]:
        gen.build(tiny_model_file("bert"), path)
    assert gen.sha256_of(path) == goldens["sha256"], "the rebuilt reranker is not the recorded one"
    return path


@pytest.fixture(scope="module")
def reranker(reranker_path):
    return llamay.load(reranker_path, numerics="llamacpp")


def test_pair_input_is_format_rerank(reranker, goldens):
    for doc, ids in zip(goldens["documents"], goldens["pair_ids"], strict=True):
        assert reranker.rerank_tokens(goldens["query"], doc) == ids


def test_rank_head_equals_llamacpp(reranker, goldens):
    assert reranker.pooling == "rank" and reranker.has_rank_head
    for state, want in zip(goldens["cls_states"], goldens["scores"], strict=True):
        got = rank_head(reranker.weights, np.asarray(state, np.float32))
        assert got.shape == (1,)
        assert abs(float(got[0]) - want) < HEAD_TOL


def test_cls_state_equals_llamacpp(reranker, goldens):
    """The trunk under the head: the first token's final state is llama.cpp's."""
    for ids, state in zip(goldens["pair_ids"], goldens["cls_states"], strict=True):
        got = np.asarray(reranker.embed(ids, pooling="cls"))
        np.testing.assert_allclose(got, np.asarray(state, np.float32), atol=STATE_TOL)


def test_scores_equal_llamacpp(reranker, goldens):
    for ids, want in zip(goldens["pair_ids"], goldens["scores"], strict=True):
        assert abs(float(reranker.embed(ids)[0]) - want) < SCORE_TOL


@pytest.fixture(scope="module")
def rerank_server(reranker_path, serve_home):
    paths = {"rr": reranker_path, "bert": tiny_model_file("bert")}
    with running(create_app(Models(paths, use_store=False, numerics="llamacpp"))) as s:
        yield s


@pytest.mark.parametrize("route", ["/v1/rerank", "/rerank"])
def test_rerank_endpoint_runs_the_cross_encoder(rerank_server, reranker, goldens, route):
    docs = goldens["documents"]
    r = httpx.post(
        rerank_server.url + route,
        json={
            "model": "rr",
            "query": goldens["query"],
            "documents": docs,
            "top_n": 2,
            "return_documents": True,
        },
        timeout=120,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["method"] == "rank"
    # the server's scores are the model's own, ranked; and llama.cpp's within SCORE_TOL
    own = [float(reranker.embed(ids)[0]) for ids in goldens["pair_ids"]]
    want = sorted(range(len(docs)), key=lambda i: -goldens["scores"][i])[:2]
    assert [x["index"] for x in body["results"]] == want
    for x in body["results"]:
        assert abs(x["relevance_score"] - own[x["index"]]) < 1e-5
        assert abs(x["relevance_score"] - goldens["scores"][x["index"]]) < SCORE_TOL
        assert x["document"] == {"text": docs[x["index"]]}
    assert body["usage"]["prompt_tokens"] == sum(len(p) for p in goldens["pair_ids"])


def test_model_without_rank_head_says_cosine(rerank_server):
    r = httpx.post(
        rerank_server.url + "/v1/rerank",
        json={"model": "bert", "query": "a cat", "documents": ["a kitten", "stocks"]},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    assert r.json()["method"] == "embedding_cosine"
