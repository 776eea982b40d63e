"""Samplers against llama.cpp's definitions (llama-sampling.cpp), each checked on a
small distribution whose surviving candidates and logits are worked out by hand in
the test (the chain's pre-draw logits are compared whole), plus the draw's
frequencies, seeded determinism and the per-slot state (history ring, mirostat mu)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llamay.errors import RequestError
from llamay.sample import Sampler, SamplerState, SamplingParams, final_logits, sample
from llamay.sample.chain import ordered_history

sample_jit = jax.jit(sample)
final_jit = jax.jit(final_logits)
OFF = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)  # a pure softmax draw


def run_final(logits, s: Sampler, history=(), pieces=None, mask=None):
    """The logits the draw sees for one row, in vocabulary order (-inf = excluded)."""
    lg = np.asarray(logits, np.float32)
    p = SamplingParams.stack([s], len(lg), pieces)
    state = SamplerState.init([s], [history])
    out = final_jit(jnp.asarray(lg[None]), p, state, mask)
    return np.asarray(out[0])


def kept(x) -> set[int]:
    return set(np.flatnonzero(np.isfinite(x)).tolist())


P4 = np.log(np.array([0.5, 0.3, 0.15, 0.05]))  # candidates with known probabilities


def test_top_k_keeps_the_k_best():
    x = run_final([0.1, 3.0, 2.0, -1.0, 2.5], Sampler(**{**OFF, "top_k": 2}, samplers=["top_k"]))
    assert kept(x) == {1, 4}


@pytest.mark.parametrize(
    "p, want", [(0.45, {0}), (0.75, {0, 1}), (0.85, {0, 1, 2}), (1.0, {0, 1, 2, 3})]
)
def test_top_p_keeps_shortest_prefix_reaching_p(p, want):
    # cumulative mass 0.5, 0.8, 0.95, 1.0: a token is kept while the mass before it is < p
    assert kept(run_final(P4, Sampler(**{**OFF, "top_p": p}, samplers=["top_p"]))) == want


def test_min_p_scales_with_the_best_probability():
    # 0.25 · 0.5 = 0.125: 0.15 stays, 0.05 goes
    assert kept(run_final(P4, Sampler(**{**OFF, "min_p": 0.25}, samplers=["min_p"]))) == {0, 1, 2}


@pytest.mark.parametrize("p, want", [(0.2, {1}), (0.5, {0, 1}), (0.9, {0, 1, 2})])
def test_typical_p_keeps_most_typical_first(p, want):
    # H = 1.142 nats; |surprise - H| = 0.449, 0.062, 0.755, 1.854 → typical order 1, 0, 2, 3
    # with masses 0.3, 0.5, 0.15: kept while the mass before is <= p
    assert kept(run_final(P4, Sampler(**{**OFF, "typical_p": p}, samplers=["typ_p"]))) == want


def test_top_n_sigma_keeps_within_n_std_of_max():
    # mean 1, population std sqrt(2): keep logits >= 3 - 1.414
    x = run_final(
        [3.0, 2.0, 1.0, 0.0, -1.0], Sampler(**OFF, top_n_sigma=1.0, samplers=["top_n_sigma"])
    )
    assert kept(x) == {0, 1}
    x = run_final(
        [3.0, 2.0, 1.0, 0.0, -1.0], Sampler(**OFF, top_n_sigma=2.0, samplers=["top_n_sigma"])
    )
    assert kept(x) == {0, 1, 2}  # 3 - 2.83 = 0.17


def test_xtc_drops_all_above_threshold_but_the_least_likely():
    lg = np.log([0.4, 0.3, 0.2, 0.1])
    s = Sampler(**OFF, xtc_probability=1.0, xtc_threshold=0.25, samplers=["xtc"])
    assert kept(run_final(lg, s)) == {1, 2, 3}
    s = Sampler(**OFF, xtc_probability=1.0, xtc_threshold=0.35, samplers=["xtc"])
    assert kept(run_final(lg, s)) == {0, 1, 2, 3}  # only one above: nothing removed
    s = Sampler(**OFF, xtc_probability=0.0, xtc_threshold=0.25, samplers=["xtc"])
    assert kept(run_final(lg, s)) == {0, 1, 2, 3}


def test_temperature_divides_and_zero_is_greedy():
    lg = np.array([1.0, 3.0, -2.0], np.float32)
    np.testing.assert_allclose(run_final(lg, Sampler(**{**OFF, "temperature": 0.5})), lg / 0.5)
    assert kept(run_final(lg, Sampler(**{**OFF, "temperature": 0.0}))) == {1}


def test_dynamic_temperature_follows_normalised_entropy():
    lg = np.log([0.75, 0.25]).astype(np.float32)
    H = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    t, r, e = 1.0, 0.5, 2.0
    dyn = (t - r) + (2 * r) * (H / math.log(2)) ** e
    s = Sampler(**{**OFF, "temperature": t}, dynatemp_range=r, dynatemp_exponent=e)
    np.testing.assert_allclose(run_final(lg, s), lg / dyn, rtol=1e-5)


def test_penalties_over_last_n():
    lg = [2.0, -1.0, 1.0, 0.5]
    s = Sampler(
        **OFF,
        repeat_penalty=2.0,
        frequency_penalty=0.1,
        presence_penalty=0.3,
        samplers=["penalties"],
    )
    # token 0 seen twice (positive: divided), token 1 once (negative: multiplied)
    want = [2.0 / 2 - 0.2 - 0.3, -1.0 * 2 - 0.1 - 0.3, 1.0, 0.5]
    np.testing.assert_allclose(run_final(lg, s, history=[0, 1, 0]), want, rtol=1e-6)
    s1 = Sampler(
        **OFF,
        repeat_penalty=2.0,
        frequency_penalty=0.1,
        presence_penalty=0.3,
        repeat_last_n=1,
        samplers=["penalties"],
    )
    np.testing.assert_allclose(
        run_final(lg, s1, history=[0, 1, 0]), [0.6, -1.0, 1.0, 0.5], rtol=1e-6
    )


PIECES = [b"a", b"b", b"c", b"y", b"\n", b"z"]


def test_dry_llamacpp_example():
    # llama.cpp's own example: last tokens a b c c b c y a b c have repeat counts
    # 0 0 3 1 0 2 0 0 0 0: emitting c would make a repeat of 4 (3 + 1), y one of 3.
    a, b, c, y = 0, 1, 2, 3
    hist = [a, b, c, c, b, c, y, a, b, c]
    s = Sampler(**OFF, dry_multiplier=0.8, dry_base=1.75, dry_allowed_length=2, samplers=["dry"])
    x = run_final(np.zeros(6), s, history=hist, pieces=PIECES)
    np.testing.assert_allclose(x, [0, 0, -0.8 * 1.75 ** (3 - 2), -0.8 * 1.75**0, 0, 0], rtol=1e-6)


def test_dry_sequence_breaker_limits_the_match():
    a, b, nl = 0, 1, 4
    s = Sampler(**OFF, dry_multiplier=1.0, dry_allowed_length=1, samplers=["dry"])
    # a b a b: the suffix "a b" also ends at position 1 → emitting a is penalised base^(2-1)
    x = run_final(np.zeros(6), s, history=[a, b, a, b], pieces=PIECES)
    np.testing.assert_allclose(x, [-1.75, 0, 0, 0, 0, 0], rtol=1e-6)
    # a b \n a b: the breaker caps the match at 2 → still base^1 for \n? no: \n is a
    # breaker itself (never penalised); a b before it matches the suffix with length 2
    x = run_final(np.zeros(6), s, history=[a, b, nl, a, b], pieces=PIECES)
    np.testing.assert_allclose(x, np.zeros(6))
    # newest token is a breaker: no repetition can continue
    x = run_final(np.zeros(6), s, history=[a, nl, a, nl], pieces=PIECES)
    np.testing.assert_allclose(x, np.zeros(6))


def test_logit_bias_and_mask_come_first():
    lg = [1.0, 2.0, 3.0, 0.0]
    s = Sampler(**OFF, logit_bias={0: 5.0, 2: -math.inf}, samplers=[])
    x = run_final(lg, s)
    assert x[0] == 6.0 and x[2] == -np.inf and x[1] == 2.0
    mask = jnp.asarray(np.array([[0b1010]], np.uint32))  # tokens 1 and 3
    assert kept(run_final(lg, Sampler(**OFF), mask=mask)) == {1, 3}


def test_order_is_respected():
    # penalties first change which token top_k keeps; top_k first keeps the penalised one
    lg = [2.0, 1.5, 0.0]
    base = dict(**{**OFF, "top_k": 1}, repeat_penalty=4.0)
    assert kept(run_final(lg, Sampler(**base, samplers=["penalties", "top_k"]), history=[0])) == {1}
    assert kept(run_final(lg, Sampler(**base, samplers=["top_k", "penalties"]), history=[0])) == {0}


def test_mirostat_v2_truncates_by_surprise_and_updates_mu():
    lg = jnp.asarray(np.log([[0.9, 0.09, 0.01]]).astype(np.float32))
    s = Sampler(temperature=1.0, mirostat=2, mirostat_tau=1.5, mirostat_eta=0.1, seed=0)
    state = SamplerState.init([s])  # mu = 2·tau = 3 bits: only token 0 (0.15 bits) survives
    tok, state = sample_jit(lg, SamplingParams.stack([s]), state)
    assert int(tok[0]) == 0
    # renormalised p = 1 → surprise 0; mu = 3 - 0.1·(0 - 1.5)
    np.testing.assert_allclose(float(state.mu[0]), 3.15, rtol=1e-6)


def test_mirostat_v1_top_k_from_zipf_estimate():
    V, s_exp, tau, eta = 64, 1.5, 2.0, 0.1
    lg = -s_exp * np.log(np.arange(1, V + 1)).astype(np.float32)  # Zipf: s_hat = s exactly
    mu = 2 * tau
    eps = s_exp - 1
    k = int((eps * 2**mu / (1 - V ** (-eps))) ** (1 / s_exp))
    s = Sampler(temperature=1.0, mirostat=1, mirostat_tau=tau, mirostat_eta=eta)
    B = 256
    states = SamplerState.init([Sampler(mirostat=1, mirostat_tau=tau, seed=i) for i in range(B)])
    toks, new = sample_jit(
        jnp.asarray(np.repeat(lg[None], B, 0)), SamplingParams.stack([s] * B), states
    )
    toks = np.asarray(toks)
    assert toks.max() < k and len(set(toks.tolist())) > 1
    p = np.exp(lg[:k]) / np.exp(lg[:k]).sum()
    np.testing.assert_allclose(np.asarray(new.mu), mu - eta * (-np.log2(p[toks]) - tau), rtol=1e-4)


def test_history_ring_and_logprobs():
    s = Sampler(**OFF, n_probs=2, seed=0)
    state = SamplerState.init([s], [[7, 8, 9]], history=4)
    lg = jnp.asarray(np.log([[0.1, 0.6, 0.3]]).astype(np.float32))
    p = SamplingParams.stack([s])
    toks = []
    for _ in range(3):
        t, state = sample_jit(lg, p, state)
        toks.append(int(t[0]))
    h, n = ordered_history(state)
    assert np.asarray(h)[0].tolist() == [9, *toks] and int(n[0]) == 4
    np.testing.assert_allclose(np.asarray(state.top_logprobs)[0], np.log([0.6, 0.3]), rtol=1e-5)
    assert np.asarray(state.top_ids)[0].tolist() == [1, 2]
    np.testing.assert_allclose(
        float(state.token_logprob[0]), math.log([0.1, 0.6, 0.3][toks[-1]]), rtol=1e-5
    )


# -- the draw --------------------------------------------------------------------------------


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
    state = SamplerState.init([Sampler(seed=i) for i in range(n)])
    toks, _ = sample_jit(lg, SamplingParams.stack([s] * n), state)
    return np.asarray(toks)


@settings(max_examples=20, deadline=None)
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


def test_frequencies_after_top_k_follow_its_tempered_softmax():
    """Past a top-k cut the draw reads top-k's view of the best logits only
    (`top_k_view`): the frequencies are still the tempered softmax of the k kept, over a
    vocabulary larger than the view."""
    logits = np.random.default_rng(4).normal(-4.0, 0.5, size=2000).astype(np.float32)
    best = np.array([1700, 3, 911, 1500])  # spread over the vocabulary, in no order
    logits[best] = [2.0, 1.5, 1.0, 0.0]
    s = Sampler(temperature=0.7, top_k=4, top_p=1.0, min_p=0.0)
    toks = draw(logits, s, 4000)
    assert set(toks.tolist()) <= set(best.tolist())
    freq = np.array([np.mean(toks == b) for b in best])
    expect = np.exp(logits[best] / 0.7) / np.exp(logits[best] / 0.7).sum()
    np.testing.assert_allclose(freq, expect, atol=0.03)


def test_ties_past_the_view_are_drawn_from_all_the_kept():
    """top-k keeps every candidate tied at its cut; where they outnumber the view, the
    draw is over the whole vocabulary (tokens past the view's 512 do come up)."""
    logits = np.zeros(1500, np.float32)
    toks = draw(logits, Sampler(temperature=1.0, top_k=1, top_p=1.0, min_p=0.0), 600)
    assert toks.max() >= 512 and len(set(toks.tolist())) > 300


def test_greedy_and_top_k_1_are_argmax():
    logits = np.random.default_rng(0).normal(size=(5, 100)).astype(np.float32)
    state = SamplerState.init([Sampler(seed=i) for i in range(5)])
    for s in (Sampler(temperature=0.0), Sampler(temperature=1.5, top_k=1)):
        toks, _ = sample_jit(jnp.asarray(logits), SamplingParams.stack([s] * 5), state)
        np.testing.assert_array_equal(np.asarray(toks), logits.argmax(1))


def test_greedy_row_keeps_cuts_a_later_stage_could_overturn():
    """A greedy row skips top-k only where no later stage can change the best candidate:
    here the penalty after top-k = 1 pushes the best below the second, and top-k still
    decides (llama.cpp's chain in this order draws token 0)."""
    lg = np.array([3.0, 2.9, 0.0, -1.0], np.float32)
    greedy = dict(temperature=0.0, top_k=1, repeat_penalty=2.0)
    s = Sampler(**greedy, samplers="top_k;penalties;temperature")
    p = SamplingParams.stack([s], 4)
    toks, _ = sample_jit(jnp.asarray(lg[None]), p, SamplerState.init([s], [[0]]))
    assert int(toks[0]) == 0
    swapped = Sampler(**greedy, samplers="penalties;top_k;temperature")
    p = SamplingParams.stack([swapped], 4)
    toks, _ = sample_jit(jnp.asarray(lg[None]), p, SamplerState.init([swapped], [[0]]))
    assert int(toks[0]) == 1  # penalised first: 3.0 / 2 = 1.5 < 2.9


def test_argmax_is_numpys_first_maximum():
    """The sampler's argmax (two plain reductions, fast on XLA CPU) is numpy's: the first
    index of the maximum, ties and -inf rows included; a row of NaNs gives 0."""
    from llamay.sample.chain import argmax

    rng = np.random.default_rng(3)
    x = rng.integers(-3, 4, size=(6, 49152)).astype(np.float32)  # many ties at the max
    x[1] = -np.inf
    x[2, 7] = np.inf
    x[3, :100] = -np.inf
    got = np.asarray(jax.jit(argmax)(jnp.asarray(x)))
    np.testing.assert_array_equal(got, x.argmax(1))
    nan = np.full((1, 10), np.nan, np.float32)
    assert int(argmax(jnp.asarray(nan))[0]) == 0


def test_same_seed_same_draws_new_keys_differ():
    logits = jnp.asarray(np.random.default_rng(1).normal(size=(1, 1000)).astype(np.float32))
    s = Sampler(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=42)
    p = SamplingParams.stack([s])
    a, _ = sample_jit(logits, p, SamplerState.init([s]))
    b, _ = sample_jit(logits, p, SamplerState.init([s]))
    assert int(a[0]) == int(b[0])
    seq = []
    state = SamplerState.init([s])
    for _ in range(20):
        t, state = sample_jit(logits, p, state)
        seq.append(int(t[0]))
    assert len(set(seq)) > 1  # the key advances between steps


def test_per_slot_parameters_in_one_batch():
    lg = np.log(np.array([[0.5, 0.3, 0.15, 0.05]] * 2, np.float32))
    a = Sampler(**{**OFF, "top_k": 1})
    b = Sampler(**{**OFF, "top_p": 0.85})
    p = SamplingParams.stack([a, b])
    out = np.asarray(final_jit(jnp.asarray(lg), p, SamplerState.init([a, b])))
    assert kept(out[0]) == {0} and kept(out[1]) == {0, 1, 2}


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(temperature=-1),
        dict(top_k=-2),
        dict(top_p=0.0),
        dict(top_p=1.5),
        dict(min_p=2.0),
        dict(samplers=["top_k", "bogus"]),
        dict(mirostat=3),
        dict(repeat_last_n=-2),
        dict(dry_penalty_last_n=-2),
    ],
)
def test_invalid_parameters_are_request_errors(kwargs):
    with pytest.raises(RequestError):
        Sampler(**kwargs)


