"""The sampler chain on device: logits [B, V] in, one token per row out.

Order of work, as llama.cpp's common sampler: the constraint mask (tokens a grammar
forbids get -inf), logit_bias, then the stages of the plan in order, then the draw.
Every stage is the identity for a slot whose parameters disable it, so one batch
carries different settings per slot. Truncation sets logits to -inf and stays in
vocabulary order: a rank-based cut (top-k, top-p, min_keep, mirostat's k) becomes a
threshold on the logit read off a top-`VIEW` view of the sorted logits
(`llamay.kernels.top_k`: `lax.top_k`, native on CPU), and only when a cut reaches past
that view is the whole vocabulary sorted (`lax.cond`), so a 262k vocabulary is not
sorted every step. Expensive stages no slot enables are skipped the same way; after a
top-k whose view holds every candidate, the stages that read logits only run over the
view (`_staged_draw`); a batch of greedy rows takes the argmax alone. Candidates tied
exactly at a cut are all kept (llama.cpp keeps them in sort order up to the count).

Each stage restates one function of llama.cpp's `llama-sampling.cpp` (named in its
docstring), with the deviations listed in `llamay.sample.samplers`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from llamay.kernels import argmax, logprob_argmax
from llamay.kernels import top_k as best_of  # `top_k` here is the sampler stage
from llamay.sample.samplers import SamplerState, SamplingParams

NEG = -jnp.inf
VIEW = 512  # sorted candidates kept in view before falling back to a full sort


def _cut(x: jax.Array, n_keep_fn, decided_fn=None, view=None) -> jax.Array:
    """Logit threshold [B, 1] of a best-first prefix cut: `n_keep_fn(sorted_vals)` says
    how many of the best candidates stay (>= 1). Reads the top-VIEW values; sorts the
    whole row only if some row's cut is not decided inside the view. With a `view`
    (`top_k`'s) holding every row's candidates, its values sorted instead."""
    if view is not None:
        ids, ok = view

        def from_view(_):
            vals = -jnp.sort(-jnp.take_along_axis(x, ids, -1), axis=-1)
            n = n_keep_fn(vals)
            return jnp.take_along_axis(vals, jnp.clip(n, 1, ids.shape[-1])[:, None] - 1, -1)

        return jax.lax.cond(jnp.all(ok), from_view, lambda _: _cut(x, n_keep_fn, decided_fn), None)
    return _cut_in(x, best_of(x, min(x.shape[-1], VIEW))[0], n_keep_fn, decided_fn)


def _cut_in(x, vals, n_keep_fn, decided_fn=None):
    """`_cut` given the top values of x (`lax.top_k`'s, best first)."""
    V, K = x.shape[-1], vals.shape[-1]
    n = n_keep_fn(vals)
    decided = (n < K) | (K == V) if decided_fn is None else decided_fn(vals, n)

    def in_view(_):
        return jnp.take_along_axis(vals, jnp.clip(n, 1, K)[:, None] - 1, -1)

    def full(_):
        sv = -jnp.sort(-x, axis=-1)
        n2 = n_keep_fn(sv)
        return jnp.take_along_axis(sv, jnp.clip(n2, 1, V)[:, None] - 1, -1)

    return jax.lax.cond(jnp.all(decided), in_view, full, None)


def _when(any_on, stage, x):
    """Run `stage(x)` only if some slot enables it (a traced condition)."""
    return jax.lax.cond(any_on, stage, lambda y: y, x)


def unpack_mask(bits: jax.Array, vocab_size: int) -> jax.Array:
    """Packed bitmask [B, ceil(V/32)] → bool [B, V] (bit v%32 of word v//32, as llguidance)."""
    shifts = jnp.arange(32, dtype=jnp.uint32)
    words = bits.astype(jnp.uint32)[:, :, None] >> shifts
    return (words & 1).astype(bool).reshape(bits.shape[0], -1)[:, :vocab_size]


def _n_finite(x):
    return jnp.sum(jnp.isfinite(x), axis=-1)


def _rank(x):
    return jnp.arange(x.shape[-1])[None, :]


def _entropy(p):
    return -jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0), axis=-1)


