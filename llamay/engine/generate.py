"""Single-sequence generation over the step functions: prefill once, then decode
token by token until a stop token, the token budget or the context end.

The host keeps the bookkeeping (positions, stop checks); each step returns one
token id per row, the only device→host transfer per step.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from llamay.engine.steps import (
    decode_logits,
    decode_many,
    decode_step,
    prefill_logits,
    prefill_step,
    sample_masked,
)
from llamay.errors import ContextOverflowError, RequestError
from llamay.kv import bucket, cache_slots, new_dense_kv
from llamay.sample import Sampler, SamplerState, SamplingParams
from llamay.sample.constraint import Constraint


def default_decode_steps() -> int:
    """Decode steps per dispatch while nothing arrives, for the engines of `llamay serve`
    and of `Model.generate` (`BatchEngine.decode_steps`), and for `Generation` (tokens
    per dispatch while nothing needs a host look between them): `$LLAMAY_DECODE_STEPS`, default
    4. Measured through the server (bench/llamaserver_compare.py, SmolLM2, 64 tokens a
    stream, a quiet Sapphire Rapids host), decode tok/s at 1 / 8 streams for 1, 4, 8 steps:
    140 / 424, 158 / 450, 166 / 454, TTFT unchanged; 4 keeps the wait of a request arriving
    mid-dispatch to about 4 steps (~25 ms there)."""
    text = os.environ.get("LLAMAY_DECODE_STEPS", "4")
    try:
        return max(1, int(text))
    except ValueError:
        raise ValueError(f"LLAMAY_DECODE_STEPS must be an integer, not {text!r}") from None


@dataclass(frozen=True)
class Runtime:
    """What the steps need besides the prompt: config, weights and cache settings."""

    cfg: object
    weights: dict
    n_ctx: int
    kv_dtype: object = jnp.float32


#: A longer prompt prefills in chunks of this many tokens, then a bucketed tail of the
#: rest (1..PREFILL_CHUNK tokens): in one call it would be padded to the next power of
#: two (4,097 tokens computed as 8,192) and compiled for that length.
PREFILL_CHUNK = 512


def prefill_chunk(model, exact: int) -> int:
    """The most prompt tokens one engine step prefills for `model`: llamacpp numerics take
    llama.cpp's ubatch (PREFILL_CHUNK), since its kernels, flash attention's path among
    them, round by the batch's size; exact numerics take `exact` (the caller's trade of
    prefill speed against the decode latency of the rows beside it)."""
    return PREFILL_CHUNK if getattr(model, "numerics", "exact") == "llamacpp" else exact


def padded_batch(ids: list[int], slots: int, start: int = 0):
    """One row padded to its prefill bucket, at positions start..; padding gets position
    `slots` (dropped)."""
    t = len(ids)
    tb = bucket(t)
    tokens = np.zeros((1, tb), np.int32)
    tokens[0, :t] = ids
    positions = np.full((1, tb), slots, np.int32)
    positions[0, :t] = start + np.arange(t)
    return jnp.asarray(tokens), jnp.asarray(positions)


def prefill_chunks(rt: Runtime, kv, ids: list[int], slots: int):
    """kv with the whole PREFILL_CHUNKs of ids before its last 1..PREFILL_CHUNK tokens
    prefilled; returns (kv, where the rest starts)."""
    start = (len(ids) - 1) // PREFILL_CHUNK * PREFILL_CHUNK
    last = jnp.asarray([PREFILL_CHUNK - 1], jnp.int32)
    for i in range(0, start, PREFILL_CHUNK):
        tokens, positions = padded_batch(ids[i : i + PREFILL_CHUNK], slots, i)
        _, kv = prefill_logits(rt.cfg, rt.weights, kv, tokens, positions, last)
    return kv, start


def check_prompt(n_prompt: int, n_ctx: int, reply: bool = True) -> None:
    """A prompt of `n_prompt` tokens fits a context of `n_ctx` with room for a `reply`
    token (without: logits of the whole context, n_prompt <= n_ctx)."""
    if n_prompt == 0:
        raise RequestError("the prompt is empty (no tokens to condition on)")
    if n_prompt >= n_ctx + (not reply):
        raise ContextOverflowError(
            f"the prompt has {n_prompt} tokens; the context holds {n_ctx} "
            "(shorten the prompt or load the model with a larger n_ctx: `-c` on the command "
            "line)",
            n_prompt,
            n_ctx,
        )


def token_ids(ids: Any, n_vocab: int | None) -> list[int]:
    """`ids` as a list of token ids, each an integer in the vocabulary [0, n_vocab) (any
    int32 without `n_vocab`), or a clear error: a bad id would index past the embedding
    table (garbage, no error) or break a batch's int32 arrays."""
    if isinstance(ids, str | bytes) or not hasattr(ids, "__iter__"):
        raise TypeError(
            f"token ids must be a sequence of integers, not {type(ids).__name__} "
            "(text goes through tokenize() first)"
        )
    top = n_vocab or 2**31
    if isinstance(ids, np.ndarray):
        if ids.ndim != 1:
            raise TypeError(f"token ids must be one sequence, not an array of shape {ids.shape}")
        if ids.dtype.kind in "iu":  # the fast path for arrays of ids
            if ids.size and (ids.min() < 0 or ids.max() >= top):
                bad = next(t for t in ids.tolist() if not 0 <= t < top)
                raise RequestError(f"token id {bad} is not in the vocabulary (0..{top - 1})")
            return ids.tolist()
    elif isinstance(ids, list | tuple) and ids and set(map(type, ids)) == {int}:
        # plain ints (no bool: its type is not int): C-level checks, 5x the walk below
        if min(ids) < 0 or max(ids) >= top:
            bad = next(t for t in ids if not 0 <= t < top)
            raise RequestError(f"token id {bad} is not in the vocabulary (0..{top - 1})")
        return list(ids)
    out = []
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int | np.integer):
            raise TypeError(f"token ids must be integers, not {t!r}")
        if not 0 <= t < top:
            raise RequestError(f"token id {t} is not in the vocabulary (0..{top - 1})")
        out.append(int(t))
    return out


