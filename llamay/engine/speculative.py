"""Speculative decoding in `BatchEngine`: draft k tokens cheaply, verify them in one
batched forward of the target, keep the longest prefix the target agrees with.

    engine = BatchEngine(model, speculative=Speculation("ngram"))        # prompt lookup
    engine = BatchEngine(model, speculative=Speculation(draft_model))    # a draft model

Each step, every decoding row asks its draft source (`llamay.engine.drafts`) for up to
k tokens (the request's `draft_max`, else the engine's; llama.cpp's `--draft-max`);
a draft shorter than `draft_min` is dropped. The rows then go through the model as one
step of k+1 tokens each, the row's last sampled token followed by its draft (a prefill
step: rows without a draft feed their one token in the same step, so rows with and
without speculation share it; T is bucketed as prefill chunks are, so nothing
compiles per request), and logits come back at every position (`paged_verify`).

Verification (`verify_sample`) walks the positions on device: at position t the row's
own sampler chain (penalties, top-k/p, temperature, its constraint's mask at that
point, its RNG stream) draws a token from the target's logits; while the draw equals
the draft's token t+1 the row goes on, and the first draw that differs, or the draw
after the last draft token, ends it. Both draft sources propose point masses (q = δ_d),
so this is Leviathan et al.'s / Chen et al.'s rejection sampling exactly: the draft d
is accepted with probability min(1, p(d)/q(d)) = p(d), and on rejection the token is
drawn from the residual norm(max(0, p − q)), which is p without d, renormalised — the
law of a draw from p conditioned on not being d. Each emitted token is therefore a
draw from the target's distribution given the tokens before it, and with the same
seed a speculative run emits the very tokens a plain one does (greedy: equal by
argmax), which is what the tests hold it to.

The KV of rejected draft tokens is rolled back by committing only the accepted
positions: the page tables are host-side, and the positions past a sequence's length
are overwritten before anything attends to them. A constraint's mask applies to the
draft (a draft is cut at its first token the constraint does not allow, the masks of
positions 1..k come from advancing the constraint over the draft and rolling it back)
and to the target's draws. Rows that ask for log-probabilities, and rows whose
constraint cannot roll back, decode without a draft.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from llamay.arch import architecture_of
from llamay.engine.drafts import ModelDrafter, ngram_draft
from llamay.engine.paged_steps import paged_hidden
from llamay.engine.programs import persistent_jit
from llamay.errors import RequestError
from llamay.kv import bucket
from llamay.sample import sample

# verify steps feed k+1 tokens per row, T bucketed to powers of two from this (the
# planner's prefill buckets start at 16: a draft of 2 would cost a 16-token forward)
VERIFY_MIN_T = 4


def fit_bucket(k: int) -> int:
    """The longest draft of at most k tokens whose step (k+1 tokens) fills its T
    bucket: 8 -> 7 (T = 8, not 9 padded to 16), 15 and 16 -> 15, up to 3 unchanged.
    On the CPU a verify forward is compute-bound (its cost grows with T: SmolLM2-135M,
    T = 4/8/16 forward 21/40/67 ms vs a whole T = 1 step 12 ms, load 7), so padding
    positions cost as much as real ones and one draft token less halves the step."""
    if k + 1 <= VERIFY_MIN_T:
        return k
    return (1 << ((k + 1).bit_length() - 1)) - 1


# llama.cpp's defaults (common/common.h: speculative n_max, n_min, p_min)
DRAFT_MAX, DRAFT_MIN, DRAFT_P_MIN = 16, 0, 0.75


@dataclass(frozen=True)
class Speculation:
    """The engine's speculative decoding: `draft` is "ngram" (prompt lookup) or a
    loaded model with the target's tokenizer; the rest llama.cpp's `--draft-max`,
    `--draft-min`, `--draft-p-min` (a request's own `draft_max`... override them)."""

    draft: Any = "ngram"
    draft_max: int = DRAFT_MAX
    draft_min: int = DRAFT_MIN
    p_min: float = DRAFT_P_MIN

    def __post_init__(self):
        check_draft_params(self.draft_max, self.draft_min, self.p_min)
        if isinstance(self.draft, str) and self.draft != "ngram":
            raise RequestError(f'a draft source is "ngram" or a model, not {self.draft!r}')


def check_draft_params(n_max, n_min, p_min) -> None:
    for name, v in (("draft_max", n_max), ("draft_min", n_min)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 256):
            raise RequestError(f"{name} must be an integer in [0, 256], not {v!r}")
    if p_min is not None and (
        isinstance(p_min, bool) or not isinstance(p_min, int | float) or not 0 <= p_min <= 1
    ):
        raise RequestError(f"draft_p_min must be a number in [0, 1], not {p_min!r}")


#: `paged_step`'s forward, returning the hidden states at every fed position [R, T, E]
#: (the head runs per position in `verify_sample`, only where a row still verifies);
#: kept on disk as the steps are (`llamay.engine.programs`), primed by
#: `llamay.engine.warmup.prime` when the engine speculates
paged_verify = persistent_jit(paged_hidden, static_argnames=("cfg",), donate_argnames=("kv",))


@partial(persistent_jit, static_argnames=("cfg",))  # state not donated, as paged_sample's
def verify_sample(cfg, weights, x, drafts, n_draft, sampling, slots, params, state, masks=None):
    """x [R, T, D]: a verify step's hidden states; drafts [R, T] (the token proposed
    after position t: the one fed at t+1), n_draft [R], sampling [R] bool, slots [R],
    per-slot params/state, masks [R, T, W] packed (constraints) or None. Position by
    position, while some row still verifies: the head's logits there, the rows' draws.
    Returns (tokens [R, T] drawn, n_out [R]: how many of them each row emits, state)."""
    arch = architecture_of(cfg)

    def take(a):
        return jnp.take(a, slots, axis=0, mode="clip")

    p = jax.tree_util.tree_map(take, params)
    st0 = jax.tree_util.tree_map(take, state)
    R, T = drafts.shape

    def cond(c):
        t, _, alive, _, _ = c
        return (t < T) & alive.any()

    def body(c):
        t, st, alive, toks, emitted = c
        lg = arch.head(cfg, weights, jax.lax.dynamic_slice_in_dim(x, t, 1, axis=1))[:, 0]
        m = None if masks is None else jax.lax.dynamic_index_in_dim(masks, t, 1, False)
        tok, new = sample(lg, p, st, m)

        def keep(n, o):
            return jnp.where(alive.reshape(alive.shape + (1,) * (n.ndim - 1)), n, o)

        st = jax.tree_util.tree_map(keep, new, st)
        toks = jax.lax.dynamic_update_index_in_dim(toks, tok, t, 1)
        d = jax.lax.dynamic_index_in_dim(drafts, t, 1, False)
        return t + 1, st, alive & (t < n_draft) & (tok == d), toks, emitted + alive

    zeros = jnp.zeros((R, T), jnp.int32)
    init = (jnp.int32(0), st0, sampling, zeros, jnp.zeros(R, jnp.int32))
    _, st, _, toks, n_out = jax.lax.while_loop(cond, body, init)

    def put(full, n, o):
        m = sampling.reshape(sampling.shape + (1,) * (n.ndim - 1))
        return full.at[slots].set(jnp.where(m, n, o), mode="drop")

    return toks, n_out, jax.tree_util.tree_map(put, state, st, st0)


class Speculating:
    """`BatchEngine`'s speculative steps (a mixin over its state; see the module
    docstring). `self.spec` is the engine's Speculation or None."""

    def _spec_init(self, spec: Speculation | None) -> None:
        self.spec = spec
        self._drafter = None
        if spec is not None and not isinstance(spec.draft, str):
            self._drafter = ModelDrafter(
                spec.draft, self.model, self.n_slots, self.page_size, self.chunk
            )
        for k in ("draft_tokens", "draft_accepted", "spec_steps"):
            self.counters[k] = 0

    def _draft_len(self, a) -> int:
        """The most draft tokens row `a` may have this step (0: none)."""
        r = a.handle.request
        n = getattr(r, "draft_max", None)
        n = self.spec.draft_max if n is None else n
        con = r.constraint
        if n <= 0 or a.logprobs is not None or (con is not None and not hasattr(con, "rollback")):
            return 0
        # its emitted tokens stay within its budget and the context; the step within a chunk
        n = max(0, min(n, a.budget - 1, self.chunk - 1, self.n_ctx - len(a.seq.tokens) - 1))
        if jax.default_backend() != "cpu":  # T = k+1 padded costs about T = k+1 there
            return n
        lo = self.spec.draft_min if getattr(r, "draft_min", None) is None else r.draft_min
        fit = fit_bucket(n)
        return fit if fit >= lo else n

    def _speculate(self, decode: list[int], prefill: list[int]) -> bool:
        """Run this iteration's steps with drafts for the decoding rows; False (nothing
        done) when no row has a draft, so the plain decode step runs instead."""
        rows = {i: self._draft_len(self.slots[i]) for i in decode}
        rows = {i: k for i, k in rows.items() if k > 0}
        if not rows:
            return False
        drafts = self._drafts(rows)
        masks = {}
        for i, d in list(drafts.items()):
            a = self.slots[i]
            r = a.handle.request
            d = d[: next((j for j, t in enumerate(d) if t < 0), len(d))]  # no image placeholder
            lo = self.spec.draft_min if getattr(r, "draft_min", None) is None else r.draft_min
            if r.constraint is not None and d:
                d, masks[i] = _constrained(r.constraint, d)
            if len(d) < max(1, lo):
                del drafts[i]
            else:
                drafts[i] = d
        if not drafts:
            return False
        for i, d in drafts.items():
            self.slots[i].seq.tokens.extend(d)
        try:
            plan = self._plan(decode)
        finally:
            for i, d in drafts.items():
                del self.slots[i].seq.tokens[-len(d) :]
        if plan.local is None:  # T bucketed from VERIFY_MIN_T, not the prefill's 16
            t = bucket(max(plan.feed), VERIFY_MIN_T)
            plan.tokens, plan.positions = plan.tokens[:, :t], plan.positions[:, :t]
        other = self._plan(prefill) if prefill else None
        out = self._verify(plan, drafts, masks)
        nxt = self._dispatch(other) if other is not None else None
        self._spec_complete(plan, drafts, *out)
        if other is not None:
            self._complete(other, np.asarray(nxt))
        return True

    def _drafts(self, rows: dict[int, int]) -> dict[int, list[int]]:
        if self._drafter is None:
            return {i: ngram_draft(self.slots[i].seq.tokens, k) for i, k in rows.items()}
        live = {a.handle.id for a in self.slots if a is not None}
        self._drafter.forget(live)
        order = list(rows)
        asks = []
        for i in order:
            a = self.slots[i]
            reserve = a.budget + self.spec.draft_max + 2
            asks.append((a.handle.id, a.seq.tokens, rows[i], reserve, a.handle.request.constraint))
        p_min = self.spec.p_min
        # one p_min per step (the first row's override, else the engine's)
        for i in order:
            own = getattr(self.slots[i].handle.request, "draft_p_min", None)
            if own is not None:
                p_min = own
                break
        got = self._drafter.propose(asks, p_min)
        return {i: got[j] for j, i in enumerate(order)}

    def _verify(self, plan, drafts: dict[int, list[int]], masks: dict[int, list]):
        self._sync_pool()
        step, (sampling, slots, params, state, _) = self._step_inputs(
            plan, None, self._params, self._state
        )
        R, T = plan.tokens.shape
        proposed = np.zeros((R, T), np.int32)
        proposed[:, : T - 1] = plan.tokens[:, 1:]
        n_draft = np.zeros(R, np.int32)
        for j, i in enumerate(plan.idx):
            n_draft[j] = len(drafts.get(i, ()))
        packed = self._position_masks(plan, drafts, masks)
        x, self.kv = paged_verify(*step[:6], *step[7:])
        toks, n_out, self._state = verify_sample(
            self.cfg,
            step[1],
            x,
            *jax.device_put((proposed, n_draft)),
            sampling,
            slots,
            params,
            state,
            packed,
        )
        plan.state = self._state
        self.counters["steps"] += 1
        self.counters["spec_steps"] += 1
        return toks, n_out

    def _position_masks(self, plan, drafts, masks):
        """Packed masks [R, T, W] for the verify step's positions, or None."""
        cons = self._constraints(plan)
        if not cons:
            return None
        per = {}
        for j, c in cons.items():
            i = plan.idx[j]
            per[j] = masks.get(i) or [np.array(c.mask(), np.uint32)]
        W = max(m.shape[-1] for ms in per.values() for m in ms)
        R, T = plan.tokens.shape
        out = np.full((R, T, W), 0xFFFFFFFF, np.uint32)
        for j, ms in per.items():
            for t, m in enumerate(ms):
                out[j, t] = 0
                out[j, t, : m.shape[-1]] = m
        return jax.device_put(out)

    def _spec_complete(self, plan, drafts, toks, n_out) -> None:
        toks, n_out = np.asarray(toks), np.asarray(n_out)
        for j, (i, a) in enumerate(zip(plan.idx, plan.rows, strict=True)):
            if self.slots[i] is not a:
                continue  # ended while this step was in flight
            m = int(n_out[j])
            self.counters["computed_tokens"] += plan.feed[j]
            with self._lock:
                self.mgr.commit(a.seq, m)  # the accepted drafts' KV; the rest rolls back
            k = len(drafts.get(i, ()))
            if k:
                self.counters["draft_tokens"] += k
                self.counters["draft_accepted"] += m - 1
                u = a.handle.usage
                u.draft_n = getattr(u, "draft_n", 0) + k
                u.draft_n_accepted = getattr(u, "draft_n_accepted", 0) + m - 1
            for tok in toks[j, :m].tolist():
                if not self._take(i, a, tok):
                    break


def _constrained(con, draft: list[int]) -> tuple[list[int], list[np.ndarray]]:
    """The draft cut at its first token `con` does not allow (or after which it is
    done), and the masks of positions 0..len: the constraint advanced over the draft,
    then rolled back."""
    masks = [np.array(con.mask(), np.uint32)]
    kept: list[int] = []
    try:
        for d in draft:
            m = masks[-1]
            if not (int(m[d >> 5]) >> (d & 31)) & 1:
                break
            con.advance(d)
            kept.append(d)
            if con.done:
                break
            masks.append(np.array(con.mask(), np.uint32))
    finally:
        if kept:
            con.rollback(len(kept))
    return kept, masks[: len(kept) + 1]
