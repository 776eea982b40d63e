"""CTC decoders over per-frame log-probabilities `[T, C]` (batched: `[B, T, C]`).

- `greedy_decode`: argmax per frame, collapse repeats, drop blanks.
- `prefix_beam_search`: the classic CTC prefix beam search (blank / non-blank
  probabilities per prefix, so a prefix's score is the sum over all its alignments).
- `beam_search` (`llamay.ocr.word_beam`): word-level beam search with pyctcdecode's
  semantics (a beam is text + partial word + last character; scores fused per frame), plus a lexicon
  (soft: out-of-lexicon penalty; hard: only lexicon words), word insertion bonus
  `beta`, an ARPA word n-gram LM weighted by `alpha`, and hotwords with a bonus.
  Results carry word frame spans and per-word confidences.

The hot loop of both beam searches is vectorised with numpy: every (beam, candidate
character) expansion of a frame is one array, prefixes are interned through a sorted
edge table, merging is a stable sort plus `logaddexp.reduceat`, pruning one argsort.
Python runs once per *new* prefix (to keep its string and, at word ends, to query the
language model), never per (beam, character) pair.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from llamay.errors import OCRError

MIN_TOKEN_CLIP_P = 1e-15
LN10 = math.log(10.0)  # ARPA scores are log10; decoding is in natural log
AVG_WORD_LEN = 6  # partial words longer than this get a proportionally larger OOV penalty


# --- inputs ----------------------------------------------------------------------


def log_probs(x: np.ndarray) -> np.ndarray:
    """Per-frame natural-log probabilities from probabilities or logits (the last axis
    is the class axis): rows that already sum to 1 are read as probabilities, anything
    else as logits (log-softmax). Clipped to [log 1e-15, 0], as pyctcdecode does."""
    x = np.asarray(x, np.float64)
    if x.shape[-1] == 0:
        raise OCRError("log_probs: the class axis is empty")
    if x.size and math.isclose(float(x.sum(axis=-1).mean()), 1.0):
        return np.log(np.clip(x, MIN_TOKEN_CLIP_P, 1.0))
    m = np.max(x, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        out = (x - m) - np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True))
    return np.clip(out, math.log(MIN_TOKEN_CLIP_P), 0.0)


@dataclass(frozen=True)
class Alphabet:
    """CTC output labels: `labels[i]` is the text of class i ("" for the blank)."""

    labels: tuple[str, ...]
    blank: int = 0

    @classmethod
    def from_labels(cls, labels: Sequence[str], blank: int | None = None) -> Alphabet:
        """Labels with the blank given by index, or found as "" (pyctcdecode appends
        one at the end when there is none; so do we)."""
        labels = list(labels)
        if blank is None:
            if "" in labels:
                blank = labels.index("")
            else:
                labels.append("")
                blank = len(labels) - 1
        if not 0 <= blank < len(labels):
            raise OCRError(f"blank index {blank} is outside the {len(labels)} labels")
        labels[blank] = ""
        return cls(tuple(labels), blank)

    @property
    def space(self) -> int:
        """The index of " " (word separator), or -1."""
        try:
            return self.labels.index(" ")
        except ValueError:
            return -1

    def __len__(self) -> int:
        return len(self.labels)


def check_logp(logp: np.ndarray, alphabet: Alphabet) -> np.ndarray:
    logp = np.asarray(logp, np.float64)
    if logp.ndim != 2 or logp.shape[1] != len(alphabet):
        raise OCRError(
            f"expected log-probabilities of shape [T, {len(alphabet)}] for this alphabet, "
            f"got {list(logp.shape)}"
        )
    return logp


# --- results ----------------------------------------------------------------------


@dataclass
class Word:
    text: str
    start: int  # first frame
    end: int  # one past the last frame
    confidence: float  # geometric mean over the span of the best class probability


@dataclass
class Hypothesis:
    text: str
    words: list[Word]
    logit_score: float  # CTC path log-probability (summed over merged alignments)
    score: float  # fused score: logit_score + LM / lexicon / hotword terms
    ids: list[int] = field(default_factory=list)  # emitted class ids (greedy and prefix)

    @property
    def word_frames(self) -> list[tuple[str, tuple[int, int]]]:
        """pyctcdecode's `[(word, (start, end)), ...]`."""
        return [(w.text, (w.start, w.end)) for w in self.words]


def confidence(logp: np.ndarray, start: int, end: int) -> float:
    if end <= start or start < 0:
        return 0.0
    return float(np.exp(np.mean(np.max(logp[start:end], axis=1))))


# --- greedy -------------------------------------------------------------------------