# -- history --------------------------------------------------------------------------------


def ordered_history(st: SamplerState) -> tuple[jax.Array, jax.Array]:
    """(ids [B, R] oldest → newest with the newest at R-1, -1 where empty; count [B])."""
    R = st.history.shape[1]
    start = st.n_seen % R  # the oldest entry once the ring is full
    idx = (start[:, None] + jnp.arange(R)[None, :]) % R
    h = jnp.take_along_axis(st.history, idx, axis=-1)
    count = jnp.minimum(st.n_seen, R)
    # Before the ring fills, entries [n_seen, R) are empty and rotate to the front.
    valid = jnp.arange(R)[None, :] >= (R - count)[:, None]
    return jnp.where(valid, h, -1), count


def _window(p_last_n, count, R):
    """Tokens considered: last_n (-1: the whole ring) capped at what has been seen."""
    n = jnp.where(p_last_n < 0, R, jnp.maximum(p_last_n, 0))
    return jnp.minimum(n, count)


# -- stages (x: logits [B, V] in vocabulary order, -inf = excluded) ------------------------


def penalties(x, p: SamplingParams, hist, count):
    """llama_sampler_penalties: tokens seen in the last repeat_last_n (-1: the whole
    ring, i.e. the context; 0: off) get their logit divided (positive) or multiplied
    (negative) by repeat_penalty, then count·frequency_penalty + presence_penalty
    subtracted. Skipped (a traced branch) when no slot enables it, so a context-long
    ring costs nothing then."""
    on = (p.repeat_last_n != 0) & (
        (p.repeat_penalty != 1.0) | (p.frequency_penalty != 0.0) | (p.presence_penalty != 0.0)
    )
    return _when(jnp.any(on), lambda y: _penalise(y, p, hist, count), x)


def _penalise(x, p: SamplingParams, hist, count):
    B, R = hist.shape
    V = x.shape[-1]
    n = _window(p.repeat_last_n, count, R)
    live = jnp.arange(R)[None, :] >= (R - n)[:, None]
    cnt = (
        jnp.zeros((B, V), jnp.float32)
        .at[jnp.arange(B)[:, None], jnp.where(live, hist, 0)]
        .add(live.astype(jnp.float32))
    )
    rep = p.repeat_penalty[:, None]
    y = jnp.where(x <= 0, x * rep, x / rep)
    y = y - cnt * p.frequency_penalty[:, None] - (cnt > 0) * p.presence_penalty[:, None]
    return jnp.where(cnt > 0, y, x)


