"""Log-likelihood scoring: `score` (context → continuation) and `loglikelihood_rolling`.

Requests become token rows `context + continuation` (the input is the row without its
last token, the targets the row shifted by one), sorted longest first, packed `batch`
rows at a time into a [batch, bucket(T)] array (power-of-two lengths, the last batch
padded with empty rows), so a whole evaluation compiles a handful of shapes. One jitted
step (`llamay.model.score.token_logprobs`) returns the log-probability and greedy flag of
each row's last K targets (K the batch's longest continuation, a power of two: only those
go through the LM head); the host sums the continuation's. Requests whose rows share
their input (all but the last token: one-token answers after one context, as MMLU's
" A" / " B" / " C" / " D") run as one row with their last tokens picked side by side.

Text is split as lm-evaluation-harness does: trailing spaces of the context move to the
continuation, the continuation's tokens are those of `context + continuation` after the
context's. A BOS starts the context when the model's metadata adds one (as llama.cpp
does); an empty context is the BOS (or, without one, the EOS) token. Rows longer than
`max_length + 1` tokens keep their last `max_length + 1`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from llamay.errors import RequestError
from llamay.kv import bucket


@dataclass(frozen=True)
class Row:
    """One scored sequence: `tokens` (input + last target) and how many trailing targets
    count."""

    tokens: tuple[int, ...]
    n_scored: int


def prefix_token(model) -> int:
    tok = model.tokenizer
    pid = tok.bos_id if tok.bos_id is not None else tok.eos_id
    if pid is None:
        raise RequestError(
            "the model has neither a BOS nor an EOS token to start an empty context with"
        )
    return pid


def encode_context(model, text: str) -> list[int]:
    ids = model.tokenize(text, add_special=False)
    return ([model.tokenizer.bos_id] if model.tokenizer.add_bos else []) + ids


def encode_pair(model, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) of one request, split as lm-eval splits them."""
    n = len(context) - len(context.rstrip())
    if n:
        context, continuation = context[:-n], context[-n:] + continuation
    if not context:
        return [prefix_token(model)], model.tokenize(continuation, add_special=False)
    whole = encode_context(model, context + continuation)
    ctx = encode_context(model, context)
    return ctx, whole[len(ctx) :]


def rows_of(pairs: Sequence[tuple[Sequence[int], Sequence[int]]], max_length: int) -> list[Row]:
    rows = []
    for ctx, cont in pairs:
        if not cont:
            raise RequestError("a continuation is empty (nothing to score)")
        full = [*ctx, *cont][-(max_length + 1) :]
        if len(full) < 2:
            raise RequestError("a request needs at least one context token")
        rows.append(Row(tuple(full), min(len(cont), len(full) - 1)))
    return rows


def _batches(order: list[int], batch: int):
    for i in range(0, len(order), batch):
        yield order[i : i + batch]