def greedy_decode(
    logp: np.ndarray, alphabet: Alphabet, lengths: Sequence[int] | None = None
) -> list[Hypothesis] | Hypothesis:
    """Best path: argmax per frame, collapse repeats, drop blanks. `logp` is `[T, C]`
    (returns one Hypothesis) or `[B, T, C]` with optional valid `lengths` (a list)."""
    x = np.asarray(logp)
    if x.ndim == 3:
        lengths = [x.shape[1]] * x.shape[0] if lengths is None else list(lengths)
        best = np.argmax(x, axis=-1)
        return [
            _greedy_one(x[b, : lengths[b]], best[b, : lengths[b]], alphabet) for b in range(len(x))
        ]
    if x.ndim != 2:
        raise OCRError(f"expected [T, C] or [B, T, C] log-probabilities, got {list(x.shape)}")
    return _greedy_one(x, np.argmax(x, axis=-1), alphabet)


def _greedy_one(x: np.ndarray, best: np.ndarray, alphabet: Alphabet) -> Hypothesis:
    if x.shape[-1] != len(alphabet):
        raise OCRError(f"{x.shape[-1]} classes but the alphabet has {len(alphabet)} labels")
    T = len(best)
    prev = np.concatenate([[-1], best[:-1]])
    keep = (best != prev) & (best != alphabet.blank)
    idx = np.flatnonzero(keep)
    ids = best[idx].tolist()
    logit = float(np.sum(x[np.arange(T), best])) if T else 0.0
    # frame spans: a character runs from its first frame through its repeats
    run_end = np.empty(len(idx), np.int64)
    if len(idx):
        change = np.flatnonzero(best[1:] != best[:-1]) + 1
        ends = np.append(change, T)
        run_end = ends[np.searchsorted(ends, idx, side="right")]
    words: list[Word] = []
    chars: list[str] = []
    ws = we = -1
    space = alphabet.space
    for i, cid, e in zip(idx.tolist(), ids, run_end.tolist(), strict=True):
        if cid == space:
            if chars:
                words.append(Word("".join(chars), ws, we, confidence(x, ws, we)))
            chars, ws = [], -1
            continue
        if not chars:
            ws = i
        chars.append(alphabet.labels[cid])
        we = e
    if chars:
        words.append(Word("".join(chars), ws, we, confidence(x, ws, we)))
    text = "".join(alphabet.labels[c] for c in ids)
    return Hypothesis(" ".join(text.split()), words, logit, logit, ids)


# --- shared machinery ------------------------------------------------------------------


class Grow:
    """A growable 1-D numpy array (amortised doubling)."""

    def __init__(self, dtype, fill=0):
        self.a = np.full(64, fill, dtype)
        self.n = 0
        self.fill = fill

    def extend(self, values: np.ndarray) -> np.ndarray:
        values = np.asarray(values)
        need = self.n + len(values)
        if need > len(self.a):
            new = np.full(max(need, 2 * len(self.a)), self.fill, self.a.dtype)
            new[: self.n] = self.a[: self.n]
            self.a = new
        ids = np.arange(self.n, need)
        self.a[self.n : need] = values
        self.n = need
        return ids

    @property
    def v(self) -> np.ndarray:
        return self.a[: self.n]


class EdgeMap:
    """(parent, symbol) -> child id, as sorted int64 keys; vectorised lookup."""

    def __init__(self, n_symbols: int):
        self.n_symbols = n_symbols
        self.keys = np.zeros(0, np.int64)
        self.vals = np.zeros(0, np.int64)

    def key(self, parents: np.ndarray, symbols: np.ndarray) -> np.ndarray:
        return parents.astype(np.int64) * self.n_symbols + symbols

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        if len(self.keys) == 0:
            return np.full(len(keys), -1, np.int64)
        pos = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
        return np.where(self.keys[pos] == keys, self.vals[pos], -1)

    def insert(self, keys: np.ndarray, vals: np.ndarray) -> None:
        k = np.concatenate([self.keys, keys])
        v = np.concatenate([self.vals, vals])
        order = np.argsort(k, kind="stable")
        self.keys, self.vals = k[order], v[order]


def merge(keys: np.ndarray, scores: np.ndarray):
    """Group equal keys: (first index, last index, log-sum-exp of scores) per group,
    groups in order of first occurrence; scores summed in occurrence order."""
    order = np.argsort(keys, kind="stable")
    sk = keys[order]
    starts = np.flatnonzero(np.concatenate([[True], sk[1:] != sk[:-1]]))
    ends = np.append(starts[1:], len(sk)) - 1
    first = order[starts]
    last = order[ends]
    summed = np.logaddexp.reduceat(scores[order], starts)
    pos = np.argsort(first, kind="stable")
    return first[pos], last[pos], summed[pos]


def candidates(col: np.ndarray, token_min_logp: float) -> list[int]:
    """Classes worth expanding on this frame, in pyctcdecode's (set) order."""
    return list(set(np.flatnonzero(col >= token_min_logp).tolist()) | {int(np.argmax(col))})