@dataclass
class Generation:
    """Iterator over generated token ids; `finish_reason` is "stop" or "length" at the end.

    With a `constraint` (`llamay.sample.constraint.Constraint`), each step's logits are
    masked on device by the constraint's packed bitmask; the host computes the next
    mask while the device runs the next forward pass, and generation stops when the
    constraint is done. `mask_seconds` totals the host time spent in the constraint.
    With `sampler.n_probs`, `logprobs` collects per token (logprob, [(id, logprob)...]).
    """

    rt: Runtime
    prompt_ids: list[int]
    max_tokens: int
    sampler: Sampler
    stop_ids: frozenset[int]
    constraint: Constraint | None = None
    pieces: Sequence[bytes] | None = None  # token bytes, for DRY's sequence breakers
    encode: Callable[[str], list[int]] | None = None  # for breakers spanning tokens
    finish_reason: str | None = None
    n_generated: int = field(default=0)
    mask_seconds: float = 0.0
    logprobs: list = field(default_factory=list)
    decode_steps: int | None = None  # tokens per dispatch; None: `default_decode_steps()`

    def _setup(self):
        rt, cfg = self.rt, self.rt.cfg
        n = len(self.prompt_ids)
        check_prompt(n, rt.n_ctx)
        # a negative max_tokens: until the end or a full context (llama.cpp's -1)
        budget = rt.n_ctx - n if self.max_tokens < 0 else min(self.max_tokens, rt.n_ctx - n)
        slots = cache_slots(n + max(budget, 1), rt.n_ctx)
        kv = new_dense_kv(cfg.n_layers, 1, slots, cfg.n_kv_heads, cfg.head_dim, rt.kv_dtype)
        vocab = getattr(cfg, "vocab", None) or (len(self.pieces) if self.pieces else None)
        params = SamplingParams.stack([self.sampler], vocab, self.pieces, self.encode)
        state = SamplerState.init([self.sampler], [self.prompt_ids], history=rt.n_ctx)
        kv, start = prefill_chunks(rt, kv, self.prompt_ids, slots) if budget > 0 else (kv, 0)
        tokens, positions = padded_batch(self.prompt_ids[start:], slots, start)
        last = jnp.asarray([n - start - 1], jnp.int32)
        return budget, kv, params, state, tokens, positions, last

    def _record(self, state) -> None:
        if self.sampler.n_probs:
            top = list(
                zip(
                    np.asarray(state.top_ids[0]).tolist(),
                    np.asarray(state.top_logprobs[0]).tolist(),
                    strict=True,
                )
            )
            self.logprobs.append((float(state.token_logprob[0]), top))

    def __iter__(self) -> Iterator[int]:
        if self.constraint is not None:
            yield from self._constrained()
            return
        rt, cfg = self.rt, self.rt.cfg
        budget, kv, params, keys, tokens, positions, last = self._setup()
        if budget <= 0:
            self.finish_reason = "length"
            return
        nxt, keys, kv = prefill_step(cfg, rt.weights, kv, tokens, positions, last, params, keys)
        # per-token log-probabilities are read off the sampler's state after every step
        steps = 1 if self.sampler.n_probs else self.decode_steps or default_decode_steps()
        block, sampled = nxt[None], 1  # tokens [k, 1] to hand out; tokens sampled so far
        while True:
            # Dispatch the next steps before reading these tokens back, so the device
            # works while the host checks for stops and detokenises. `steps` tokens per
            # dispatch while the budget has room for them, then one at a time.
            ahead, left = None, budget - sampled
            if left > 0:
                at = jnp.asarray([len(self.prompt_ids) + sampled - 1], jnp.int32)
                if steps > 1 and left >= steps:
                    ahead = decode_many(cfg, steps, rt.weights, kv, block[-1], at, params, keys)
                else:
                    one, k_, kv_ = decode_step(cfg, rt.weights, kv, block[-1], at, params, keys)
                    ahead = one[None], k_, kv_
                sampled += ahead[0].shape[0]
            for tok in np.asarray(block[:, 0]).tolist():
                if tok in self.stop_ids:
                    self.finish_reason = "stop"
                    return
                self._record(keys)
                self.n_generated += 1
                yield tok
            if ahead is None:
                self.finish_reason = "length"
                return
            block, keys, kv = ahead

    def _mask(self) -> jax.Array:
        t0 = time.perf_counter()
        m = self.constraint.mask()
        self.mask_seconds += time.perf_counter() - t0
        return jnp.asarray(m[None])

    def _constrained(self) -> Iterator[int]:
        rt, cfg, con = self.rt, self.rt.cfg, self.constraint
        budget, kv, params, state, tokens, positions, last = self._setup()
        if budget <= 0:
            self.finish_reason = "length"
            return
        logits, kv = prefill_logits(cfg, rt.weights, kv, tokens, positions, last)
        mask = self._mask()  # computed while the device prefills
        nxt, state = sample_masked(logits, params, state, mask)
        pos = len(self.prompt_ids)
        while True:
            ahead = None
            if self.n_generated + 1 < budget:
                ahead = decode_logits(cfg, rt.weights, kv, nxt, jnp.asarray([pos], jnp.int32))
            tok = int(nxt[0])
            if tok in self.stop_ids and con.accepting:
                self.finish_reason = "stop"
                return
            t0 = time.perf_counter()
            con.advance(tok)
            self.mask_seconds += time.perf_counter() - t0
            self._record(state)
            self.n_generated += 1
            yield tok
            if con.done:
                self.finish_reason = "stop"
                return
            if ahead is None:
                self.finish_reason = "length"
                return
            logits, kv = ahead
            mask = self._mask()  # computed while the device runs the forward pass
            nxt, state = sample_masked(logits, params, state, mask)
            pos += 1
