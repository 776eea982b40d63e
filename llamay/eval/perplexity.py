"""Perplexity the way llama.cpp's perplexity tool computes it.

The whole text is tokenised (BOS only if the model adds one) and cut into
`len(tokens) // ctx` chunks of `ctx` tokens (the rest is dropped); with BOS the first
token of each chunk becomes BOS. Each chunk runs from an empty context and only its
second half is scored: positions j = ctx/2 .. ctx-2 predict token j+1, so every scored
token has at least ctx/2 tokens of context. `ppl = exp(mean NLL)`; its uncertainty is
llama.cpp's: ppl · sqrt(var(NLL) / (count - 1)).

`batch` chunks run together (llama.cpp's n_seq); the LM head only sees the scored half.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from llamay.errors import RequestError
from llamay.eval.scoring import batch_rows, run_prefix_step


@dataclass
class PerplexityResult:
    ppl: float
    uncertainty: float
    n_tokens: int  # tokens in the text
    n_chunks: int
    scored_per_chunk: int
    running_ppl: list[float] = field(default_factory=list)
    nll: np.ndarray | None = None  # [n_chunks, scored_per_chunk]

    def to_json(self) -> dict:
        return {
            "ppl": self.ppl,
            "uncertainty": self.uncertainty,
            "n_tokens": self.n_tokens,
            "n_chunks": self.n_chunks,
            "scored_per_chunk": self.scored_per_chunk,
            "running_ppl": self.running_ppl,
        }


def chunks_of(model, text: str, ctx: int, max_chunks: int | None = None) -> tuple[int, np.ndarray]:
    """(token count of the text, its chunks [n_chunks, ctx] as llama.cpp cuts them)."""
    tok = model.tokenizer
    ids = model.tokenize(text, add_special=False)
    if tok.add_bos:
        ids = [tok.bos_id, *ids]
    n = len(ids) // ctx
    if max_chunks is not None:
        n = min(n, max_chunks)
    if n == 0:
        raise RequestError(
            f"the text has {len(ids)} tokens, fewer than one chunk of --ctx {ctx}; "
            "use a longer text or a smaller --ctx"
        )
    chunks = np.asarray(ids[: n * ctx], np.int32).reshape(n, ctx)
    if tok.add_bos:
        chunks[:, 0] = tok.bos_id
    return len(ids), chunks


def perplexity(
    model,
    text: str,
    ctx: int = 512,
    batch: int = 1,
    max_chunks: int | None = None,
    progress: Callable[[int, int, float], None] | None = None,
) -> PerplexityResult:
    """Perplexity of `text` in chunks of `ctx` tokens; `progress(done, total, ppl)` after
    each batch."""
    if ctx < 4 or ctx % 2:
        raise RequestError(f"--ctx must be an even number of at least 4, not {ctx}")
    if ctx > model.n_ctx:
        raise RequestError(f"--ctx {ctx} exceeds the model's context of {model.n_ctx} tokens")
    n_tokens, chunks = chunks_of(model, text, ctx, max_chunks)
    batch = batch_rows(model, batch)
    first = ctx // 2
    n = len(chunks)
    # the unscored first half is each chunk's prefix, the second half its one row after it
    prefix_pos = np.broadcast_to(np.arange(first, dtype=np.int32), (batch, first))
    suffix_pos = np.broadcast_to(np.arange(first, ctx, dtype=np.int32), (batch, 1, ctx - first))
    nll = np.zeros((n, ctx - 1 - first), np.float64)
    running: list[float] = []
    for start in range(0, n, batch):
        rows = chunks[start : start + batch]
        k = len(rows)
        tokens = np.zeros((batch, ctx), np.int32)
        picks = np.zeros((batch, 1, ctx - first, 1), np.int32)  # each position's next token
        tokens[:k] = rows
        picks[:k, 0, :-1, 0] = rows[:, first + 1 :]
        prefix, suffix = tokens[:, :first], tokens[:, None, first:]
        lp, _ = run_prefix_step(model, prefix, prefix_pos, suffix, suffix_pos, picks)
        nll[start : start + k] = -lp[:k, 0, :-1, 0]
        for i in range(start, start + k):
            running.append(math.exp(nll[: i + 1].mean()))
        if progress:
            progress(start + k, n, running[-1])
    mean = nll.mean()
    count = nll.size
    var = (nll * nll).mean() - mean * mean
    ppl = math.exp(mean)
    unc = ppl * math.sqrt(var / (count - 1)) if var > 0 and count > 1 else 0.0
    return PerplexityResult(ppl, unc, n_tokens, n, nll.shape[1], running, nll)
