"""OpenAI's `best_of` on /v1/completions: `best_of` candidates generated server-side, the
`n` "best" returned, best meaning the highest log probability per token (OpenAI's
legacy Completions reference)."""

from __future__ import annotations

from llamay.serve.core import TextGen


def best_candidates(gens: list[TextGen], texts: list[str], best_of: int, n: int):
    """(gens, texts) keeping, of each prompt's `best_of` candidates in order, the `n`
    whose tokens have the highest mean log-probability (OpenAI's "best": the highest log
    probability per token), best first; a candidate without tokens ranks last."""

    def score(g: TextGen) -> float:
        lps = [lp for lp, _ in g.token_logprobs]
        return sum(lps) / len(lps) if lps else float("-inf")

    keep_g, keep_t = [], []
    for start in range(0, len(gens), best_of):
        group = list(range(start, start + best_of))
        group.sort(key=lambda j: -score(gens[j]))  # stable: ties keep their order
        keep_g += [gens[j] for j in group[:n]]
        keep_t += [texts[j] for j in group[:n]]
    return keep_g, keep_t
