"""Log-likelihood scoring: `score` (context → continuation) and `loglikelihood_rolling`.

Requests become token rows `context + continuation` (the input is the row without its
last token, the targets the row shifted by one). Rows with the same input run as one
row with their last tokens picked side by side (one-token answers after one context, as
MMLU's " A" / " B" / " C" / " D"); rows whose inputs share the part before their scored
positions (a context and its several endings, as HellaSwag's) run that prefix once, its
KV copied to each ending's row (`llamay.model.score.prefix_logprobs`). Steps hold `batch`
rows in power-of-two shapes (prefix length, scored length, rows per prefix), so a whole
evaluation compiles a handful of programs; only scored positions go through the LM head.

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


def batch_rows(model, batch: int) -> int:
    """`batch` rounded up to a multiple of the model's data-parallel size."""
    from llamay.model.sharding import data_size

    dp = data_size(getattr(model, "mesh", None))
    return -(-max(1, batch) // dp) * dp


def _on_mesh(model, step, *arrays):
    """`step(cfg, weights, *arrays)` (a jitted scoring step) over host arrays [B, ...],
    on the model's mesh if any (rows along "data"): its two outputs as numpy arrays."""
    from llamay.model.sharding import fetch, put_batch

    mesh = getattr(model, "mesh", None)
    args = (put_batch(a, mesh) for a in arrays)
    lp, greedy = step(
        model.config, model.weights, *args, kv_dtype=model.runtime.kv_dtype, mesh=mesh
    )
    return fetch(lp), fetch(greedy)


def run_prefix_step(model, prefix, prefix_pos, suffix, suffix_pos, picks):
    """One jitted step of rows grouped by a shared prefix (`llamay.model.score.
    prefix_logprobs`) over host arrays: (log-probabilities, greedy flags) as numpy
    [G, R, K, J]."""
    from llamay.model.score import prefix_logprobs

    return _on_mesh(model, prefix_logprobs, prefix, prefix_pos, suffix, suffix_pos, picks)


@dataclass(frozen=True)
class _Unit:
    """Rows with one input (all but their last token): one row of a step, their last
    tokens picked side by side (a multiple-choice task's one-token answers)."""

    inputs: tuple[int, ...]
    members: tuple[int, ...]  # indices into the rows
    k: int  # positions scored: the members' most


def _work(rows: Sequence[Row], batch: int) -> list[tuple[tuple[int, ...], list[_Unit]]]:
    """(prefix, units continuing it) pieces of at most `batch` units: rows grouped by
    their input, those by the part of it before their scored positions (a context shared
    by several endings); the widest groups first, then the longest."""
    members: dict[tuple[int, ...], list[int]] = {}
    for i, row in enumerate(rows):
        members.setdefault(row.tokens[:-1], []).append(i)
    groups: dict[tuple[int, ...], list[_Unit]] = {}
    for x, m in members.items():
        k = max(rows[i].n_scored for i in m)
        groups.setdefault(x[: len(x) - k], []).append(_Unit(x, tuple(m), k))
    work = [(p, us[i : i + batch]) for p, us in groups.items() for i in range(0, len(us), batch)]
    return sorted(work, key=lambda w: (-len(w[1]), -len(w[0]) - max(u.k for u in w[1])))


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
    work = _work(rows, batch)
    out: list[tuple[float, bool]] = [(0.0, False)] * len(rows)
    done = at = 0
    while at < len(work):
        R = bucket(len(work[at][1]), minimum=1)  # rows per prefix (the widest first)
        G = batch_rows(model, max(1, batch // R))  # prefixes per step
        step, at = work[at : at + G], at + G
        # power-of-two shapes: a handful of programs for a whole evaluation
        P = bucket(max(len(p) for p, _ in step))
        K = bucket(max(u.k for _, us in step for u in us))
        J = bucket(max(len(u.members) for _, us in step for u in us), minimum=1)
        pad = P + K  # the position of padding: past the cache, dropped
        prefix, prefix_pos = np.zeros((G, P), np.int32), np.full((G, P), pad, np.int32)
        suffix, suffix_pos = np.zeros((G, R, K), np.int32), np.full((G, R, K), pad, np.int32)
        picks = np.zeros((G, R, K, J), np.int32)
        for g, (p, us) in enumerate(step):
            n = len(p)
            prefix[g, :n], prefix_pos[g, :n] = p, np.arange(n)
            for r, u in enumerate(us):
                suffix[g, r, : u.k], suffix_pos[g, r, : u.k] = u.inputs[n:], np.arange(n, n + u.k)
                for j in range(J):  # spare picks repeat the unit's last member's
                    t = rows[u.members[min(j, len(u.members) - 1)]].tokens
                    picks[g, r, : u.k, j] = t[n + 1 : n + 1 + u.k]
        lp, greedy = run_prefix_step(model, prefix, prefix_pos, suffix, suffix_pos, picks)
        for g, (_, us) in enumerate(step):
            for r, u in enumerate(us):
                for j, i in enumerate(u.members):
                    k = rows[i].n_scored
                    out[i] = (
                        float(lp[g, r, u.k - k : u.k, j].astype(np.float64).sum()),
                        bool(greedy[g, r, u.k - k : u.k, j].all()),
                    )
                done += len(u.members)
        if progress:
            progress(done, len(rows))
    return out


def default_max_length(model) -> int:
    return model.n_ctx - 1


def _texts(name: str, texts) -> None:
    """A list of strings, not one string (whose characters would each be a text)."""
    if isinstance(texts, str | bytes) or not all(isinstance(t, str) for t in texts):
        raise TypeError(f"{name} must be a list of strings, one per item")


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
    _texts("contexts", contexts), _texts("continuations", continuations)
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
    _texts("texts", texts)
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