def test_mixed_plans_in_one_batch_are_refused():
    with pytest.raises(RequestError, match="sampler order"):
        SamplingParams.stack([Sampler(), Sampler(mirostat=2)])


def test_cuts_beyond_the_sorted_view_fall_back_to_a_full_sort():
    from llamay.sample.chain import VIEW

    V = 4 * VIEW
    lg = np.random.default_rng(0).normal(0, 0.01, V).astype(np.float32)
    order = np.argsort(-lg, kind="stable")
    x = run_final(lg, Sampler(**{**OFF, "top_k": VIEW + 88}, samplers=["top_k"]))
    assert kept(x) == set(order[: VIEW + 88].tolist())
    p = np.exp(lg - lg.max())
    p /= p.sum()
    n = int(np.searchsorted(np.cumsum(p[order]), 0.6) + 1)
    assert n > VIEW
    x = run_final(lg, Sampler(**{**OFF, "top_p": 0.6}, samplers=["top_p"]))
    assert abs(len(kept(x)) - n) <= 1  # float32 cumulative sums may differ at the boundary


# A few orders (each compiles once): llama.cpp's default, reversed, and a shuffle.
ORDERS = [
    ("penalties", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"),
    ("temperature", "xtc", "min_p", "top_p", "typ_p", "top_k", "top_n_sigma", "penalties"),
    ("top_p", "penalties", "temperature", "top_k", "xtc", "typ_p", "min_p", "top_n_sigma"),
]


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    order=st.sampled_from(ORDERS),
    top_k=st.integers(0, 20),
    top_p=st.sampled_from([1.0, 0.5, 0.9]),
    min_p=st.sampled_from([0.0, 0.05, 0.2]),
    typical_p=st.sampled_from([1.0, 0.5, 0.9]),
    top_n_sigma=st.sampled_from([-1.0, 1.0, 2.0]),
    xtc=st.sampled_from([0.0, 1.0]),
    temp=st.sampled_from([0.0, 0.7, 1.3]),
    dyn=st.sampled_from([0.0, 0.5]),
    min_keep=st.integers(0, 3),
    pen=st.booleans(),
)
def test_chain_matches_llamacpp_sorted_array_reference(
    seed, order, top_k, top_p, min_p, typical_p, top_n_sigma, xtc, temp, dyn, min_keep, pen
):
    """The device chain (vocabulary order, thresholds) against a restatement of llama.cpp's
    chain over a shrinking sorted candidate array, any order, any combination (greedy
    rows, temp 0, skip the cuts that cannot change their token: `greedy_after`)."""
    from llamacpp_reference import chain

    rng = np.random.default_rng(seed)
    lg = rng.normal(0, 2, 48).astype(np.float32)
    hist = rng.integers(0, 48, 10).tolist()
    s = Sampler(
        temperature=temp,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        typical_p=typical_p,
        top_n_sigma=top_n_sigma,
        xtc_probability=xtc,
        xtc_threshold=0.1,
        dynatemp_range=dyn,
        repeat_penalty=1.2 if pen else 1.0,
        frequency_penalty=0.1 if pen else 0.0,
        presence_penalty=0.2 if pen else 0.0,
        min_keep=min_keep,
        samplers=order,
    )
    want = chain(lg, s, hist)
    got = run_final(lg, s, history=hist)
    assert kept(got) == set(want), (sorted(kept(got)), sorted(want))
    np.testing.assert_allclose(
        [got[i] for i in sorted(want)], [want[i] for i in sorted(want)], rtol=2e-5, atol=2e-5
    )


