"""OpenAI's log-probability shapes from the engine's rows (token id, logprob, [(id,
logprob)] alternatives): chat `logprobs.content`, the legacy completions form, and the
prompt's own rows for `echo`."""

from __future__ import annotations

import numpy as np

#: The most alternatives a token's log-probability comes with (llama-server's n_probs).
MAX_N_PROBS = 64


def piece(lm, token_id: int) -> tuple[str, list[int]]:
    """A token's text (invalid UTF-8 replaced) and its bytes."""
    raw = lm.model.tokenizer.token_to_piece(token_id)
    return raw.decode("utf-8", "replace"), list(raw)


def chat_logprobs(lm, rows) -> dict:
    """A chat choice's `logprobs` of rows (token id, logprob, alternatives)."""
    content = []
    for tok, lp, alts in rows:
        text, raw = piece(lm, tok)
        tops = []
        for i, alp in alts:
            t, b = piece(lm, i)
            tops.append({"token": t, "logprob": alp, "bytes": b})
        content.append({"token": text, "logprob": lp, "bytes": raw, "top_logprobs": tops})
    return {"content": content, "refusal": None}


def legacy_logprobs(lm, rows, pos: int = 0) -> dict:
    """A completion choice's `logprobs` of rows (token id, logprob, alternatives); the
    text offsets start at `pos` (the characters sent before, when streaming)."""
    tokens, offsets = [], []
    for tok, _, _ in rows:
        text, _ = piece(lm, tok)
        tokens.append(text)
        offsets.append(pos)
        pos += len(text)
    return {
        "tokens": tokens,
        "token_logprobs": [lp for _, lp, _ in rows],
        "top_logprobs": [
            None if lp is None else _with_sampled({piece(lm, i)[0]: a for i, a in alts}, text, lp)
            for (_, lp, alts), text in zip(rows, tokens, strict=True)
        ],
        "text_offset": offsets,
    }


def _with_sampled(top: dict[str, float], text: str, lp: float) -> dict[str, float]:
    """OpenAI's legacy `top_logprobs` entry: "the logprob of the sampled token" always
    among them (logprobs + 1 entries at most)."""
    if text not in top:
        top[text] = lp
    return top


def prompt_logprobs(lm, ids: list[int], n: int) -> list[tuple[int, float | None, list]]:
    """Rows (token id, logprob, top n alternatives) of a prompt's own tokens, for `echo`:
    each token under the model's distribution after the ones before it (the first has
    none, as OpenAI reports it)."""
    logits = np.asarray(lm.model.logits(ids), np.float64)[:-1]
    logp = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
    rows: list[tuple[int, float | None, list]] = [(ids[0], None, [])]
    for tok, row in zip(ids[1:], logp, strict=True):
        top = np.argsort(-row, kind="stable")[:n]
        rows.append((tok, float(row[tok]), [(int(j), float(row[j])) for j in top]))
    return rows