def dry_penalty(p: SamplingParams, hist, count) -> jax.Array:
    """llama_sampler_dry_apply: the vocabulary-space penalty [B, V] of DRY.

    The repeat length at an earlier position j is how long the text ending at j
    matches the text ending now (capped at the distance to the newest sequence
    breaker); a token that followed a match of length >= allowed_length is
    penalised multiplier · base^(length - allowed_length), single-token breakers never.
    """
    B, R = hist.shape
    V = p.dry_breakers.shape[-1]
    allowed = p.dry_allowed_length
    M = _window(p.dry_penalty_last_n, count, R)
    enabled = (p.dry_multiplier != 0) & (p.dry_base >= 1.0) & (p.dry_penalty_last_n != 0)
    enabled &= M > allowed
    dist = (R - 1) - jnp.arange(R)[None, :]  # 0 = newest
    in_win = dist < M[:, None]
    is_brk = jnp.take_along_axis(p.dry_breakers, jnp.maximum(hist, 0), axis=-1) & (hist >= 0)
    hit, longest = is_brk & in_win, jnp.zeros((B, R), jnp.int32)
    if p.dry_tails is not None:  # breakers spread over tokens: a head, then its tail
        head, tail = p.dry_tails[:, :, 0], p.dry_tails[:, :, 1:]
        n_tail = jnp.sum(tail >= 0, -1)  # [B, NT]
        m = (hist[:, None, :] == head[:, :, None]) & (head[:, :, None] >= 0)
        for o in range(tail.shape[-1]):
            newer = jnp.roll(hist, -(1 + o), axis=-1)  # the token 1 + o after position j
            ok = (newer[:, None, :] == tail[:, :, o, None]) & (dist[:, None, :] >= 1 + o)
            m &= (o >= n_tail)[:, :, None] | ok
        m &= (n_tail[:, :, None] <= dist[:, None, :]) & in_win[:, None, :]
        hit |= jnp.any(m, 1)
        longest = jnp.maximum(longest, jnp.max(jnp.where(m, n_tail[:, :, None], 0), 1))
    # llama.cpp: the newest breaker found limits repeats to the text after it
    newest = jnp.min(jnp.where(hit, dist, R), axis=-1)  # [B]
    at = jnp.take_along_axis(longest, jnp.clip(R - 1 - newest, 0, R - 1)[:, None], -1)[:, 0]
    rep_limit = jnp.where(newest < R, newest - at, M)
    enabled &= rep_limit >= allowed

    # Match lengths by extending every candidate end position one step back at a time.
    def body(carry):
        t, alive, L = carry
        shifted = jnp.roll(hist, t, axis=-1)  # shifted[j] = hist[j - t]
        target = jax.lax.dynamic_index_in_dim(hist, R - 1 - t, axis=1)  # [B, 1]
        ok = (shifted == target) & ((dist + t) < M[:, None])
        alive = alive & ok
        return t + 1, alive, L + alive.astype(jnp.int32)

    def cond(carry):
        t, alive, _ = carry
        return (t < R) & jnp.any(alive)

    alive0 = in_win & (dist >= 1) & enabled[:, None]
    _, _, L = jax.lax.while_loop(cond, body, (jnp.int32(0), alive0, jnp.zeros((B, R), jnp.int32)))
    L = jnp.minimum(L, rep_limit[:, None])
    follow = jnp.roll(hist, -1, axis=-1)  # the token after position j
    hit = (L >= allowed[:, None]) & (dist >= 1) & enabled[:, None]
    best = (
        jnp.full((B, V), -1, jnp.int32)
        .at[jnp.arange(B)[:, None], jnp.where(hit, follow, 0)]
        .max(jnp.where(hit, L, -1))
    )
    base = p.dry_base[:, None]
    log_base = jnp.log(jnp.maximum(base, 1e-30))
    max_exp = jnp.where(base > 1.000001, jnp.floor(88.7228391 / log_base), 0.0)
    e = (best - allowed[:, None]).astype(jnp.float32)
    e = jnp.where((max_exp > 0) & (e > max_exp), max_exp, e)
    pen = p.dry_multiplier[:, None] * jnp.power(base, e)
    return jnp.where((best >= 0) & ~p.dry_breakers, pen, 0.0)


def dry(x, p: SamplingParams, hist, count):
    if p.dry_breakers is None:
        return x
    on = jnp.any(p.dry_multiplier != 0)
    return _when(on, lambda y: y - dry_penalty(p, hist, count), x)


def top_n_sigma(x, p: SamplingParams, skip=None):
    """llama_sampler_top_n_sigma: keep logits >= max - n·σ (population σ of the finite logits)."""
    skip = _skipped(x, skip)
    return _when(jnp.any((p.top_n_sigma > 0) & ~skip), lambda y: _top_n_sigma(y, p, skip), x)


def _top_n_sigma(x, p: SamplingParams, skip):
    fin = jnp.isfinite(x)
    nf = jnp.maximum(jnp.sum(fin, -1, keepdims=True), 1)
    mean = jnp.sum(jnp.where(fin, x, 0.0), -1, keepdims=True) / nf
    std = jnp.sqrt(jnp.sum(jnp.where(fin, (x - mean) ** 2, 0.0), -1, keepdims=True) / nf)
    mx = jnp.max(x, -1, keepdims=True)
    n = p.top_n_sigma[:, None]
    on = (n > 0) & (nf > 1) & ~skip[:, None]
    return jnp.where(~on | (x >= mx - n * std), x, NEG)


def top_k(x, p: SamplingParams, skip=None):
    """llama_sampler_top_k: the k best (k <= 0 disables; min_keep does not apply)."""
    return top_k_view(x, p, skip)[0]


