"""Decoder-model embeddings through the servers (`llamay serve --pooling mean`): OpenAI's
/v1/embeddings (the official client) and Ollama's /api/embed give llama.cpp's pooled
vectors (goldens in tests/fixtures/embeddings) normalised as llama-server's default
(embd_normalize 2); pooling none is a clear 400, as llama-server's OAI endpoint has it."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from fixture_data import fixture, oracle, tiny_model_file

from llamay.serve import create_app
from llamay.serve.models import Models
from tests.serve.conftest import running


@pytest.fixture(scope="module")
def servers(serve_home):
    path = tiny_model_file("llama")
    mean = Models({"tiny": path}, use_store=False, numerics="llamacpp", pooling="mean")
    plain = Models({"tiny": path}, use_store=False, numerics="llamacpp")
    with running(create_app(mean)) as a, running(create_app(plain)) as b:
        yield a, b


def test_openai_embeddings_of_a_decoder_equal_llamacpp(servers):
    openai = oracle("openai")
    g = np.load(fixture("embeddings", "llama.npz"))
    client = openai.OpenAI(base_url=servers[0].url + "/v1", api_key="x")
    ids = [g[f"ids/{i}"].tolist() for i in range(3)]
    out = client.embeddings.create(model="tiny", input=ids)
    for i, item in enumerate(out.data):
        want = g[f"mean/{i}"] / np.linalg.norm(g[f"mean/{i}"])
        got = np.asarray(item.embedding)
        assert abs(np.linalg.norm(got) - 1) < 1e-5
        assert float(got @ want) > 1 - 1e-4


def test_ollama_embed_of_a_decoder_is_the_mean_pooled_vector(servers):
    g = np.load(fixture("embeddings", "llama.npz"))
    r = httpx.post(
        servers[0].url + "/api/embed",
        json={"model": "tiny", "input": "The capital of France is Paris."},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    got = np.asarray(r.json()["embeddings"][0])
    # the goldens' first prompt is this text, tokenized by llama.cpp
    want = g["mean/0"] / np.linalg.norm(g["mean/0"])
    assert r.json()["prompt_eval_count"] == len(g["ids/0"])
    assert float(got @ want) > 1 - 1e-4


def test_pooling_none_is_refused_clearly(servers):
    r = httpx.post(
        servers[1].url + "/v1/embeddings", json={"model": "tiny", "input": "hi"}, timeout=120
    )
    assert r.status_code == 400 and "--pooling" in r.text


def test_llamacpp_embedding_endpoint(servers):
    """llama-server's /embedding: pooling none gives every token's unnormalised vector,
    a pooled model one vector normalised by embd_normalize (2 by default, -1 none)."""
    g = np.load(fixture("embeddings", "llama.npz"))
    ids = g["ids/1"].tolist()
    mean, plain = (s.url for s in servers)
    r = httpx.post(plain + "/embedding", json={"content": ids}, timeout=120)
    assert r.status_code == 200, r.text
    (item,) = r.json()
    got = np.asarray(item["embedding"])
    assert item["index"] == 0 and got.shape == g["none/1"].shape
    np.testing.assert_allclose(got, g["none/1"], rtol=1e-4, atol=1e-5)
    r = httpx.post(mean + "/embeddings", json={"content": [ids], "embd_normalize": -1}, timeout=120)
    np.testing.assert_allclose(r.json()[0]["embedding"][0], g["mean/1"], rtol=1e-4, atol=1e-5)
    r = httpx.post(mean + "/embedding", json={"content": ids}, timeout=120)
    want = g["mean/1"] / np.linalg.norm(g["mean/1"])
    np.testing.assert_allclose(r.json()[0]["embedding"][0], want, rtol=1e-4, atol=1e-5)
