"""llama.cpp's penalty windows in full (-1: the context, 0: off, N beyond the old 512-token
ring) against the sorted-array reference; DRY's tables built once per tokenizer; and the
batched top-N log-probabilities the engine reads per row."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from llamacpp_reference import chain

from llamay.sample import (
    HISTORY,
    Sampler,
    SamplerState,
    SamplingParams,
    final_logits,
    log_probs,
    read_logprobs,
    sample,
    top_logprobs,
)
from llamay.sample import samplers as samplers_mod

OFF = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
N_CTX = 2048  # the ring the engine keeps when it passes its context size


def _history(rng, n=1500, vocab=48):
    """A long history where tokens 40..47 occur only in its first 300 positions."""
    old = rng.integers(40, 48, 300)
    new = rng.integers(0, 40, n - 300)
    return np.concatenate([old, new]).tolist()


@pytest.mark.parametrize("last_n", [-1, 0, 7, 600, 1000, 1499, 1500, 5000])
def test_penalty_window_matches_llamacpp(last_n):
    rng = np.random.default_rng(last_n + 2)
    lg = rng.normal(0, 2, 48).astype(np.float32)
    hist = _history(rng)
    s = Sampler(
        **OFF,
        repeat_penalty=1.3,
        frequency_penalty=0.05,
        presence_penalty=0.4,
        repeat_last_n=last_n,
        samplers=["penalties"],
    )
    want = chain(lg, s, hist)  # -1: the whole history; N > len: all of it; 0: none
    p = SamplingParams.stack([s], len(lg))
    st = SamplerState.init([s], [hist], history=N_CTX)
    got = np.asarray(jax.jit(final_logits)(jnp.asarray(lg[None]), p, st))[0]
    np.testing.assert_allclose(got, [want[i] for i in range(48)], rtol=1e-5, atol=1e-6)
    far_back = got[40:] != lg[40:]  # tokens seen only more than 1200 tokens ago
    assert far_back.any() == (last_n == -1 or last_n > 1200)


def test_generated_tokens_join_a_context_long_window():
    """Tokens drawn after a long prompt count too: the ring keeps the whole context."""
    s = Sampler(**OFF, presence_penalty=100.0, repeat_last_n=-1, samplers=["penalties"], seed=1)
    prompt = [3] + [0] * 999
    st = SamplerState.init([s], [prompt], history=N_CTX)
    p = SamplingParams.stack([s], 8)
    lg = jnp.zeros((1, 8))
    seen = set()
    step = jax.jit(sample)
    for _ in range(6):
        t, st = step(lg, p, st)
        seen.add(int(t[0]))
    # 0 and 3 (the prompt) and each drawn token are crushed by the penalty afterwards
    assert seen.isdisjoint({0, 3}) and len(seen) == 6


def test_default_ring_caps_the_window():
    s = Sampler(**OFF, repeat_penalty=2.0, repeat_last_n=-1, samplers=["penalties"])
    hist = [5] + [0] * HISTORY  # token 5 falls out of a HISTORY-long ring
    p = SamplingParams.stack([s], 8)
    got = np.asarray(final_logits(jnp.ones((1, 8)), p, SamplerState.init([s], [hist])))[0]
    assert got[5] == 1.0 and got[0] == 0.5


def test_dry_tables_built_once_per_tokenizer():
    pieces = [b"a", b"b", b"\n", b"x:", b"c", b"*d"]
    s = Sampler(dry_multiplier=0.8)
    builds = samplers_mod.DRY_TABLE_BUILDS
    before = dict(builds)

    def n(kind):
        return builds[kind] - before.get(kind, 0)

    def encode(text):
        return [pieces.index(c.encode()) for c in text]

    for _ in range(5):  # five requests, one tokenizer
        p = SamplingParams.stack([s, s, Sampler()], len(pieces), pieces, encode)
    assert (n("breakers"), n("restarts")) == (1, 1)
    assert np.asarray(p.dry_breakers)[0].tolist() == [False, False, True, True, False, True]
    SamplingParams.stack([Sampler(dry_multiplier=0.8, dry_sequence_breakers=("b",))], 6, pieces)
    assert n("breakers") == 2  # other breakers: another table
    SamplingParams.stack([s], 6, list(pieces))
    assert n("breakers") == 3  # another tokenizer's pieces (a new list): rebuilt


def test_top_logprobs_per_row_from_one_batched_step():
    rng = np.random.default_rng(0)
    B, V = 3, 40
    lg = rng.normal(0, 3, (B, V)).astype(np.float32)
    # rows with different samplers (a greedy one, a biased one): the reported
    # log-probabilities are the model's, before any sampler, per row
    ss = [
        Sampler(temperature=0.0, n_probs=5, seed=1),
        Sampler(temperature=0.7, top_k=3, n_probs=5, seed=2, logit_bias={7: 5.0}),
        Sampler(**OFF, n_probs=5, seed=3),
    ]
    p = SamplingParams.stack(ss, V)
    tok, st = jax.jit(sample)(jnp.asarray(lg), p, SamplerState.init(ss))
    x = lg.astype(np.float64)
    ref = x - x.max(-1, keepdims=True)
    ref = ref - np.log(np.exp(ref).sum(-1, keepdims=True))
    rows = read_logprobs(st, [0, 1, 2], [5, 2, 0])
    for r, n in enumerate([5, 2, 0]):
        chosen, top = rows[r]
        want_ids = np.argsort(-ref[r], kind="stable")[:n].tolist()
        assert [i for i, _ in top] == want_ids
        np.testing.assert_allclose([v for _, v in top], ref[r, want_ids], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(chosen, ref[r, int(tok[r])], rtol=1e-5, atol=1e-5)
    assert int(tok[0]) == int(np.argmax(lg[0]))
    ids, lps = jax.jit(top_logprobs, static_argnums=1)(log_probs(jnp.asarray(lg)), 3)
    assert ids.shape == lps.shape == (B, 3) and ids.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(ids), np.asarray(st.top_ids)[:, :3])
    with pytest.raises(ValueError, match="asks for 6"):
        read_logprobs(st, [1], [6])
