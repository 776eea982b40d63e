"""Samplers against llama.cpp's definitions (llama-sampling.cpp): top-k keeps the k most
likely; top-p the shortest prefix whose mass reaches p; min-p tokens with p >= min_p·p_max;
temperature divides the logits of what is left; 0 means greedy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llamay.errors import RequestError
from llamay.sample import Sampler, SamplingParams, sample, seed_keys

sample_jit = jax.jit(sample)


def allowed_set(logits: np.ndarray, s: Sampler) -> set[int]:
    """The candidates llama.cpp's chain top-k → top-p → min-p leaves (min_keep 1)."""
    order = np.argsort(-logits, kind="stable")
    cand = order[: s.top_k] if s.top_k > 0 else order
    p = np.exp(logits[cand] - logits[cand].max())
    p /= p.sum()
    if s.top_p < 1.0:
        cum = np.cumsum(p)
        n = int(np.searchsorted(cum, s.top_p) + 1)
        cand, p = cand[:n], p[:n]
    if s.min_p > 0:
        keep = p >= s.min_p * p.max()
        cand = cand[keep]
    return set(cand.tolist())


def draw(logits: np.ndarray, s: Sampler, n: int) -> np.ndarray:
    lg = jnp.asarray(np.repeat(logits[None], n, axis=0))
    keys = seed_keys([Sampler(seed=i) for i in range(n)])
    toks, _ = sample_jit(lg, SamplingParams.stack([s] * n), keys)
    return np.asarray(toks)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    top_k=st.integers(0, 12),
    top_p=st.floats(0.05, 1.0),
    min_p=st.floats(0.0, 0.5),
)
def test_draws_stay_in_llamacpp_candidate_set(seed, top_k, top_p, min_p):
    logits = np.random.default_rng(seed).normal(0, 2, 32).astype(np.float32)
    s = Sampler(temperature=1.0, top_k=top_k, top_p=top_p, min_p=min_p)
    got = set(draw(logits, s, 64).tolist())
    assert got <= allowed_set(logits, s)


def test_frequencies_follow_tempered_softmax():
    logits = np.array([2.0, 1.5, 1.0, 0.0, -1.0, -3.0], np.float32)
    s = Sampler(temperature=0.7, top_k=0, top_p=1.0, min_p=0.0)
    toks = draw(logits, s, 4000)
    freq = np.bincount(toks, minlength=6) / len(toks)
    expect = np.exp(logits / 0.7) / np.exp(logits / 0.7).sum()
    np.testing.assert_allclose(freq, expect, atol=0.03)


def test_greedy_and_top_k_1_are_argmax():
    logits = np.random.default_rng(0).normal(size=(5, 100)).astype(np.float32)
    keys = seed_keys([Sampler(seed=i) for i in range(5)])
    for s in (Sampler(temperature=0.0), Sampler(temperature=1.5, top_k=1)):
        toks, _ = sample_jit(jnp.asarray(logits), SamplingParams.stack([s] * 5), keys)
        np.testing.assert_array_equal(np.asarray(toks), logits.argmax(1))


def test_same_seed_same_draws_new_keys_differ():
    logits = jnp.asarray(np.random.default_rng(1).normal(size=(1, 1000)).astype(np.float32))
    s = Sampler(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=42)
    p = SamplingParams.stack([s])
    a, ka = sample_jit(logits, p, seed_keys([s]))
    b, kb = sample_jit(logits, p, seed_keys([s]))
    assert int(a[0]) == int(b[0])
    seq = []
    k = seed_keys([s])
    for _ in range(20):
        t, k = sample_jit(logits, p, k)
        seq.append(int(t[0]))
    assert len(set(seq)) > 1  # the key advances between steps


@pytest.mark.parametrize(
    "kwargs",
    [dict(temperature=-1), dict(top_k=-2), dict(top_p=0.0), dict(top_p=1.5), dict(min_p=2.0)],
)
def test_invalid_parameters_are_request_errors(kwargs):
    with pytest.raises(RequestError):
        Sampler(**kwargs)