def batch_rows(model, batch: int) -> int:
    """`batch` rounded up to a multiple of the model's data-parallel size."""
    from llamay.model.sharding import data_size

    dp = data_size(getattr(model, "mesh", None))
    return -(-max(1, batch) // dp) * dp


def run_step(model, tokens, positions, scored, picks):
    """One jitted scoring step over host arrays: rows tokens/positions [B, T], the
    positions scored in each, `scored` [B, K], and the tokens scored there, `picks`
    [B, K, J] (on the model's mesh, if any): (log-probabilities, greedy flags) of those
    tokens as numpy [B, K, J]."""
    from llamay.model.score import token_logprobs
    from llamay.model.sharding import fetch, put_batch

    mesh = getattr(model, "mesh", None)
    lp, greedy = token_logprobs(
        model.config,
        model.weights,
        put_batch(tokens, mesh),
        put_batch(positions, mesh),
        put_batch(scored, mesh),
        put_batch(picks, mesh),
        kv_dtype=model.runtime.kv_dtype,
        mesh=mesh,
    )
    return fetch(lp), fetch(greedy)


def score_rows(
    model,
    rows: Sequence[Row],
    batch: int = 8,
    progress: Callable[[int, int], None] | None = None,
) -> list[tuple[float, bool]]:
    """(sum of log-probabilities of each row's last `n_scored` targets, all greedy)."""
    if not model.config.causal:
        raise RequestError(f"{model.config.arch} is an encoder; only decoders score text")
    batch = batch_rows(model, batch)
    # rows with the same input (all but the last token: a multiple-choice task's one-token
    # answers after one context) run as one row, their last tokens picked side by side
    members: dict[tuple[int, ...], list[int]] = {}
    for i, row in enumerate(rows):
        members.setdefault(row.tokens[:-1], []).append(i)
    inputs = list(members)
    order = sorted(range(len(inputs)), key=lambda g: -len(inputs[g]))
    out: list[tuple[float, bool]] = [(0.0, False)] * len(rows)
    done = 0
    for idx in _batches(order, batch):
        groups = [(inputs[g], members[inputs[g]]) for g in idx]
        T = bucket(max(len(x) for x, _ in groups))
        # the LM head runs on each row's last K positions only (its continuation's)
        K = min(T, bucket(max(rows[i].n_scored for _, m in groups for i in m)))
        J = bucket(max(len(m) for _, m in groups), minimum=1)
        tokens = np.zeros((batch, T), np.int32)
        positions = np.full((batch, T), T, np.int32)
        scored = np.zeros((batch, K), np.int32)
        picks = np.zeros((batch, K, J), np.int32)
        for r, (x, m) in enumerate(groups):
            n = len(x)
            tokens[r, :n], positions[r, :n] = x, np.arange(n)
            scored[r] = np.maximum(np.arange(n - K, n), 0)
            for j in range(J):  # the spare picks repeat the group's last member's
                picks[r, :, j] = np.asarray(rows[m[min(j, len(m) - 1)]].tokens[1:])[scored[r]]
        lp, greedy = run_step(model, tokens, positions, scored, picks)
        for r, (_, m) in enumerate(groups):
            for j, i in enumerate(m):
                k = rows[i].n_scored
                out[i] = (
                    float(lp[r, K - k :, j].astype(np.float64).sum()),
                    bool(greedy[r, K - k :, j].all()),
                )
            done += len(m)
        if progress:
            progress(done, len(rows))
    return out


def default_max_length(model) -> int:
    return model.n_ctx - 1


def score(
    model,
    contexts: Sequence[str],
    continuations: Sequence[str],
    batch: int = 8,
    max_length: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[tuple[float, bool]]:
    """log p(continuation | context) and whether greedy decoding would produce it, for
    each pair (lm-eval's `loglikelihood`)."""
    if len(contexts) != len(continuations):
        raise RequestError(
            f"{len(contexts)} contexts but {len(continuations)} continuations: give one each"
        )
    pairs = [encode_pair(model, c, x) for c, x in zip(contexts, continuations, strict=True)]
    return score_rows(
        model, rows_of(pairs, max_length or default_max_length(model)), batch, progress
    )


def rolling_windows(
    tokens: Sequence[int], prefix: int, max_length: int
) -> list[tuple[list[int], list[int]]]:
    """Disjoint (context, continuation) windows that score every token of `tokens` once,
    each with up to `max_length` tokens of input: the first conditioned on `prefix`, each
    later one on the `max_length - n` tokens before its `n` predicted ones."""
    tokens = list(tokens)
    out: list[tuple[list[int], list[int]]] = []
    first = min(max_length, len(tokens))
    if first:
        out.append(([prefix], tokens[:first]))
    done = first
    while done < len(tokens):
        n = min(max_length, len(tokens) - done)
        end = done + n
        start = max(0, end - 1 - max_length)
        out.append((tokens[start:done], tokens[done:end]))
        done = end
    return out


def loglikelihood_rolling(
    model,
    texts: Sequence[str],
    batch: int = 8,
    max_length: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[float]:
    """The total log-likelihood of each text, every token scored once with windows of up
    to `max_length` tokens (lm-eval's `loglikelihood_rolling`, context length 1)."""
    max_length = max_length or default_max_length(model)
    prefix = prefix_token(model)
    owner, rows = [], []
    for i, text in enumerate(texts):
        windows = rolling_windows(model.tokenize(text, add_special=False), prefix, max_length)
        rows += rows_of(windows, max_length)
        owner += [i] * len(windows)
    totals = [0.0] * len(texts)
    for i, (lp, _) in zip(owner, score_rows(model, rows, batch, progress), strict=True):
        totals[i] += lp
    return totals
