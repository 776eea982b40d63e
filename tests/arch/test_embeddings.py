"""Decoder-model embeddings against llama.cpp (llama-cpp-python, `embedding=True`, each
pooling), on the tiny models and SmolLM2: goldens in tests/fixtures/embeddings (README.md),
held within 1e-4 cosine; and llama.cpp's embd_normalize modes against their formulas."""

from __future__ import annotations

import numpy as np
import pytest
from fixture_data import fixture, tiny_model_file

import llamay
from llamay.errors import RequestError
from llamay.model.embed import normalize

POOLINGS = ("none", "mean", "cls", "last")
TINY_DECODERS = (
    "llama",
    "qwen2",
    "qwen3",
    "qwen3moe",
    "gemma2",
    "gemma3",
    "phi3",
    "olmo2",
    "starcoder2",
)
COS_TOL = 1e-4


def _cosine_gap(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.atleast_2d(a).astype(np.float64), np.atleast_2d(b).astype(np.float64)
    cos = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
    return float(np.max(1 - cos))


def _check(model, goldens) -> None:
    n = len([k for k in goldens.files if k.startswith("ids/")])
    assert n >= 3
    for i in range(n):
        ids = goldens[f"ids/{i}"].tolist()
        for kind in POOLINGS:
            want = goldens[f"{kind}/{i}"]
            got = model.embed(ids, pooling=kind)
            assert got.shape == want.shape, (kind, i)
            assert _cosine_gap(got, want) < COS_TOL, (kind, i, _cosine_gap(got, want))


@pytest.mark.parametrize("name", TINY_DECODERS)
def test_tiny_decoder_embeddings_equal_llamacpp(name):
    model = llamay.load(tiny_model_file(name), numerics="llamacpp")
    assert model.pooling == "none"  # no <arch>.pooling_type: llama.cpp's default too
    _check(model, np.load(fixture("embeddings", f"{name}.npz")))


def test_smollm2_embeddings_equal_llamacpp(smollm2_path):
    model = llamay.load(smollm2_path, numerics="llamacpp")
    _check(model, np.load(fixture("embeddings", "smollm2.npz")))


def test_exact_numerics_embeddings_close_to_llamacpp():
    """The float32 path differs from llama.cpp only by its roundings: still the same vector."""
    model = llamay.load(tiny_model_file("llama"))
    g = np.load(fixture("embeddings", "llama.npz"))
    got = model.embed(g["ids/0"].tolist(), pooling="mean")
    assert _cosine_gap(got, g["mean/0"]) < 1e-3


def test_pooling_from_the_call_and_clear_errors():
    model = llamay.load(tiny_model_file("llama"))
    with pytest.raises(RequestError, match="unknown pooling 'max'"):
        model.embed([1, 2, 3], pooling="max")
    with pytest.raises(RequestError, match="no rank head"):
        model.embed([1, 2, 3], pooling="rank")
    with pytest.raises(RequestError, match="empty"):
        model.embed([], pooling="mean")
    model.pooling = "last"  # what `llamay serve --pooling last` sets
    np.testing.assert_array_equal(model.embed([5, 6, 7]), model.embed([5, 6, 7], pooling="last"))


def test_normalize_modes_follow_common_embd_normalize():
    rng = np.random.default_rng(3)
    v = rng.standard_normal(32).astype(np.float32)
    np.testing.assert_allclose(normalize(v, -1), v)
    np.testing.assert_allclose(np.linalg.norm(normalize(v, 2)), 1.0, rtol=1e-6)
    np.testing.assert_allclose(np.abs(normalize(v, 1)).sum(), 1.0, rtol=1e-6)
    np.testing.assert_allclose(np.abs(normalize(v, 0)).max(), 32760.0, rtol=1e-6)
    p3 = normalize(v, 3)
    np.testing.assert_allclose((np.abs(p3.astype(np.float64)) ** 3).sum(), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(normalize(np.zeros(4, np.float32), 2), np.zeros(4))