def top_k_view(x, p: SamplingParams, skip=None):
    """`top_k`, and the view it read: (ids [B, VIEW'] of the best logits, ok [B]: the row's
    candidates are all among them). Later stages only drop candidates or move logits, so
    it stays a superset: the cuts and the draw after it read those VIEW' logits, not V."""
    V = x.shape[-1]
    K = min(V, VIEW)
    on = (p.top_k > 0) & ~_skipped(x, skip)
    k = jnp.where(on, jnp.minimum(p.top_k, V), 1)

    def stage(x):
        vals, ids = best_of(x, K)
        thr = _cut_in(x, vals, lambda vals: k)
        y = jnp.where(~on[:, None] | (x >= thr), x, NEG)
        # a cut past the view, or ties at the threshold, may keep more than the view
        # holds: not when the view's last logit is below the threshold (or -inf: every
        # finite logit is in view), whatever lies outside it is then below it too
        last = vals[:, -1:]
        inside = ((last < thr) | (last == NEG))[:, 0]
        ok = on & ((K == V) | ((k < K) & inside))
        return y, ids.astype(jnp.int32), ok

    def off(x):
        return x, jnp.zeros((x.shape[0], K), jnp.int32), jnp.zeros(x.shape[:1], bool)

    y, ids, ok = jax.lax.cond(jnp.any(on), stage, off, x)
    return y, (ids, ok)


def top_p(x, p: SamplingParams, skip=None, view=None):
    """llama_sampler_top_p: the shortest best-first prefix whose mass reaches p."""
    on = (p.top_p < 1.0) & ~_skipped(x, skip)
    least = jnp.maximum(p.min_keep, 1)

    def stage(x):
        lse = jax.nn.logsumexp(x, axis=-1, keepdims=True)

        def n_keep(vals):
            pr = jnp.exp(vals - lse)
            before = jnp.cumsum(pr, -1) - pr
            keep = (before < p.top_p[:, None]) | (jnp.arange(vals.shape[-1])[None] < least[:, None])
            return jnp.where(on, jnp.sum(keep, -1), 1)

        thr = _cut(x, n_keep, view=view)
        return jnp.where(~on[:, None] | (x >= thr), x, NEG)

    return _when(jnp.any(on), stage, x)


def min_p(x, p: SamplingParams, skip=None, view=None):
    """llama_sampler_min_p: keep logits >= max + log(min_p), at least min_keep."""
    mp = p.min_p[:, None]
    on = (mp > 0) & ~_skipped(x, skip)[:, None]

    def stage(x):
        floor = jnp.max(x, -1, keepdims=True) + jnp.log(jnp.maximum(mp, 1e-30))
        keep_n = jnp.maximum(p.min_keep, 1)
        floor = jax.lax.cond(
            jnp.any(keep_n > 1),
            lambda f: jnp.minimum(f, _cut(x, lambda vals: keep_n, view=view)),
            lambda f: f,
            floor,
        )
        return jnp.where(~on | (x >= floor), x, NEG)

    return _when(jnp.any(on), stage, x)


def typical(x, p: SamplingParams):
    """llama_sampler_typical: keep the tokens whose surprise is closest to the entropy,
    most typical first, until their mass exceeds p."""

    def stage(x):
        pr = jax.nn.softmax(x, axis=-1)
        H = _entropy(pr)[:, None]
        logp = jnp.log(jnp.where(pr > 0, pr, 1.0))
        shifted = jnp.where(pr > 0, jnp.abs(-logp - H), jnp.inf)
        o = jnp.argsort(shifted, axis=-1, stable=True)
        po = jnp.take_along_axis(pr, o, -1)
        before = jnp.cumsum(po, -1) - po
        keep_o = (before <= p.typical_p[:, None]) | (_rank(x) < p.min_keep[:, None])
        B = x.shape[0]
        keep = jnp.zeros_like(keep_o).at[jnp.arange(B)[:, None], o].set(keep_o)
        return jnp.where((p.typical_p[:, None] >= 1.0) | keep, x, NEG)

    return _when(jnp.any(p.typical_p < 1.0), stage, x)


