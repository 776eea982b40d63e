"""A plain-numpy restatement of llama.cpp's sampler chain over a shrinking, sorted
candidate array (as `llama_token_data_array`), used as the oracle for the device chain.
Written from llama-sampling.cpp's definitions; no randomness (XTC is taken as firing)."""

from __future__ import annotations

import numpy as np


def _softmax(c):
    lg = np.array([lv for _, lv in c], np.float64)
    e = np.exp(lg - lg.max())
    return e / e.sum()


def _sort(c):
    return sorted(c, key=lambda t: -t[1])


def chain(logits, s, history=()):
    """Returns {token: final logit} of the candidates the draw sees."""
    c = [(i, float(v)) for i, v in enumerate(logits)]
    for b_tok, b in s.logit_bias:
        c = [(i, v + b if i == b_tok else v) for i, v in c]
    for stage in s.samplers:
        if len(c) == 0:
            break
        if stage == "penalties":
            n = len(history) if s.repeat_last_n < 0 else min(s.repeat_last_n, len(history))
            win = list(history)[len(history) - n :] if n else []
            cnt = {t: win.count(t) for t in set(win)}
            out = []
            for i, v in c:
                k = cnt.get(i, 0)
                if k:
                    v = v * s.repeat_penalty if v <= 0 else v / s.repeat_penalty
                    v -= k * s.frequency_penalty + s.presence_penalty
                out.append((i, v))
            c = out
        elif stage == "top_k" and s.top_k > 0:
            c = _sort(c)[: s.top_k]
        elif stage == "top_p" and s.top_p < 1.0:
            c = _sort(c)
            p = _softmax(c)
            cum, last = 0.0, len(c)
            for i in range(len(c)):
                cum += p[i]
                if cum >= s.top_p and i + 1 >= s.min_keep:
                    last = i + 1
                    break
            c = c[:last]
        elif stage == "min_p" and s.min_p > 0:
            mx = max(v for _, v in c)
            keep = [(i, v) for i, v in c if v >= mx + np.log(s.min_p)]
            c = keep if len(keep) >= max(s.min_keep, 1) else _sort(c)[: s.min_keep]
        elif stage == "typ_p" and s.typical_p < 1.0:
            p = _softmax(c)
            H = -np.sum(p * np.log(p))
            order = np.argsort(np.abs(-np.log(p) - H), kind="stable")
            cum, last = 0.0, len(c)
            for k, j in enumerate(order):
                cum += p[j]
                if cum > s.typical_p and k >= s.min_keep - 1:
                    last = k + 1
                    break
            c = [c[j] for j in order[:last]]
        elif stage == "top_n_sigma" and s.top_n_sigma > 0 and len(c) > 1:
            lg = np.array([v for _, v in c])
            thr = lg.max() - s.top_n_sigma * lg.std()
            c = [(i, v) for i, v in c if v >= thr]
        elif stage == "xtc" and s.xtc_probability > 0 and s.xtc_threshold <= 0.5 and len(c) >= 2:
            c = _sort(c)
            p = _softmax(c)
            pos_last = 0
            for i in range(len(c)):
                if p[i] >= s.xtc_threshold:
                    pos_last = i
                else:
                    break
            if len(c) - pos_last >= s.min_keep and pos_last > 0:
                c = c[pos_last:]
        elif stage == "temperature":
            if s.dynatemp_range > 0:
                if len(c) > 1:
                    lo = max(0.0, s.temperature - s.dynatemp_range)
                    hi = s.temperature + s.dynatemp_range
                    p = _softmax(c)
                    H = -np.sum(p[p > 0] * np.log(p[p > 0]))
                    t = lo + (hi - lo) * (H / np.log(len(c))) ** s.dynatemp_exponent
                    c = [(i, v / t) for i, v in c]
            elif s.temperature <= 0:
                best = max(c, key=lambda t: t[1])
                c = [best]
            else:
                c = [(i, v / s.temperature) for i, v in c]
    return dict(c)
