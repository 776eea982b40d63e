"""CTC decoders over per-frame log-probabilities `[T, C]` (batched: `[B, T, C]`).

- `greedy_decode`: argmax per frame, collapse repeats, drop blanks.
- `prefix_beam_search`: the classic CTC prefix beam search (blank / non-blank
  probabilities per prefix, so a prefix's score is the sum over all its alignments).
- `beam_search`: word-level beam search with pyctcdecode's semantics (a beam is
  text + partial word + last character; scores fused per frame), plus a lexicon
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
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from llamay.constrain.lexicon import DEAD, LexiconTrie
from llamay.errors import OCRError
from llamay.ocr.lm import ArpaLM

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


def _check(logp: np.ndarray, alphabet: Alphabet) -> np.ndarray:
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


def _confidence(logp: np.ndarray, start: int, end: int) -> float:
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
                words.append(Word("".join(chars), ws, we, _confidence(x, ws, we)))
            chars, ws = [], -1
            continue
        if not chars:
            ws = i
        chars.append(alphabet.labels[cid])
        we = e
    if chars:
        words.append(Word("".join(chars), ws, we, _confidence(x, ws, we)))
    text = "".join(alphabet.labels[c] for c in ids)
    return Hypothesis(" ".join(text.split()), words, logit, logit, ids)


# --- shared machinery ------------------------------------------------------------------


class _Grow:
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


class _EdgeMap:
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


def _merge(keys: np.ndarray, scores: np.ndarray):
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


def _candidates(col: np.ndarray, token_min_logp: float) -> list[int]:
    """Classes worth expanding on this frame, in pyctcdecode's (set) order."""
    return list(set(np.flatnonzero(col >= token_min_logp).tolist()) | {int(np.argmax(col))})


def _top(scores: np.ndarray, beam_width: int, beam_prune_logp: float) -> np.ndarray:
    """Indices of the kept beams: within `beam_prune_logp` of the best, best
    `beam_width` first, ties in input order."""
    finite = np.isfinite(scores)
    if not finite.any():
        return np.zeros(0, np.int64)
    best = scores[finite].max()
    keep = np.flatnonzero(finite & (scores >= best + beam_prune_logp))
    order = np.argsort(-scores[keep], kind="stable")
    return keep[order[:beam_width]]


def _per_row(fn, logp, lengths, *args, **kw):
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
        return _per_row(
            prefix_beam_search, logp, lengths, alphabet, **kw, token_min_logp=token_min_logp
        )
    logp = _check(logp, alphabet)
    C = len(alphabet)
    blank = alphabet.blank
    edges = _EdgeMap(C)
    parent, sym = _Grow(np.int64, -1), _Grow(np.int64, -1)
    parent.extend([-1])
    sym.extend([-1])
    node = np.zeros(1, np.int64)
    pb = np.zeros(1)
    pnb = np.full(1, -np.inf)
    for col in logp:
        cands = np.array(sorted(set(_candidates(col, token_min_logp)) | {blank}), np.int64)
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
        keep = _top(np.logaddexp(npb, npnb), beam_width, beam_prune_logp)
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


# --- word-level beam search with lexicon, LM and hotwords -------------------------------


@dataclass
class WordScorer:
    """What scores words in `beam_search`.

    lexicon: words the decoder knows (a `LexiconTrie` over the alphabet's indices, or a
      list of strings). Soft mode (default): a word outside it costs `unk_score_offset`
      (with an LM: added to the LM's log10 score and scaled with it by alpha, as in
      pyctcdecode; without: as it is), a partial word that is no lexicon prefix costs
      `unk_score_offset` (scaled by length beyond 6 characters).
      `hard=True`: hypotheses leaving the lexicon are dropped.
    lm: an `ArpaLM` (or a path); alpha weighs it, beta is the per-word bonus (it applies
      with a lexicon alone too).
    hotwords: words (or phrases, split on spaces) that earn `hotword_weight` each, and
      a proportional share of it while partially spelled.
    Without lm and lexicon only hotwords score (and alpha, beta are unused), as in
    pyctcdecode without a language model.
    """

    lexicon: LexiconTrie | Iterable[str] | None = None
    lm: ArpaLM | str | None = None
    alpha: float = 0.5
    beta: float = 1.5
    unk_score_offset: float = -10.0
    hard: bool = False
    hotwords: Iterable[str] | None = None
    hotword_weight: float = 10.0
    score_boundary: bool = True
    _prepared: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def prepare(self, alphabet: Alphabet):
        """(lm, lexicon trie, hotword trie) for an alphabet, built once and cached."""
        key = alphabet.labels
        got = self._prepared.get(key)
        if got is not None:
            return got
        if isinstance(self.lm, str | os.PathLike):
            self.lm = ArpaLM(self.lm)
        lm, lex = self.lm, self.lexicon
        if lex is not None and not isinstance(lex, LexiconTrie):
            words = list(lex)
            self.lexicon = words  # an iterator is read once
            if lm is not None:  # pyctcdecode keeps only unigrams the LM knows
                words = [w for w in words if w in lm]
            lex = LexiconTrie.from_strings(words, alphabet.labels)
        hw = [u for h in (self.hotwords or []) for u in h.split()]
        self.hotwords = hw
        hw_trie = LexiconTrie.from_strings(sorted(hw, key=len), alphabet.labels) if hw else None
        self._prepared[key] = (lm, lex, hw_trie)
        return lm, lex, hw_trie