def xtc(x, p: SamplingParams, key):
    """llama_sampler_xtc: with probability xtc_probability, drop every token whose
    probability is >= threshold except the least likely of them."""
    enabled = (p.xtc_probability > 0) & (p.xtc_threshold <= 0.5)
    return _when(jnp.any(enabled), lambda y: _xtc(y, p, key), x)


def _xtc(x, p: SamplingParams, key):
    chance = jax.vmap(jax.random.uniform)(key)
    nf = _n_finite(x)
    on = (p.xtc_probability > 0) & (p.xtc_threshold <= 0.5) & (nf >= 2)
    on &= chance <= p.xtc_probability
    pr = jax.nn.softmax(x, axis=-1)
    above = pr >= p.xtc_threshold[:, None]
    pos_last = jnp.sum(above, -1) - 1
    on &= (nf - pos_last >= p.min_keep) & (pos_last > 0)
    least = jnp.min(jnp.where(above, x, jnp.inf), -1, keepdims=True)
    return jnp.where(~on[:, None] | (x <= least), x, NEG)


def temperature(x, p: SamplingParams, dynamic: bool = True):
    """llama_sampler_temp_ext: divide by the temperature (0: keep the best only); with
    dynatemp_range > 0 the temperature moves within temp ± range with the normalised
    entropy of the candidates raised to dynatemp_exponent."""
    t = p.temperature[:, None]
    best = argmax(x)[:, None]
    greedy = jnp.where(_rank(x) == best, x, NEG)
    y = jnp.where(t <= 0, greedy, x / jnp.maximum(t, 1e-30))
    if not dynamic:
        return y
    r = p.dynatemp_range[:, None]

    def dynatemp(y):
        lo, hi = jnp.maximum(t - r, 0.0), t + r
        pr = jax.nn.softmax(x, axis=-1)
        nf = _n_finite(x)[:, None]
        norm = _entropy(pr)[:, None] / jnp.log(jnp.maximum(nf, 2).astype(jnp.float32))
        dyn = lo + (hi - lo) * jnp.power(norm, p.dynatemp_exponent[:, None])
        return jnp.where(r > 0, jnp.where(nf > 1, x / dyn, x), y)

    return _when(jnp.any(r > 0), dynatemp, y)


def _draw(key, x, greedy=None, view=None):
    """One draw per row from the candidates x [B, V]; when every row has a single
    candidate left (greedy: temperature <= 0 keeps only the best), its index, without
    drawing V random numbers per row. `greedy` [B]: rows known to have one (`greedy_rows`),
    so that every row greedy does not count the candidates either. `view`: `top_k_view`'s,
    where it holds every row's candidates the draw is over its logits only."""

    def gumbel_max(key, x):  # jax.random.categorical's Gumbel draw, through the fast argmax
        noise = jax.vmap(lambda k: jax.random.gumbel(k, x.shape[-1:], x.dtype))(key)
        return argmax(noise + x)

    def categorical():
        if view is None:
            return gumbel_max(key, x)
        ids, ok = view

        def in_view():
            j = gumbel_max(key, jnp.take_along_axis(x, ids, -1))
            return jnp.take_along_axis(ids, j[:, None], -1)[:, 0]

        return jax.lax.cond(jnp.all(ok), in_view, lambda: gumbel_max(key, x))

    def draw():
        single = jnp.all(_n_finite(x) <= 1)
        return jax.lax.cond(single, lambda: argmax(x), categorical)

    if greedy is None:
        return draw()
    return jax.lax.cond(jnp.all(greedy), lambda: argmax(x), draw)


def greedy_rows(order: Sequence[str], p: SamplingParams) -> jax.Array:
    """[B] bool: rows a greedy temperature stage of `order` leaves one candidate (no
    stage adds candidates back)."""
    g = jnp.zeros(p.temperature.shape, bool)
    if "temperature" in order:
        g |= (p.temperature <= 0) & (p.dynatemp_range <= 0)
    if "temperature_plain" in order:
        g |= p.temperature <= 0
    return g


