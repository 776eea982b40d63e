"""The tiny random bert encoder: per-token states and pooled embeddings against its
float64 reference and llama.cpp (tests/fixtures/tiny/README.md)."""

from __future__ import annotations

import numpy as np
import pytest
from fixture_data import tiny_model_file

import llamay

EXACT_TOL = 1e-3
LLAMACPP_TOL = 0.06  # the README measures 0.023 between llama.cpp and exact
# llamay's llama.cpp numerics against llama.cpp itself: 9.6e-7 measured (max abs, per token;
# the trunk's attention over an f32 K/V as llama.cpp's cacheless encoder computes it)
NUMERICS_TOL = 1e-5


@pytest.fixture(scope="module")
def bert(tiny_dir):
    m = llamay.load(tiny_model_file("bert"))
    return m, np.load(tiny_dir / "bert.exact.npz"), np.load(tiny_dir / "bert.llamacpp.npz")


@pytest.mark.parametrize("seq", ["a", "b"])
@pytest.mark.parametrize("ref_name, tol", [("exact", EXACT_TOL), ("llamacpp", LLAMACPP_TOL)])
def test_embeddings(bert, seq, ref_name, tol):
    m, exact, llamacpp = bert
    ref = exact if ref_name == "exact" else llamacpp
    ids = ref[f"tokens_{seq}"].tolist()
    assert m.config.pooling == "mean"
    np.testing.assert_allclose(m.embed(ids, pooling="none"), ref[f"embd_tok_{seq}"], atol=tol)
    np.testing.assert_allclose(m.embed(ids), ref[f"embd_mean_{seq}"], atol=tol)
    np.testing.assert_allclose(m.embed(ids, pooling="cls"), ref[f"embd_cls_{seq}"], atol=tol)


@pytest.fixture(scope="module")
def bert_llamacpp(tiny_dir):
    m = llamay.load(tiny_model_file("bert"), numerics="llamacpp")
    return m, np.load(tiny_dir / "bert.llamacpp.npz")


@pytest.mark.parametrize("seq", ["a", "b"])
def test_llamacpp_numerics_equal_llamacpp(bert_llamacpp, seq):
    """In llama.cpp numerics every token's final state is llama.cpp's (to float32 noise),
    not only the pooled ones: the trunk, layer by layer, computes what llama.cpp does."""
    m, ref = bert_llamacpp
    ids = ref[f"tokens_{seq}"].tolist()
    tol = NUMERICS_TOL
    np.testing.assert_allclose(m.embed(ids, pooling="none"), ref[f"embd_tok_{seq}"], atol=tol)
    np.testing.assert_allclose(m.embed(ids), ref[f"embd_mean_{seq}"], atol=tol)
    np.testing.assert_allclose(m.embed(ids, pooling="cls"), ref[f"embd_cls_{seq}"], atol=tol)


def test_attention_is_not_causal(bert):
    """The first token's state depends on later tokens. (Padding does not leak in: the
    24-token sequences above run in a 32-slot bucket.)"""
    m, exact, _ = bert
    ids = exact["tokens_a"].tolist()
    full = m.embed(ids, pooling="none")
    changed = m.embed(ids[:-1] + [ids[-1] + 1], pooling="none")
    assert np.abs(full[0] - changed[0]).max() > 1e-4
