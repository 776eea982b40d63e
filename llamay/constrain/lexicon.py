"""A lexicon as a trie over symbol ids, stored as flat numpy arrays.

Words are sequences of symbol ids: characters of an OCR/ASR alphabet, or tokens of a
tokenizer. The trie is built once on the host; stepping many states at once is a
vectorised lookup (`step(states, symbols)`), so a beam search or a token-mask builder
never walks it character by character in Python.

    trie = LexiconTrie.from_strings(["bugs", "bunny"], alphabet="bgnsuy ")
    s = trie.walk(trie.encode("bun"))      # a node id, or DEAD
    trie.is_word[s], trie.min_word_len[s]  # per-node arrays

Node 0 is the root (the empty prefix); `DEAD` (-1) is the state of a sequence that is
not a prefix of any word, and it stays dead under `step`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

DEAD = -1


class LexiconTrie:
    """Words -> trie over symbol ids in `range(n_symbols)`.

    Arrays (one entry per node): `parent`, `symbol` (the edge into the node), `depth`,
    `word_id` (index into `words`, or -1 when no word ends here), `min_word_len` (length
    of the shortest word in the node's subtree). Edges are kept sorted by
    `parent * n_symbols + symbol`, so a node's children are one contiguous run.
    """

    def __init__(self, words: Iterable[Sequence[int]], n_symbols: int):
        if n_symbols <= 0:
            raise ValueError(f"n_symbols must be positive, got {n_symbols}")
        self.n_symbols = int(n_symbols)
        children: list[dict[int, int]] = [{}]
        parent, symbol, depth, word_id = [DEAD], [DEAD], [0], [-1]
        self.words: list[tuple[int, ...]] = []
        for w in words:
            w = tuple(int(s) for s in w)
            if not w:
                continue
            node = 0
            for s in w:
                if not 0 <= s < self.n_symbols:
                    raise ValueError(f"symbol {s} of word {w} is outside [0, {self.n_symbols})")
                nxt = children[node].get(s)
                if nxt is None:
                    nxt = len(children)
                    children[node][s] = nxt
                    children.append({})
                    parent.append(node)
                    symbol.append(s)
                    depth.append(depth[node] + 1)
                    word_id.append(-1)
                node = nxt
            if word_id[node] < 0:
                word_id[node] = len(self.words)
                self.words.append(w)
        self.parent = np.asarray(parent, np.int64)
        self.symbol = np.asarray(symbol, np.int64)
        self.depth = np.asarray(depth, np.int64)
        self.word_id = np.asarray(word_id, np.int64)
        self.is_word = self.word_id >= 0
        n = len(children)
        # shortest word below each node: children have larger ids than parents
        big = np.iinfo(np.int64).max
        mwl = np.where(self.is_word, self.depth, big)
        for node in range(n - 1, 0, -1):
            p = parent[node]
            if mwl[node] < mwl[p]:
                mwl[p] = mwl[node]
        self.min_word_len = mwl
        keys = self.parent[1:] * self.n_symbols + self.symbol[1:]
        order = np.argsort(keys, kind="stable")
        self._keys = keys[order]
        self._vals = np.arange(1, n, dtype=np.int64)[order]

    # -- construction ------------------------------------------------------------

    @classmethod
    def from_strings(
        cls, words: Iterable[str], alphabet: Sequence[str] | dict[str, int]
    ) -> LexiconTrie:
        """A trie over characters: `alphabet` is a sequence of single-character labels
        (its index is the symbol id) or a char -> id map. Words with a character outside
        the alphabet are left out (listed in `skipped`)."""
        index = alphabet if isinstance(alphabet, dict) else _label_index(alphabet)
        n_symbols = (max(index.values()) + 1) if index else 1
        kept, skipped = [], []
        for w in words:
            ids = [index.get(c) for c in w]
            if any(i is None for i in ids):
                skipped.append(w)
            else:
                kept.append(ids)
        trie = cls(kept, n_symbols)
        trie.skipped = skipped
        trie.index = dict(index)
        return trie

    # -- queries -------------------------------------------------------------------

    @property
    def n_nodes(self) -> int:
        return len(self.parent)

    def encode(self, word: str) -> list[int]:
        """Symbol ids of a string (for tries built by `from_strings`)."""
        return [self.index[c] for c in word]

    def step(self, states: np.ndarray | int, symbols: np.ndarray | int) -> np.ndarray:
        """Next states for parallel arrays of states and symbols; DEAD where the prefix
        leaves the trie (and for DEAD inputs or symbols outside the range)."""
        states = np.asarray(states, np.int64)
        symbols = np.asarray(symbols, np.int64)
        states, symbols = np.broadcast_arrays(states, symbols)
        ok = (states >= 0) & (symbols >= 0) & (symbols < self.n_symbols)
        keys = np.where(ok, states * self.n_symbols + symbols, -1)
        if len(self._keys) == 0:
            return np.full(states.shape, DEAD, np.int64)
        pos = np.searchsorted(self._keys, keys)
        pos_c = np.minimum(pos, len(self._keys) - 1)
        hit = ok & (self._keys[pos_c] == keys)
        return np.where(hit, self._vals[pos_c], DEAD)

    def walk(self, symbols: Sequence[int], state: int = 0) -> int:
        """The state after a whole sequence (DEAD if it is not a prefix)."""
        for s in symbols:
            state = int(self.step(state, s))
            if state == DEAD:
                return DEAD
        return state

    def children(self, state: int) -> tuple[np.ndarray, np.ndarray]:
        """(symbols, child states) of one node, in symbol order."""
        if state < 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        lo = np.searchsorted(self._keys, state * self.n_symbols)
        hi = np.searchsorted(self._keys, (state + 1) * self.n_symbols)
        return self._keys[lo:hi] - state * self.n_symbols, self._vals[lo:hi]

    def allowed(self, state: int) -> np.ndarray:
        """Boolean mask over symbols that keep `state` inside the trie."""
        mask = np.zeros(self.n_symbols, bool)
        mask[self.children(state)[0]] = True
        return mask

    def __contains__(self, word: Sequence[int]) -> bool:
        s = self.walk(word)
        return s != DEAD and bool(self.is_word[s])

    def __len__(self) -> int:
        return len(self.words)


def _label_index(labels: Sequence[str]) -> dict[str, int]:
    index: dict[str, int] = {}
    for i, c in enumerate(labels):
        if len(c) == 1 and c not in index:
            index[c] = i
    return index