def mirostat(x, p: SamplingParams, mu, key, version: int):
    """llama_sampler_mirostat (v1: estimate the Zipf exponent from the best 100,
    top-k from it) and mirostat_v2 (drop tokens whose surprise exceeds mu); draw,
    then mu -= eta·(surprise of the drawn token − tau). Returns (token, x, mu)."""
    V = x.shape[-1]
    lse = jax.nn.logsumexp(x, axis=-1, keepdims=True)
    if version == 1:
        m = min(100, V)
        top = jnp.exp(best_of(x, m)[0] - lse)
        nf = _n_finite(x)
        i = jnp.arange(m - 1)
        t_i = jnp.log((i + 2.0) / (i + 1.0))[None, :]
        ok = i[None, :] < (nf[:, None] - 1)
        b_i = jnp.log(jnp.where(ok, top[:, :-1], 1.0) / jnp.where(ok, top[:, 1:], 1.0))
        s_hat = jnp.sum(jnp.where(ok, t_i * b_i, 0.0), -1) / jnp.sum(jnp.where(ok, t_i**2, 0.0), -1)
        eps = s_hat - 1
        k = jnp.power(eps * jnp.power(2.0, mu) / (1 - jnp.power(float(V), -eps)), 1 / s_hat)
        k = jnp.clip(jnp.nan_to_num(k, nan=1.0, posinf=V), 1, V).astype(jnp.int32)
        x = jnp.where(x >= _cut(x, lambda vals: k), x, NEG)
    else:
        surprise = -(x - lse) / jnp.log(2.0)
        x = jnp.where((surprise <= mu[:, None]) | (x >= jnp.max(x, -1, keepdims=True)), x, NEG)
    tok = _draw(key, x)
    logp = jnp.take_along_axis(jax.nn.log_softmax(x, axis=-1), tok[:, None], -1)[:, 0]
    mu = mu - p.mirostat_eta * (-logp / jnp.log(2.0) - p.mirostat_tau)
    return tok, x, mu


# -- the chain ------------------------------------------------------------------------------


def final_logits(logits, p: SamplingParams, st: SamplerState, mask=None, keys=None):
    """The candidates the draw sees (vocabulary order, -inf = excluded), for the
    non-mirostat plans; exposed so tests can compare whole distributions."""
    return _chain(logits, p, st, mask, keys if keys is not None else _keys(st)[1])[0]


def _keys(st):
    split = jax.vmap(lambda k: jax.random.split(jax.random.wrap_key_data(k), 3))(st.keys)
    return split[:, 0], split[:, 1], split[:, 2]  # draw, xtc, next


def _prepare(logits, p, mask):
    x = logits.astype(jnp.float32)
    if mask is not None:
        x = jnp.where(unpack_mask(mask, x.shape[-1]), x, NEG)
    if p.logit_bias is not None:
        x = x + p.logit_bias
    return x


# Stages that never drop the best candidate (each keeps at least the maximum).
MAX_KEEPING = ("top_n_sigma", "top_k", "top_p", "min_p")


def _skipped(x, skip):
    """[B] bool: the rows a stage is skipped for (`greedy_after`; None: none)."""
    return jnp.zeros(x.shape[:1], bool) if skip is None else skip


def _greedy_scan(order: Sequence[str], p: SamplingParams, B: int):
    """(`greedy_after`'s list, [B] bool: the rows whose whole plan draws the best of the
    prepared logits)."""
    off = {
        "penalties": (p.repeat_last_n == 0)
        | ((p.repeat_penalty == 1.0) & (p.frequency_penalty == 0.0) & (p.presence_penalty == 0.0)),
        "dry": p.dry_multiplier == 0,
        "typ_p": p.typical_p >= 1.0,
        "xtc": (p.xtc_probability <= 0) | (p.xtc_threshold > 0.5),
    }
    g, out = jnp.zeros((B,), bool), []
    for stage in reversed(order):
        out.append(g)
        if stage == "temperature":
            g = (p.temperature <= 0) & (p.dynatemp_range <= 0)
        elif stage == "temperature_plain":
            g = p.temperature <= 0
        elif stage in off:
            g = g & off[stage]
        elif stage not in MAX_KEEPING:
            g = jnp.zeros((B,), bool)
    return out[::-1], g


