"""The jit-compiled step of the continuous-batching scheduler: every slot feeds its
pending tokens (a prefill chunk, or one token when decoding) through the paged pool
(`paged_step`), and the slots that reach their end sample their next token, on device
(`paged_sample`, a program of its own).

Shapes are static per (rows, T bucket, page-table bucket): T is 1 for pure decode
steps and a power of two up to the prefill chunk otherwise; padding rows and
positions write nothing (their page is out of range and dropped).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from llamay.engine.programs import persistent_jit
from llamay.model import forward
from llamay.model.forward import head_rows, real_tokens
from llamay.sample import SamplingParams, sample

PAD_POSITION = 1 << 30  # past any page table: never written, never attended


@persistent_jit(static_argnames=("cfg",), donate_argnames=("kv",))  # kept on disk: programs.py
def paged_step(
    cfg,
    weights,
    kv,
    tokens,
    positions,
    page_table,
    last,
    local_table=None,
    local_base=None,
    embeds=None,
):
    """The forward half of a step over R packed rows: tokens/positions [R, T],
    page_table [R, M], last [R] (index in T of each row's last fed token), local_table
    [R, W] and local_base [R] (the local pool's tables, and the position each one's slot
    0 holds: sliding-window models) or None, embeds: (values [R, T, E], mask [R, T]) of
    the image embeddings fed in place of tokens (`forward`'s `embeds`) or None (text
    steps: their programs as without images). Returns (logits [R, V] at each row's last
    token, kv). Sampling is its own program (`paged_sample`), so what only sampling
    varies (constraint masks, top-N log-probabilities) compiles a program per row count,
    not one per step shape."""
    x, kv = paged_hidden(
        cfg, weights, kv, tokens, positions, page_table, local_table, local_base, embeds
    )
    x_last = jnp.take_along_axis(x, last[:, None, None], axis=1)
    real = real_tokens(kv, jnp.take_along_axis(positions, last[:, None], axis=1), page_table)
    return head_rows(cfg, weights, x_last, real)[:, 0], kv


def paged_hidden(
    cfg, weights, kv, tokens, positions, page_table, local_table=None, local_base=None, embeds=None
):
    """The blocks over the paged pool (the arguments of `paged_step`): (final hidden
    states [R, T, E] at every fed position, kv)."""
    x, kv, _ = forward(
        cfg,
        weights,
        kv,
        tokens,
        positions,
        page_table=page_table,
        local_table=local_table,
        local_base=local_base,
        embeds=embeds,
    )
    return x, kv


@persistent_jit  # state not donated: a pipelined step's log-probabilities are read after the next
def paged_sample(logits, sampling, slots, params, state, mask=None):
    """The sampling half of a step: logits [R, V], sampling [R] bool (rows that sample
    now), slots [R] (each row's engine slot; padding rows: out of range), params and
    state per engine slot (rows not sampling keep theirs), mask: packed allowed-token
    bits [R, W] (constraints) or None. Returns (next tokens [R], sampler state)."""

    def take(a):
        return jnp.take(a, slots, axis=0, mode="clip")

    p = jax.tree_util.tree_map(take, params)
    st = jax.tree_util.tree_map(take, state)
    nxt, new = sample(logits, p, st, mask)

    def put(full, n, o):
        m = sampling.reshape(sampling.shape + (1,) * (n.ndim - 1))
        return full.at[slots].set(jnp.where(m, n, o), mode="drop")

    return nxt, jax.tree_util.tree_map(put, state, new, st)


def set_rows(params: SamplingParams | object, rows, new):
    """Rows `rows` of a per-slot pytree (sampler state) replaced by the first len(rows)
    of `new`; `new`'s rows past those are padding (bucketed row counts) and dropped."""
    n = jax.tree_util.tree_leaves(new)[0].shape[0]
    idx = np.full(n, np.iinfo(np.int32).max, np.int32)  # out of range: dropped
    idx[: len(rows)] = rows
    return _set_rows(params, jax.device_put(idx), new)


@persistent_jit  # one program (per row count), not a dozen eager scatters at a request's start
def _set_rows(params, idx, new):
    return jax.tree_util.tree_map(lambda a, b: a.at[idx].set(b, mode="drop"), params, new)


@persistent_jit(static_argnames=("cfg", "steps"), donate_argnames=("kv",))
def paged_decode(
    cfg, steps, weights, kv, tokens, positions, page_table, sampling, slots, params, state
):
    """`steps` decode steps in one program (multi-step decode, `StepWorker._step`): each
    feeds every row the token the last one sampled (the first: `tokens` [R, 1]) at the
    next position (the first: `positions` [R, 1]) and samples, as `paged_step` then
    `paged_sample` would, `steps` times. The page tables must already hold every
    position the steps write. Returns (tokens [steps, R], the last of them [R, 1] to
    feed the next dispatch, kv, sampler state)."""
    last = jnp.zeros(tokens.shape[0], jnp.int32)

    def one(carry, _):
        kv, tok, pos, st = carry
        logits, kv = paged_step.__wrapped__(cfg, weights, kv, tok, pos, page_table, last)
        nxt, st = paged_sample.__wrapped__(logits, sampling, slots, params, st)
        # padding rows stay past every table (PAD_POSITION + i is still out of range)
        return (kv, nxt[:, None], pos + 1, st), nxt

    (kv, tok, _, state), out = jax.lax.scan(one, (kv, tokens, positions, state), None, length=steps)
    return out, tok, kv, state