def beam_search(
    logp: np.ndarray,
    alphabet: Alphabet,
    scorer: WordScorer | None = None,
    *,
    beam_width: int = 100,
    beam_prune_logp: float = -10.0,
    token_min_logp: float = -5.0,
    prune_history: bool = False,
    lengths: Sequence[int] | None = None,
) -> list[Hypothesis]:
    """Word-level CTC beam search (pyctcdecode's algorithm, vectorised). Returns the
    final beams, best first; each has its words with frame spans. For `[B, T, C]`
    input (with optional valid `lengths`) returns one such list per row."""
    kw = dict(beam_width=beam_width, beam_prune_logp=beam_prune_logp)
    kw.update(token_min_logp=token_min_logp, prune_history=prune_history)
    if np.ndim(logp) == 3:
        return _per_row(beam_search, logp, lengths, alphabet, scorer, **kw)
    logp = _check(logp, alphabet)
    return _WordBeam(alphabet, scorer or WordScorer()).run(
        logp, beam_width, beam_prune_logp, token_min_logp, prune_history
    )


class _WordBeam:
    def __init__(self, alphabet: Alphabet, sc: WordScorer):
        self.ab = alphabet
        self.C = len(alphabet)
        self.space = alphabet.space
        lm, self.lex, self.hw = sc.prepare(alphabet)
        self.lm = lm
        self.alpha, self.beta, self.unk = sc.alpha, sc.beta, sc.unk_score_offset
        self.hard = sc.hard
        self.word_scoring = lm is not None or sc.lexicon is not None
        self.hw_weight = sc.hotword_weight
        self.n_hist = max(1, lm.order - 1) if lm is not None else 1
        self.score_boundary = sc.score_boundary
        # node table: node 0 is the empty text
        self.edges = _EdgeMap(self.C)
        self.parent: list[int] = [-1]
        self.partial: list[str] = [""]
        self.text_node: list[int] = [0]
        self.words_of: list[tuple[str, ...]] = [()]  # completed words (boundary nodes)
        self.lm_state: list = [None]
        self.lex_state = _Grow(np.int64, DEAD)
        self.lex_state.extend([0])
        self.hw_state = _Grow(np.int64, DEAD)
        self.hw_state.extend([0])
        self.score_text = _Grow(np.float64)
        self.score_text.extend([0.0])
        self.score_part = _Grow(np.float64)
        self.score_part.extend([0.0])
        self.plen = _Grow(np.int64)
        self.plen.extend([0])
        self.hist = _Grow(np.int64)
        self._hist_ids: dict = {}
        self.hist.extend([self._hist_id((), "")])
        if lm is not None:
            self.lm_state[0] = lm.begin_state() if self.score_boundary else lm.null_state()

    # -- node creation ----------------------------------------------------------------

    def _hist_id(self, words: tuple[str, ...], partial: str) -> int:
        k = (words[-self.n_hist :], partial)
        return self._hist_ids.setdefault(k, len(self._hist_ids))

    def _partial_score(self, partial: str, lex: int, hw: int) -> float:
        if not partial:
            return 0.0
        if hw != DEAD and self.hw is not None:
            return self.hw_weight * len(partial) / int(self.hw.min_word_len[hw])
        if not self.word_scoring:
            return 0.0
        oov = self.lex is None or lex == DEAD
        if oov and self.hard:
            return -np.inf
        s = self.unk * oov
        if len(partial) > AVG_WORD_LEN:
            s = s * len(partial) / AVG_WORD_LEN
        return s

    def _word_score(self, state, word: str, lex: int) -> tuple[float, object]:
        """(fused score of appending `word`, next LM state)."""
        in_lex = lex != DEAD and self.lex is not None and bool(self.lex.is_word[lex])
        if self.hard and not in_lex:
            return -np.inf, state
        if not self.word_scoring:
            return 0.0, state
        oov = self.lex is not None and len(self.lex) > 0 and not in_lex
        if self.lm is None:  # lexicon only: the penalty and bonus apply as they are
            return self.unk * oov + self.beta, state
        raw, nxt = self.lm.score(state, word)
        oov = oov or word not in self.lm
        return self.alpha * (raw + self.unk * oov) * LN10 + self.beta, nxt

    def _children(self, nodes: np.ndarray, syms: np.ndarray) -> np.ndarray:
        """Child node per (node, symbol); symbol == space completes the partial word."""
        keys = self.edges.key(nodes, syms)
        child = self.edges.lookup(keys)
        new = child < 0
        if not new.any():
            return child
        uk, inv = np.unique(keys[new], return_inverse=True)
        pn = uk // self.C
        ps = uk % self.C
        is_space = ps == self.space
        # a word boundary restarts the lexicon and hotword tries at their roots
        lex_next = np.where(is_space, 0, self._step(self.lex, self.lex_state.v[pn], ps))
        hw_next = np.where(is_space, 0, self._step(self.hw, self.hw_state.v[pn], ps))
        n0 = len(self.parent)
        st, sp, hi = [], [], []
        for j, (p, s) in enumerate(zip(pn.tolist(), ps.tolist(), strict=True)):
            nid = n0 + j
            self.parent.append(p)
            if s == self.space:  # word boundary: the partial of p becomes a word
                w = self.partial[p]
                tn = self.text_node[p]
                ws, state = self._word_score(self.lm_state[tn], w, int(self.lex_state.v[p]))
                if self.hw is not None and self.hw_state.v[p] != DEAD:
                    ws += self.hw_weight * bool(self.hw.is_word[self.hw_state.v[p]])
                words = (*self.words_of[tn], w)
                self.partial.append("")
                self.text_node.append(nid)
                self.words_of.append(words)
                self.lm_state.append(state)
                st.append(self.score_text.v[tn] + ws)
                sp.append(0.0)
                hi.append(self._hist_id(words, ""))
            else:
                part = self.partial[p] + self.ab.labels[s]
                tn = self.text_node[p]
                self.partial.append(part)
                self.text_node.append(tn)
                self.words_of.append(())
                self.lm_state.append(None)
                st.append(self.score_text.v[tn])
                sp.append(self._partial_score(part, int(lex_next[j]), int(hw_next[j])))
                hi.append(self._hist_id(self.words_of[tn], part))
        ids = np.arange(n0, n0 + len(uk))
        self.lex_state.extend(lex_next)
        self.hw_state.extend(hw_next)
        self.score_text.extend(np.array(st, np.float64))
        self.score_part.extend(np.array(sp, np.float64))
        self.hist.extend(np.array(hi, np.int64))
        self.plen.extend(np.array([len(self.partial[i]) for i in ids], np.int64))
        self.edges.insert(uk, ids)
        child[new] = ids[inv]
        return child

    @staticmethod
    def _step(trie: LexiconTrie | None, states: np.ndarray, syms: np.ndarray) -> np.ndarray:
        if trie is None:
            return np.full(len(states), DEAD, np.int64)
        if trie.n_symbols <= syms.max(initial=0):
            ok = syms < trie.n_symbols
            return np.where(ok, trie.step(states, np.where(ok, syms, 0)), DEAD)
        return trie.step(states, syms)

    # -- the search --------------------------------------------------------------------

    def run(self, logp, beam_width, beam_prune_logp, token_min_logp, prune_history):
        blank, space = self.ab.blank, self.space
        node = np.zeros(1, np.int64)
        last = np.full(1, -1, np.int64)
        logit = np.zeros(1)
        ps = np.full(1, -1, np.int64)
        pe = np.full(1, -1, np.int64)
        fh = np.full(1, -1, np.int64)  # head of the beam's completed-word frame list
        fh_prev, fh_s, fh_e = _Grow(np.int64), _Grow(np.int64), _Grow(np.int64)
        for t, col in enumerate(logp):
            cands = np.array(_candidates(col, token_min_logp), np.int64)
            nb = len(node)
            b = np.tile(np.arange(nb), len(cands))
            c = np.repeat(cands, nb)
            lp = col[c]
            bl = last[b]
            stay = (c == blank) | (c == bl)
            is_sp = ~stay & (c == space)
            other = ~stay & ~is_sp
            n_node = node[b].copy()
            n_ps, n_pe, n_fh = ps[b].copy(), pe[b].copy(), fh[b].copy()
            # repeats extend the partial's span; blanks leave it
            rep = stay & (c != blank)
            n_pe[rep] = t + 1
            # a space closes a non-empty partial word
            has_part = self._has_partial(n_node)
            close = is_sp & has_part
            if close.any():
                n_node[close] = self._children(n_node[close], np.full(close.sum(), space))
                ids = fh_prev.extend(n_fh[close])
                fh_s.extend(n_ps[close])
                fh_e.extend(n_pe[close])
                n_fh[close] = ids
            n_ps[is_sp] = -1
            n_pe[is_sp] = -1
            if other.any():
                n_node[other] = self._children(n_node[other], c[other])
                n_ps[other] = np.where(n_ps[other] < 0, t, n_ps[other])
                n_pe[other] = t + 1
            keys = n_node * (self.C + 1) + (c + 1)
            first, lastocc, summed = _merge(keys, logit[b] + lp)
            m_node = n_node[first]
            m_last = c[first]
            score = summed + self.score_text.v[m_node] + self.score_part.v[m_node]
            keep = _top(score, beam_width, beam_prune_logp)
            if prune_history:
                hk = self.hist.v[m_node[keep]] * (self.C + 1) + (m_last[keep] + 1)
                _, firsts = np.unique(hk, return_index=True)
                keep = keep[np.sort(firsts)]
            node, last, logit = m_node[keep], m_last[keep], summed[keep]
            src = lastocc[keep]
            ps, pe, fh = n_ps[src], n_pe[src], n_fh[src]
        # end of input: close partial words, score the end of sentence
        has_part = self._has_partial(node)
        end_node = node.copy()
        if has_part.any():
            end_node[has_part] = self._children(node[has_part], np.full(has_part.sum(), space))
            ids = fh_prev.extend(fh[has_part])
            fh_s.extend(ps[has_part])
            fh_e.extend(pe[has_part])
            fh = fh.copy()
            fh[has_part] = ids
        first, lastocc, summed = _merge(end_node, logit)
        m_node = end_node[first]
        eos = np.array(
            [self._eos(int(n), bool(has_part[j])) for n, j in zip(m_node, lastocc, strict=True)],
            np.float64,
        )
        score = summed + self.score_text.v[m_node] + eos
        keep = _top(score, beam_width, beam_prune_logp)
        out = []
        for k in keep.tolist():
            n, src = int(m_node[k]), int(lastocc[k])
            spans = []
            h = int(fh[src])
            while h >= 0:
                spans.append((int(fh_s.v[h]), int(fh_e.v[h])))
                h = int(fh_prev.v[h])
            spans.reverse()
            words = self.words_of[n]
            ws = [
                Word(w, s, e, _confidence(logp, s, e))
                for w, (s, e) in zip(words, spans, strict=False)
            ]
            out.append(Hypothesis(" ".join(words), ws, float(summed[k]), float(score[k])))
        return out

    def _has_partial(self, nodes: np.ndarray) -> np.ndarray:
        return self.plen.v[nodes] > 0

    def _eos(self, node: int, closed_word: bool) -> float:
        """End-of-sentence term for a final text node. As in pyctcdecode, a text whose
        last beam ended without a partial word is scored with one more, empty, word."""
        if self.lm is None:
            return 0.0
        state = self.lm_state[node]
        end = self.lm.end_score if self.score_boundary else (lambda s: 0.0)
        if closed_word:
            return self.alpha * end(state) * LN10
        raw, nxt = self.lm.score(state, "")
        return self.alpha * (raw + self.unk + end(nxt)) * LN10 + self.beta