def greedy_after(order: Sequence[str], p: SamplingParams, B: int) -> list[jax.Array]:
    """Per stage of `order`, [B] bool: True for the rows whose later stages are each
    max-keeping or disabled for the row, up to a greedy temperature stage (t <= 0, no
    dynatemp). A max-keeping stage there cannot change the token drawn (the greedy stage
    keeps the best of what reaches it, which that stage keeps), so it is skipped for
    those rows: a greedy row does not pay for top-k / top-p views of a 262k vocabulary."""
    return _greedy_scan(order, p, B)[0]


def draws_the_best(order: Sequence[str], p: SamplingParams, B: int) -> jax.Array:
    """[B] bool: the rows whose every stage is max-keeping or off for the row, up to a
    greedy temperature stage (`greedy_after`'s rule over the whole plan): their token is
    the argmax of the logits after the mask and logit_bias, whatever the stages do."""
    return _greedy_scan(order, p, B)[1]


def _chain(logits, p: SamplingParams, st: SamplerState, mask, xtc_key):
    """(the candidates x [B, V], the view of the last top-k stage or None: `top_k_view`)."""
    x = _prepare(logits, p, mask)
    return _run(x, p.order, greedy_after(p.order, p, x.shape[0]), p, st, xtc_key)


def _run(x, stages, skips, p: SamplingParams, st: SamplerState, xtc_key, view=None):
    """`stages` (a run of the plan, `skips` theirs of `greedy_after`) over x, the view of
    an earlier top-k stage given; (x, the last top-k stage's view)."""
    hist, count = ordered_history(st)
    for stage, skip in zip(stages, skips, strict=True):
        if stage == "penalties":
            x = penalties(x, p, hist, count)
        elif stage == "dry":
            x = dry(x, p, hist, count)
        elif stage == "top_n_sigma":
            x = top_n_sigma(x, p, skip)
        elif stage == "top_k":
            x, view = top_k_view(x, p, skip)
        elif stage == "typ_p":
            x = typical(x, p)
        elif stage == "top_p":
            x = top_p(x, p, skip, view)
        elif stage == "min_p":
            x = min_p(x, p, skip, view)
        elif stage == "xtc":
            x = xtc(x, p, xtc_key)
        elif stage == "temperature":
            x = temperature(x, p)
        elif stage == "temperature_plain":
            x = temperature(x, p, dynamic=False)
    return x, view


#: Stages that read the candidates' logits only, never which tokens they are (penalties
#: and DRY read the history's ids): after a top-k whose view holds every candidate they
#: can run over the view's logits alone (`_staged_draw`).
BY_VALUE = frozenset({"top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc"})
BY_VALUE |= {"temperature", "temperature_plain"}


def _staged_draw(x, p: SamplingParams, st: SamplerState, draw_key, xtc_key):
    """The plan's stages over the prepared logits x [B, V], then the draw. When the
    stages after the first top-k read logits only (`BY_VALUE`) and that top-k's view
    holds every row's candidates (top_k <= VIEW), they and the draw run over the view's
    [B, VIEW] logits instead of [B, V]: the same cuts, the same Gumbel noise (the draw
    over a view reads the view's logits either way), the same token, without a dozen
    passes over a 262k vocabulary per step."""
    order, B = p.order, x.shape[0]
    skips = greedy_after(order, p, B)
    greedy = greedy_rows(order, p)
    if "top_k" not in order or not set(order[order.index("top_k") + 1 :]) <= BY_VALUE:
        x, view = _run(x, order, skips, p, st, xtc_key)
        return _draw(draw_key, x, greedy, view)
    cut = order.index("top_k") + 1
    x, view = _run(x, order[:cut], skips[:cut], p, st, xtc_key)
    ids, ok = view

    def in_view():
        xv, _ = _run(jnp.take_along_axis(x, ids, -1), order[cut:], skips[cut:], p, st, xtc_key)
        j = _draw(draw_key, xv, greedy)
        return jnp.take_along_axis(ids, j[:, None].astype(jnp.int32), -1)[:, 0]

    def whole():
        y, v = _run(x, order[cut:], skips[cut:], p, st, xtc_key, view)
        return _draw(draw_key, y, greedy, v).astype(jnp.int32)

    return jax.lax.cond(jnp.all(ok), in_view, whole)


