"""llama-server's `post_sampling_probs`: each generated token's probabilities after the
sampler chain (llama.cpp's candidates once top_k, top_p, min_p and temperature have run
and `dist` has normalised them), from the engine's pre-sampling log-probabilities of the
best `WIDTH` tokens.

The chain is replayed on the host in the request's sampler order, as llama.cpp's
samplers do it: top_k keeps the k best, top_p keeps the shortest head whose softmax over
the candidates left reaches p, min_p keeps logits >= best + log(p) (each keeps at least
min_keep), temperature divides the logits (<= 0: the best alone, probability 1), logit
bias is added first. That is exact whenever every candidate the chain keeps is among the
`WIDTH` best, which the replay checks; a sampler that needs more (the penalties over the
history, DRY, XTC, typical, top-n-sigma, dynamic temperature, mirostat, a grammar's mask)
or a chain that keeps more than `WIDTH` candidates is refused with a 400 naming it, never
approximated.
"""

from __future__ import annotations

import math

import numpy as np

from llamay.sample import Sampler
from llamay.serve.errors import ApiError

#: Pre-sampling alternatives asked of the engine per token (its most).
WIDTH = 64


def check(sampler: Sampler, constrained: bool) -> None:
    """400 unless the chain can be replayed exactly from the best WIDTH tokens."""
    off = {
        "penalties": sampler.repeat_penalty == 1.0
        and sampler.presence_penalty == 0.0
        and sampler.frequency_penalty == 0.0,
        "dry": sampler.dry_multiplier == 0.0,
        "xtc": sampler.xtc_probability <= 0.0 or sampler.xtc_threshold > 0.5,
        "typ_p": sampler.typical_p >= 1.0,
        "top_n_sigma": sampler.top_n_sigma <= 0.0,
    }
    used = [s for s in sampler.samplers if s in off and not off[s]]
    if sampler.mirostat:
        used.append("mirostat")
    if sampler.dynatemp_range > 0:
        used.append("dynatemp_range")
    if constrained:
        used.append("grammar/json_schema")
    if used and sampler.temperature > 0:
        raise ApiError(
            400,
            f"post_sampling_probs is not available with {', '.join(used)}: llamay replays the "
            "sampler chain from the best 64 tokens, and these need the whole distribution",
            param="post_sampling_probs",
        )


def post_sampling(
    sampler: Sampler, token: int, alts: list[tuple[int, float]], n_probs: int
) -> tuple[float, list[tuple[int, float]]]:
    """(the token's probability, the best n_probs (id, probability) with p > 0) after the
    chain, from `alts`: the WIDTH best (id, pre-sampling logprob), best first."""
    ids = np.asarray([i for i, _ in alts], np.int64)
    logit = np.asarray([lp for _, lp in alts], np.float64)
    full = len(alts) < WIDTH  # the vocabulary is smaller than the width: nothing unseen
    # every token not listed has a logit <= floor: a kept set reaching below it may miss some
    floor = -np.inf if full else float(logit[-1])
    bias = dict(sampler.logit_bias)
    if bias:
        listed = set(ids.tolist())
        if not full and any(b > 0 and t not in listed for t, b in bias.items()):
            raise ApiError(
                400,
                "post_sampling_probs: a positive logit_bias on a token outside the best 64 "
                "can change which tokens the chain keeps (not replayed)",
                param="post_sampling_probs",
            )
        logit = logit + np.asarray([bias.get(int(i), 0.0) for i in ids])
        order = np.argsort(-logit, kind="stable")
        ids, logit = ids[order], logit[order]
        ids, logit = ids[np.isfinite(logit)], logit[np.isfinite(logit)]
        if not len(ids):
            raise ApiError(400, "post_sampling_probs: logit_bias bans the best 64 tokens")
    n = len(ids)  # candidates left (a prefix of the sorted list)
    bounded = full  # whether the candidates are known to lie within `alts`
    keep = max(1, sampler.min_keep)
    if sampler.temperature <= 0:
        if logit[0] < floor:
            bounded = False
        else:
            return (1.0 if int(ids[0]) == token else 0.0), [(int(ids[0]), 1.0)][:n_probs]
    for stage in sampler.samplers if sampler.temperature > 0 else ():
        if stage == "top_k" and sampler.top_k > 0:
            k = max(sampler.top_k, min(keep, n))
            if k <= n and logit[k - 1] >= floor:
                n, bounded = k, True
        elif stage == "top_p" and sampler.top_p < 1.0:
            z = logit[:n] - logit[0]
            p = np.exp(z)
            if not bounded:  # the softmax over the whole vocabulary: the logprobs are it
                if bias:
                    continue  # ... unless biased: unknown, and the chain stays unbounded
                p = np.exp(logit[:n])
            else:
                p = p / p.sum()
            cum = np.cumsum(p)
            hit = np.nonzero(cum >= sampler.top_p)[0]
            if len(hit):
                n, bounded = max(int(hit[0]) + 1, min(keep, n)), True
        elif stage == "min_p" and sampler.min_p > 0.0:
            cut = logit[0] + math.log(sampler.min_p)
            m = int(np.sum(logit[:n] >= cut))
            if bounded or cut > floor:  # (else tokens not listed may pass it too)
                n, bounded = max(m, min(keep, n)), True
    if not bounded:
        raise ApiError(
            400,
            "post_sampling_probs: this sampler chain keeps more than 64 candidates (set "
            "top_k <= 64, or a top_p/min_p that cuts within them)",
            param="post_sampling_probs",
        )
    z = (logit[:n] - logit[0]) / sampler.temperature
    p = np.exp(z)
    p /= p.sum()
    probs = {int(i): float(q) for i, q in zip(ids[:n], p, strict=True)}
    top = [(int(i), float(q)) for i, q in zip(ids[:n], p, strict=True) if q > 0][:n_probs]
    return probs.get(token, 0.0), top
