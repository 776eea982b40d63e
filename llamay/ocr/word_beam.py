"""CTC word-level beam search with pyctcdecode's semantics: a lexicon (soft or hard),
word insertion bonus, an ARPA word n-gram LM and hotwords (`llamay.ocr.ctc`'s docstring
has the whole picture; the shared prefix machinery lives there)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from llamay.constrain.lexicon import DEAD, LexiconTrie
from llamay.ocr.ctc import (
    AVG_WORD_LEN,
    LN10,
    Alphabet,
    EdgeMap,
    Grow,
    Hypothesis,
    Word,
    candidates,
    check_logp,
    confidence,
    merge,
    per_row,
    top,
)
from llamay.ocr.lm import ArpaLM

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
        return per_row(beam_search, logp, lengths, alphabet, scorer, **kw)
    logp = check_logp(logp, alphabet)
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
        self.edges = EdgeMap(self.C)
        self.parent: list[int] = [-1]
        self.partial: list[str] = [""]
        self.text_node: list[int] = [0]
        self.words_of: list[tuple[str, ...]] = [()]  # completed words (boundary nodes)
        self.lm_state: list = [None]
        self.lex_state = Grow(np.int64, DEAD)
        self.lex_state.extend([0])
        self.hw_state = Grow(np.int64, DEAD)
        self.hw_state.extend([0])
        self.score_text = Grow(np.float64)
        self.score_text.extend([0.0])
        self.score_part = Grow(np.float64)
        self.score_part.extend([0.0])
        self.plen = Grow(np.int64)
        self.plen.extend([0])
        self.hist = Grow(np.int64)
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
        fh_prev, fh_s, fh_e = Grow(np.int64), Grow(np.int64), Grow(np.int64)
        for t, col in enumerate(logp):
            cands = np.array(candidates(col, token_min_logp), np.int64)
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
            first, lastocc, summed = merge(keys, logit[b] + lp)
            m_node = n_node[first]
            m_last = c[first]
            score = summed + self.score_text.v[m_node] + self.score_part.v[m_node]
            keep = top(score, beam_width, beam_prune_logp)
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
        first, lastocc, summed = merge(end_node, logit)
        m_node = end_node[first]
        eos = np.array(
            [self._eos(int(n), bool(has_part[j])) for n, j in zip(m_node, lastocc, strict=True)],
            np.float64,
        )
        score = summed + self.score_text.v[m_node] + eos
        keep = top(score, beam_width, beam_prune_logp)
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
                Word(w, s, e, confidence(logp, s, e))
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