# -- log-probabilities ----------------------------------------------------------------------


def log_probs(logits: jax.Array) -> jax.Array:
    """The model's own token log-probabilities [B, V] (before any sampler or mask), what
    llama.cpp's n_probs and OpenAI's logprobs report."""
    return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)


def top_logprobs(logp: jax.Array, n: int) -> tuple[jax.Array, jax.Array]:
    """The n best of each row of log-probabilities [B, V]: (ids [B, n] int32, logprobs
    [B, n] f32), best first. `n` is static (jit with static_argnums=1)."""
    lp, ids = best_of(logp, n)
    return ids.astype(jnp.int32), lp


def read_logprobs(
    state: SamplerState, rows: Sequence[int], n_probs: Sequence[int]
) -> list[tuple[float, list[tuple[int, float]]]]:
    """Per row of `rows`: (the drawn token's logprob, [(id, logprob)] of its `n_probs`
    best), from the state `sample` returned (its width is the batch's n_probs, the most
    any row asked for; each row keeps its own first n). One device-to-host copy."""
    idx = np.asarray(rows, np.int32)
    # the whole (small) arrays, indexed on the host: indexing on device would compile a
    # gather per count of rows
    ids, lps, chosen = jax.device_get((state.top_ids, state.top_logprobs, state.token_logprob))
    ids, lps, chosen = ids[idx], lps[idx], chosen[idx]
    width = ids.shape[1]
    out = []
    for r, n in enumerate(n_probs):
        if n > width:
            raise ValueError(f"row {rows[r]} asks for {n} logprobs; the step computed {width}")
        out.append(
            (float(chosen[r]), list(zip(ids[r, :n].tolist(), lps[r, :n].tolist(), strict=True)))
        )
    return out


def sample(logits: jax.Array, p: SamplingParams, st: SamplerState, mask: jax.Array | None = None):
    """Draw one token per row from logits [B, V] (mask: packed allowed-token bits
    [B, ceil(V/32)] or None). Returns (tokens [B] int32, the next SamplerState)."""
    draw_key, xtc_key, next_key = _keys(st)
    mu = st.mu
    order = p.order
    miro = [s for s in order if s.startswith("mirostat")]
    if miro:
        p_chain = dataclasses.replace(p, order=tuple(o for o in order if o not in miro))
        x = _chain(logits, p_chain, st, mask, xtc_key)[0]
        tok, x, mu = mirostat(x, p, mu, draw_key, int(miro[0][-1]))
    else:
        x0 = _prepare(logits, p, mask)

        def staged():
            return _staged_draw(x0, p, st, draw_key, xtc_key).astype(jnp.int32)

        # A batch of greedy rows skips the stages: their [B, V] selects and copies were
        # ~0.8 ms of a Gemma 3 decode step on CPU, the argmax 0.04.
        best = draws_the_best(order, p, x0.shape[0])
        tok = jax.lax.cond(jnp.all(best), lambda: argmax(x0).astype(jnp.int32), staged)
    tok = tok.astype(jnp.int32)
    # log_softmax's values at the tokens wanted, without the [B, V] array: one pass over
    # each row (natively on CPU), the drawn token's first
    x = logits.astype(jnp.float32)
    picks = tok[:, None]
    if p.n_probs:
        top_ids = best_of(x, p.n_probs)[1]
        picks = jnp.concatenate([picks, top_ids], axis=-1)
    lp = logprob_argmax(x, picks)[0]
    if p.n_probs:
        top_lp = lp[:, 1:]
    else:
        top_lp, top_ids = st.top_logprobs, st.top_ids
    R = st.history.shape[1]
    B = tok.shape[0]
    history = st.history.at[jnp.arange(B), st.n_seen % R].set(tok)
    new = SamplerState(
        keys=jax.vmap(jax.random.key_data)(next_key),
        history=history,
        n_seen=st.n_seen + 1,
        mu=mu,
        top_logprobs=top_lp,
        top_ids=top_ids,
        token_logprob=lp[:, 0],
    )
    return tok, new
