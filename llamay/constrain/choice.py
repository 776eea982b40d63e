"""Lexicon / choice constraints on the shared lexicon trie (`llamay.constrain.lexicon`).

The output must be one of a set of strings (`choices`), or a run of `min_words` to
`max_words` lexicon words joined by `separator`, each word in the case forms asked for
("exact", "lower", "upper", "title"; several at once). The trie is over UTF-8 bytes
(256 symbols), so any tokenizer's tokens walk it; a token's mask bit is computed by
walking all candidate tokens through the trie at once (vectorised over the vocabulary),
only for the tokens whose first byte the current state allows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from llamay.constrain import limits
from llamay.constrain.lexicon import DEAD, LexiconTrie
from llamay.errors import ConstraintError, UnsupportedConstraintError
from llamay.sample.constraint import pack_mask

CASES = ("exact", "lower", "upper", "title")


def _variants(word: str, cases: Sequence[str]) -> set[str]:
    out = set()
    for c in cases:
        if c not in CASES:
            raise ConstraintError(f"unknown case option {c!r}; choose from {CASES}")
        out.add(
            {
                "exact": word,
                "lower": word.lower(),
                "upper": word.upper(),
                "title": word[:1].upper() + word[1:],
            }[c]
        )
    return out


class LexiconConstraint:
    """`min_words`..`max_words` words from `words`, joined by `separator`.

    State: a trie node (or a position inside the separator) and the words completed.
    A separator whose first byte could also continue a word is refused (the walk
    would be ambiguous)."""

    def __init__(
        self,
        pieces: Sequence[bytes],
        eos_ids: Iterable[int],
        words: Iterable[str],
        separator: str = " ",
        min_words: int = 1,
        max_words: int = 1,
        cases: Sequence[str] = ("exact",),
        special_ids: Iterable[int] = (),
    ):
        words = [w for w in words]
        if not words:
            raise ConstraintError("a lexicon / choice constraint needs at least one word")
        if min_words < 1 or max_words < min_words:
            raise ConstraintError(f"word count range [{min_words}, {max_words}] is empty")
        forms = sorted({v for w in words for v in _variants(w, cases)})
        if any(not f for f in forms):
            raise ConstraintError("an empty string cannot be a choice")
        self.trie = LexiconTrie([list(f.encode()) for f in forms], 256)
        self.sep = separator.encode()
        if max_words > 1:
            if not self.sep:
                raise UnsupportedConstraintError(
                    "lexicon: repeated words need a non-empty separator"
                )
            ends = np.flatnonzero(self.trie.is_word)
            if any(self.trie.step(e, self.sep[0]) != DEAD for e in ends):
                raise UnsupportedConstraintError(
                    f"lexicon: separator {separator!r} also continues a word, so word "
                    "boundaries would be ambiguous; choose another separator"
                )
        self.min_words, self.max_words = min_words, max_words
        self.vocab_size = len(pieces)
        self.eos = np.array(sorted(set(eos_ids)), np.int64)
        lens = np.array([len(p) for p in pieces], np.int64)
        L = max(1, int(lens.max()))
        tb = np.full((len(pieces), L), -1, np.int64)
        for i, p in enumerate(pieces):
            tb[i, : len(p)] = np.frombuffer(p, np.uint8)
        usable = lens > 0
        usable[list(special_ids)] = False  # control tokens never spell text
        usable[self.eos] = False
        self._bytes, self._lens, self._usable = tb, lens, usable
        self.node, self.sep_pos, self.words_done = 0, -1, 0

    # A state is (node, sep_pos, words_done): sep_pos >= 0 while inside the separator.

    def _walk(self, ids: np.ndarray):
        """Walk tokens `ids` from the current state: (alive, node, sep_pos, words_done)."""
        n = len(ids)
        node = np.full(n, self.node, np.int64)
        sp = np.full(n, self.sep_pos, np.int64)
        wd = np.full(n, self.words_done, np.int64)
        alive = np.ones(n, bool)
        S = len(self.sep)
        sep = np.frombuffer(self.sep, np.uint8).astype(np.int64) if S else np.zeros(1, np.int64)
        for j in range(int(self._lens[ids].max(initial=0))):
            b = self._bytes[ids, j]
            act = alive & (b >= 0)
            if not act.any():
                break
            in_sep = act & (sp >= 0)
            # inside the separator: the next separator byte, or the start of the next word
            nxt_sep = in_sep & (sp < S) & (sep[np.minimum(sp, S - 1)] == b)
            done_sep = in_sep & (sp >= S)
            start = self.trie.step(np.zeros(n, np.int64), b)
            sp = np.where(nxt_sep, sp + 1, sp)
            node = np.where(done_sep, start, node)
            sp = np.where(done_sep, -1, sp)
            bad = in_sep & ~nxt_sep & ~done_sep
            bad |= done_sep & (start == DEAD)
            # inside a word: continue it, or begin the separator after a complete word
            in_word = act & ~in_sep
            cont = self.trie.step(np.where(in_word, node, 0), b)
            is_word = self.trie.is_word[np.maximum(node, 0)] & (node >= 0)
            to_sep = in_word & (cont == DEAD) & is_word & (wd + 1 < self.max_words) & (S > 0)
            to_sep &= sep[0] == b
            node = np.where(in_word & (cont != DEAD), cont, node)
            wd = np.where(to_sep, wd + 1, wd)
            sp = np.where(to_sep, 1, sp)
            bad |= in_word & (cont == DEAD) & ~to_sep
            alive &= ~bad
        # a separator fully spelt moves on to "expecting a word"
        return alive, node, sp, wd

    @property
    def accepting(self) -> bool:
        return (
            self.sep_pos < 0
            and self.node >= 0
            and bool(self.trie.is_word[self.node])
            and self.words_done + 1 >= self.min_words
        )

    @property
    def done(self) -> bool:
        if not self.accepting:
            return False
        last = self.words_done + 1 >= self.max_words
        return last and len(self.trie.children(self.node)[0]) == 0

    def mask(self) -> np.ndarray:
        allowed = np.zeros(self.vocab_size, bool)
        if self.sep_pos >= 0:
            first_ok = None
        else:
            first_ok = set(self.trie.children(self.node)[0].tolist())
            if self.trie.is_word[self.node] and self.words_done + 1 < self.max_words and self.sep:
                first_ok.add(self.sep[0])
        cand = np.flatnonzero(self._usable)
        if first_ok is not None:
            cand = cand[np.isin(self._bytes[cand, 0], list(first_ok))]
        if len(cand):
            alive, *_ = self._walk(cand)
            allowed[cand[alive]] = True
        if self.accepting:
            allowed[self.eos] = True
        return pack_mask(allowed)

    def advance(self, token: int) -> None:
        token = int(token)
        if token in self.eos:
            if not self.accepting:
                raise ConstraintError("lexicon: end of sequence before a complete word")
            return
        if not self._usable[token]:
            raise ConstraintError(f"lexicon: token {token} cannot spell a lexicon word")
        alive, node, sp, wd = self._walk(np.array([token]))
        if not alive[0]:
            raise ConstraintError(f"lexicon: token {token} leaves the lexicon")
        self.node, self.sep_pos, self.words_done = int(node[0]), int(sp[0]), int(wd[0])
        if self.sep_pos >= len(self.sep):  # separator complete: a word must follow
            self.node = 0


def choices(
    pieces: Sequence[bytes],
    eos_ids: Iterable[int],
    options: Iterable[str],
    special_ids: Iterable[int] = (),
) -> LexiconConstraint:
    """Exactly one of `options` (within `limits.MAX_CHOICE_BYTES`)."""
    options = list(options)
    limits.check_choices(options)
    return LexiconConstraint(pieces, eos_ids, options, special_ids=special_ids)
