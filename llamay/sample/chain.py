"""The sampler chain on device: logits [B, V] in, one token per row out.

Order of work, as llama.cpp's common sampler: the constraint mask (tokens a grammar
forbids get -inf), logit_bias, then the stages of the plan in order, then the draw.
Every stage is the identity for a slot whose parameters disable it, so one batch
carries different settings per slot. Truncation sets logits to -inf rather than
shrinking the candidate array; candidates are kept in a permuted order (`perm`) once
a stage needs them sorted, and vocabulary-space adjustments (penalties, DRY) are
gathered through that permutation.

Each stage restates one function of llama.cpp's `llama-sampling.cpp` (named in its
docstring), with the deviations listed in `llamay.sample.samplers`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from llamay.sample.samplers import SamplerState, SamplingParams

NEG = -jnp.inf


@dataclass
class Cand:
    """Candidates: logits x [B, V] in the order perm [B, V] (None: vocabulary order)."""

    x: jax.Array
    perm: jax.Array | None = None
    is_sorted: bool = False

    def sorted(self) -> Cand:
        if self.is_sorted:
            return self
        o = jnp.argsort(-self.x, axis=-1, stable=True)
        x = jnp.take_along_axis(self.x, o, axis=-1)
        perm = o if self.perm is None else jnp.take_along_axis(self.perm, o, axis=-1)
        return Cand(x, perm, True)

    def gather(self, vocab_values: jax.Array) -> jax.Array:
        """A [B, V] vocabulary-space array in candidate order."""
        return (
            vocab_values if self.perm is None else jnp.take_along_axis(vocab_values, self.perm, -1)
        )

    def keep(self, mask: jax.Array) -> Cand:
        return Cand(jnp.where(mask, self.x, NEG), self.perm, self.is_sorted)

    def to_vocab(self) -> jax.Array:
        if self.perm is None:
            return self.x
        B = self.x.shape[0]
        return jnp.full_like(self.x, NEG).at[jnp.arange(B)[:, None], self.perm].set(self.x)


def unpack_mask(bits: jax.Array, vocab_size: int) -> jax.Array:
    """Packed bitmask [B, ceil(V/32)] → bool [B, V] (bit v%32 of word v//32, as llguidance)."""
    shifts = jnp.arange(32, dtype=jnp.uint32)
    words = bits.astype(jnp.uint32)[:, :, None] >> shifts
    return (words & 1).astype(bool).reshape(bits.shape[0], -1)[:, :vocab_size]


def _softmax(x):
    return jax.nn.softmax(x, axis=-1)


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


# -- stages ---------------------------------------------------------------------------------


def penalties(c: Cand, p: SamplingParams, hist, count) -> Cand:
    """llama_sampler_penalties: tokens seen in the last repeat_last_n get their logit
    divided (positive) or multiplied (negative) by repeat_penalty, then
    count·frequency_penalty + presence_penalty subtracted."""
    B, R = hist.shape
    V = c.x.shape[-1]
    n = _window(p.repeat_last_n, count, R)
    live = jnp.arange(R)[None, :] >= (R - n)[:, None]
    counts = (
        jnp.zeros((B, V), jnp.float32)
        .at[jnp.arange(B)[:, None], jnp.where(live, hist, 0)]
        .add(live.astype(jnp.float32))
    )
    cnt = c.gather(counts)
    rep = p.repeat_penalty[:, None]
    x = jnp.where(c.x <= 0, c.x * rep, c.x / rep)
    x = x - cnt * p.frequency_penalty[:, None] - (cnt > 0) * p.presence_penalty[:, None]
    return Cand(jnp.where(cnt > 0, x, c.x), c.perm, False)


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
    rep_limit = jnp.min(jnp.where(is_brk & in_win, dist, M[:, None]), axis=-1)
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


def dry(c: Cand, p: SamplingParams, hist, count) -> Cand:
    if p.dry_breakers is None:
        return c
    return Cand(c.x - c.gather(dry_penalty(p, hist, count)), c.perm, False)


def top_n_sigma(c: Cand, p: SamplingParams) -> Cand:
    """llama_sampler_top_n_sigma: keep logits >= max - n·σ (population σ of the finite logits)."""
    fin = jnp.isfinite(c.x)
    nf = jnp.maximum(jnp.sum(fin, -1, keepdims=True), 1)
    xz = jnp.where(fin, c.x, 0.0)
    mean = jnp.sum(xz, -1, keepdims=True) / nf
    std = jnp.sqrt(jnp.sum(jnp.where(fin, (c.x - mean) ** 2, 0.0), -1, keepdims=True) / nf)
    mx = jnp.max(c.x, -1, keepdims=True)
    n = p.top_n_sigma[:, None]
    on = (n > 0) & (nf > 1)
    return c.keep(~on | (c.x >= mx - n * std))


def top_k(c: Cand, p: SamplingParams) -> Cand:
    """llama_sampler_top_k: the k best (k <= 0 disables), at least min_keep."""
    c = c.sorted()
    k = jnp.where(p.top_k > 0, jnp.maximum(p.top_k, p.min_keep), c.x.shape[-1])[:, None]
    return c.keep(_rank(c.x) < k)


def top_p(c: Cand, p: SamplingParams) -> Cand:
    """llama_sampler_top_p: the shortest best-first prefix whose mass reaches p."""
    c = c.sorted()
    pr = _softmax(c.x)
    before = jnp.cumsum(pr, -1) - pr
    tp = p.top_p[:, None]
    keep = (tp >= 1.0) | (before < tp) | (_rank(c.x) < jnp.maximum(p.min_keep, 1)[:, None])
    return c.keep(keep)


def min_p(c: Cand, p: SamplingParams) -> Cand:
    """llama_sampler_min_p: keep logits >= max + log(min_p), at least min_keep."""
    c = c.sorted()
    mp = p.min_p[:, None]
    floor = c.x[:, :1] + jnp.log(jnp.maximum(mp, 1e-30))
    return c.keep((mp <= 0) | (c.x >= floor) | (_rank(c.x) < p.min_keep[:, None]))


def typical(c: Cand, p: SamplingParams) -> Cand:
    """llama_sampler_typical: keep the tokens whose surprise is closest to the entropy,
    most typical first, until their mass exceeds p."""
    pr = _softmax(c.x)
    H = _entropy(pr)[:, None]
    logp = jnp.log(jnp.where(pr > 0, pr, 1.0))
    shifted = jnp.where(pr > 0, jnp.abs(-logp - H), jnp.inf)
    o = jnp.argsort(shifted, axis=-1, stable=True)
    po = jnp.take_along_axis(pr, o, -1)
    before = jnp.cumsum(po, -1) - po
    keep_o = (before <= p.typical_p[:, None]) | (_rank(c.x) < p.min_keep[:, None])
    B = c.x.shape[0]
    keep = jnp.zeros_like(keep_o).at[jnp.arange(B)[:, None], o].set(keep_o)
    return c.keep((p.typical_p[:, None] >= 1.0) | keep)


def xtc(c: Cand, p: SamplingParams, key) -> Cand:
    """llama_sampler_xtc: with probability xtc_probability, drop every token whose
    probability is >= threshold except the least likely of them."""
    c = c.sorted()
    chance = jax.vmap(jax.random.uniform)(key)
    nf = _n_finite(c.x)
    on = (p.xtc_probability > 0) & (p.xtc_threshold <= 0.5) & (nf >= 2)
    on &= chance <= p.xtc_probability
    pr = _softmax(c.x)
    pos_last = jnp.sum(pr >= p.xtc_threshold[:, None], -1) - 1
    on &= (nf - pos_last >= p.min_keep) & (pos_last > 0)
    return c.keep(~on[:, None] | (_rank(c.x) >= pos_last[:, None]))


def temperature(c: Cand, p: SamplingParams, dynamic: bool = True) -> Cand:
    """llama_sampler_temp_ext: divide by the temperature (0: keep the best only); with
    dynatemp_range > 0 the temperature moves within temp ± range with the normalised
    entropy of the candidates raised to dynatemp_exponent."""
    t = p.temperature[:, None]
    best = jnp.argmax(c.x, axis=-1)[:, None]
    greedy = jnp.where(_rank(c.x) == best, c.x, NEG)
    x = jnp.where(t <= 0, greedy, c.x / jnp.maximum(t, 1e-30))
    if dynamic:
        r = p.dynatemp_range[:, None]
        lo, hi = jnp.maximum(t - r, 0.0), t + r
        pr = _softmax(c.x)
        nf = _n_finite(c.x)[:, None]
        norm = _entropy(pr)[:, None] / jnp.log(jnp.maximum(nf, 2).astype(jnp.float32))
        dyn = lo + (hi - lo) * jnp.power(norm, p.dynatemp_exponent[:, None])
        x = jnp.where(r > 0, jnp.where(nf > 1, c.x / dyn, c.x), x)
    return Cand(x, c.perm, c.is_sorted)


def _draw(key, x):
    return jax.vmap(jax.random.categorical)(key, x)


def mirostat(c: Cand, p: SamplingParams, mu, key, version: int, n_vocab: int):
    """llama_sampler_mirostat (v1: estimate the Zipf exponent from the best 100,
    top-k from it) and mirostat_v2 (drop tokens whose surprise exceeds mu); draw,
    then mu -= eta·(surprise of the drawn token − tau). Returns (index in c, c, mu)."""
    c = c.sorted()
    pr = _softmax(c.x)
    nf = _n_finite(c.x)
    if version == 1:
        m = min(100, c.x.shape[-1])
        i = jnp.arange(m - 1)
        t_i = jnp.log((i + 2.0) / (i + 1.0))[None, :]
        p0, p1 = pr[:, : m - 1], pr[:, 1:m]
        ok = i[None, :] < (nf[:, None] - 1)
        b_i = jnp.log(jnp.where(ok, p0, 1.0) / jnp.where(ok, p1, 1.0))
        s_hat = jnp.sum(jnp.where(ok, t_i * b_i, 0.0), -1) / jnp.sum(jnp.where(ok, t_i**2, 0.0), -1)
        eps = s_hat - 1
        k = jnp.power(eps * jnp.power(2.0, mu) / (1 - jnp.power(float(n_vocab), -eps)), 1 / s_hat)
        k = jnp.clip(jnp.nan_to_num(k, nan=1.0, posinf=n_vocab), 1, n_vocab).astype(jnp.int32)
        c = c.keep(_rank(c.x) < k[:, None])
    else:
        surprise = -jnp.log2(jnp.where(pr > 0, pr, 1e-45))
        c = c.keep((surprise <= mu[:, None]) | (_rank(c.x) == 0))
    pr = _softmax(c.x)
    idx = _draw(key, c.x)
    p_sel = jnp.take_along_axis(pr, idx[:, None], -1)[:, 0]
    mu = mu - p.mirostat_eta * (-jnp.log2(p_sel) - p.mirostat_tau)
    return idx, c, mu


# -- the chain ------------------------------------------------------------------------------


def final_logits(logits, p: SamplingParams, st: SamplerState, mask=None, keys=None):
    """The candidates the draw sees (vocabulary order, -inf = excluded), for the
    non-mirostat plans; exposed so tests can compare whole distributions."""
    c, _ = _chain(logits, p, st, mask, keys if keys is not None else _keys(st)[1])
    return c.to_vocab()


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


def _chain(logits, p: SamplingParams, st: SamplerState, mask, xtc_key):
    c = Cand(_prepare(logits, p, mask))
    hist, count = ordered_history(st)
    for stage in p.order:
        if stage == "penalties":
            c = penalties(c, p, hist, count)
        elif stage == "dry":
            c = dry(c, p, hist, count)
        elif stage == "top_n_sigma":
            c = top_n_sigma(c, p)
        elif stage == "top_k":
            c = top_k(c, p)
        elif stage == "typ_p":
            c = typical(c, p)
        elif stage == "top_p":
            c = top_p(c, p)
        elif stage == "min_p":
            c = min_p(c, p)
        elif stage == "xtc":
            c = xtc(c, p, xtc_key)
        elif stage == "temperature":
            c = temperature(c, p)
        elif stage == "temperature_plain":
            c = temperature(c, p, dynamic=False)
    return c, hist


def sample(logits: jax.Array, p: SamplingParams, st: SamplerState, mask: jax.Array | None = None):
    """Draw one token per row from logits [B, V] (mask: packed allowed-token bits
    [B, ceil(V/32)] or None). Returns (tokens [B] int32, the next SamplerState)."""
    draw_key, xtc_key, next_key = _keys(st)
    mu = st.mu
    order = p.order
    miro = [s for s in order if s.startswith("mirostat")]
    if miro:
        p_chain = dataclasses.replace(p, order=tuple(o for o in order if o not in miro))
        c, _ = _chain(logits, p_chain, st, mask, xtc_key)
        idx, c, mu = mirostat(c, p, mu, draw_key, int(miro[0][-1]), logits.shape[-1])
    else:
        c, _ = _chain(logits, p, st, mask, xtc_key)
        idx = _draw(draw_key, c.x)
    tok = idx if c.perm is None else jnp.take_along_axis(c.perm, idx[:, None], -1)[:, 0]
    tok = tok.astype(jnp.int32)
    # The token log-probabilities of the model's own distribution (before any sampler).
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    if p.n_probs:
        top_lp, top_ids = jax.lax.top_k(logp, p.n_probs)
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
        top_ids=top_ids.astype(jnp.int32),
        token_logprob=jnp.take_along_axis(logp, tok[:, None], -1)[:, 0],
    )
    return tok, new