def test_dry_breaker_spread_over_tokens():
    # breaker "ab": "xa" ends with its start, so "xa" followed by "b" is a restart
    # sequence (llama.cpp's get_overlapping_token_sequences); "ab" itself is a single-token
    # breaker. History z xa b c q y z xa b c q: the newest breaker starts 3 tokens back
    # and spans 2, so repeats are capped at 3 - 1 = 2 tokens; the earlier "z xa b c q"
    # matches 5 tokens, capped to 2, so y (which followed it) gets 1.75^(2 - 1).
    pieces = [b"a", b"b", b"c", b"xa", b"ab", b"q", b"y", b"z"]
    ids = {p.decode(): i for i, p in enumerate(pieces)}
    z, xa, b, c, q, y = (ids[k] for k in ("z", "xa", "b", "c", "q", "y"))
    hist = [z, xa, b, c, q, y, z, xa, b, c, q]
    s = Sampler(
        **OFF,
        dry_multiplier=1.0,
        dry_allowed_length=1,
        dry_sequence_breakers=("ab",),
        samplers=["dry"],
    )
    p = SamplingParams.stack([s], len(pieces), pieces, encode=lambda t: [ids[ch] for ch in t])
    assert p.dry_tails is not None
    out = np.asarray(final_jit(jnp.zeros((1, len(pieces))), p, SamplerState.init([s], [hist])))
    want = np.zeros(len(pieces))
    want[y] = -(1.75 ** (2 - 1))
    np.testing.assert_allclose(out[0], want, rtol=1e-6)
    # without the tokenizer's encode only whole-breaker tokens count: the match is 5 long
    x = run_final(np.zeros(len(pieces)), s, history=hist, pieces=pieces)
    want[y] = -(1.75 ** (5 - 1))
    np.testing.assert_allclose(x, want, rtol=1e-6)