def top(scores: np.ndarray, beam_width: int, beam_prune_logp: float) -> np.ndarray:
    """Indices of the kept beams: within `beam_prune_logp` of the best, best
    `beam_width` first, ties in input order."""
    finite = np.isfinite(scores)
    if not finite.any():
        return np.zeros(0, np.int64)
    best = scores[finite].max()
    keep = np.flatnonzero(finite & (scores >= best + beam_prune_logp))
    order = np.argsort(-scores[keep], kind="stable")
    return keep[order[:beam_width]]


def per_row(fn, logp, lengths, *args, **kw):
    x = np.asarray(logp)
    lengths = [x.shape[1]] * x.shape[0] if lengths is None else list(lengths)
    if len(lengths) != x.shape[0]:
        raise OCRError(f"{len(lengths)} lengths for a batch of {x.shape[0]}")
    return [fn(x[b, : lengths[b]], *args, **kw) for b in range(x.shape[0])]


# --- prefix beam search -------------------------------------------------------------------


def prefix_beam_search(
    logp: np.ndarray,
    alphabet: Alphabet,
    *,
    beam_width: int = 16,
    beam_prune_logp: float = -30.0,
    token_min_logp: float = -12.0,
    lengths: Sequence[int] | None = None,
) -> list[Hypothesis]:
    """CTC prefix beam search: hypotheses are label sequences, each scored by the total
    probability of all its alignments (kept as blank-ending and non-blank-ending parts).
    Returns hypotheses best first (one list per row for `[B, T, C]` input)."""
    if np.ndim(logp) == 3:
        kw = dict(beam_width=beam_width, beam_prune_logp=beam_prune_logp)
        return per_row(
            prefix_beam_search, logp, lengths, alphabet, **kw, token_min_logp=token_min_logp
        )
    logp = check_logp(logp, alphabet)
    C = len(alphabet)
    blank = alphabet.blank
    edges = EdgeMap(C)
    parent, sym = Grow(np.int64, -1), Grow(np.int64, -1)
    parent.extend([-1])
    sym.extend([-1])
    node = np.zeros(1, np.int64)
    pb = np.zeros(1)
    pnb = np.full(1, -np.inf)
    for col in logp:
        cands = np.array(sorted(set(candidates(col, token_min_logp)) | {blank}), np.int64)
        total = np.logaddexp(pb, pnb)
        nb, nc = len(node), len(cands)
        b_idx = np.repeat(np.arange(nb), nc)
        c = np.tile(cands, nb)
        last = sym.v[node][b_idx]
        lp = col[c]
        is_blank = c == blank
        is_rep = (c == last) & ~is_blank
        # 1) blank: same prefix, into pb
        # 2) repeat of the last label without a blank in between: same prefix, into pnb
        # 3) a new label: extended prefix, into pnb (from pb only when it repeats the last)
        ext = ~is_blank
        ext_src = np.where(is_rep, pb[b_idx], total[b_idx])
        keys = edges.key(node[b_idx[ext]], c[ext])
        child = edges.lookup(keys)
        new = child < 0
        if new.any():
            uk, inv = np.unique(keys[new], return_inverse=True)
            ids = parent.extend(uk // C)
            sym.extend(uk % C)
            edges.insert(uk, ids)
            child[new] = ids[inv]
        out_node = np.concatenate([node[b_idx[is_blank]], node[b_idx[is_rep]], child])
        out_b = np.concatenate(
            [
                total[b_idx[is_blank]] + lp[is_blank],
                np.full(is_rep.sum(), -np.inf),
                np.full(ext.sum(), -np.inf),
            ]
        )
        out_nb = np.concatenate(
            [
                np.full(is_blank.sum(), -np.inf),
                pnb[b_idx[is_rep]] + lp[is_rep],
                ext_src[ext] + lp[ext],
            ]
        )
        uniq, inv = np.unique(out_node, return_inverse=True)
        npb = np.full(len(uniq), -np.inf)
        npnb = np.full(len(uniq), -np.inf)
        np.logaddexp.at(npb, inv, out_b)
        np.logaddexp.at(npnb, inv, out_nb)
        keep = top(np.logaddexp(npb, npnb), beam_width, beam_prune_logp)
        node, pb, pnb = uniq[keep], npb[keep], npnb[keep]
    total = np.logaddexp(pb, pnb)
    out = []
    for n, s in zip(node.tolist(), total.tolist(), strict=True):
        ids = []
        while n > 0:
            ids.append(int(sym.v[n]))
            n = int(parent.v[n])
        ids.reverse()
        text = "".join(alphabet.labels[i] for i in ids)
        out.append(Hypothesis(" ".join(text.split()), [], s, s, ids))
    return out