# The view path (`_staged_draw`): after a top-k whose view holds every candidate, the
# by-value stages and the draw run over the view's logits; the same tokens as the whole
# vocabulary's path, which the tests above hold to llama.cpp's chain.
_VIEW_CASE = [
    (48, ORDERS[0]),  # the view is the whole (small) vocabulary
    (2048, ORDERS[0]),  # 512 of 2048
    (2048, ("top_k", "penalties", "top_p", "temperature")),  # penalties after: no view path
    (2048, ("top_k", "typ_p", "xtc", "min_p", "top_n_sigma", "temperature")),
]
_VIEW_JITS: dict = {}


def _view_jit(on: bool, V: int, order):
    """`sample` traced with the view path on or off (a fresh trace for each)."""
    import llamay.sample.chain as chain

    key = (on, V, order)
    if key not in _VIEW_JITS:
        saved = chain.BY_VALUE
        chain.BY_VALUE = saved if on else frozenset()
        try:
            fn = jax.jit(lambda *a: sample(*a))
            s = Sampler(samplers=order)
            p = SamplingParams.stack([s] * 4, V)
            fn.lower(jnp.zeros((4, V)), p, SamplerState.init([s] * 4, [[1]] * 4)).compile()
            _VIEW_JITS[key] = fn
        finally:
            chain.BY_VALUE = saved
    return _VIEW_JITS[key]


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    case=st.sampled_from(_VIEW_CASE),
    top_k=st.sampled_from([0, 1, 5, 40, 600]),
    top_p=st.sampled_from([1.0, 0.9]),
    min_p=st.sampled_from([0.0, 0.05]),
    typical_p=st.sampled_from([1.0, 0.7]),
    xtc=st.sampled_from([0.0, 1.0]),
    temp=st.sampled_from([0.0, 0.8, 1.5]),
    dyn=st.sampled_from([0.0, 0.5]),
)
def test_the_view_path_draws_the_whole_paths_tokens(
    seed, case, top_k, top_p, min_p, typical_p, xtc, temp, dyn
):
    V, order = case
    rng = np.random.default_rng(seed)
    lg = rng.normal(0, 3, (4, V)).astype(np.float32)
    lg[1] = rng.integers(0, 2, V)  # half the vocabulary tied at the top: more than the view
    lg[2, rng.permutation(V)[: V - 30]] = -np.inf  # a masked vocabulary: 30 candidates
    lg = jnp.asarray(lg)
    rows = [
        Sampler(
            temperature=temp if r else 0.0,  # a greedy row among sampled ones
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            typical_p=typical_p,
            xtc_probability=xtc,
            dynatemp_range=dyn,
            repeat_penalty=1.3,
            seed=seed + r,
            samplers=order,
        )
        for r in range(4)
    ]
    p = SamplingParams.stack(rows, V)
    hist = [rng.integers(0, V, 6).tolist() for _ in rows]
    st0 = SamplerState.init(rows, hist)
    for _ in range(3):  # three steps: the keys move on alike
        a, st_a = _view_jit(True, V, order)(lg, p, st0)
        b, _ = _view_jit(False, V, order)(lg, p, st0)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        st0 = st_a
