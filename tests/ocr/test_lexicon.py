"""The lexicon trie (llamay.constrain.lexicon) against brute-force prefix sets."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from llamay.constrain.lexicon import DEAD, LexiconTrie

words_st = st.lists(st.lists(st.integers(0, 4), min_size=0, max_size=5), max_size=12)


@settings(max_examples=60, deadline=None)
@given(words=words_st, probe=st.lists(st.integers(0, 4), max_size=6))
def test_trie_matches_prefix_sets(words, probe):
    trie = LexiconTrie(words, n_symbols=5)
    wordset = {tuple(w) for w in words if w}
    prefixes = {w[:i] for w in wordset for i in range(len(w) + 1)}
    # walking the probe symbol by symbol, vectorised over all its prefixes at once
    state = 0
    for i, s in enumerate(probe):
        state = int(trie.step(np.array([state]), np.array([s]))[0])
        pre = tuple(probe[: i + 1])
        assert (state != DEAD) == (pre in prefixes)
        if state != DEAD:
            assert bool(trie.is_word[state]) == (pre in wordset)
            below = [len(w) for w in wordset if w[: len(pre)] == pre]
            assert trie.min_word_len[state] == min(below)
            kids = {w[len(pre)] for w in wordset if len(w) > len(pre) and w[: len(pre)] == pre}
            assert set(trie.children(state)[0].tolist()) == kids
            assert set(np.flatnonzero(trie.allowed(state)).tolist()) == kids
    assert (tuple(probe) in wordset) == (probe in trie)
    assert len(trie) == len(wordset)


def test_step_is_vectorised_and_dead_stays_dead():
    trie = LexiconTrie.from_strings(["ab", "abc", "b", "x?"], alphabet="abc ")
    assert trie.skipped == ["x?"]
    a = trie.walk(trie.encode("a"))
    states = np.array([0, 0, a, a, DEAD, 0])
    syms = np.array([0, 1, 1, 2, 0, 7])
    nxt = trie.step(states, syms)
    assert nxt[0] == a and nxt[1] == trie.walk([1]) and nxt[2] == trie.walk([0, 1])
    assert nxt[3] == DEAD and nxt[4] == DEAD and nxt[5] == DEAD
    assert [0, 1] in trie and [0] not in trie and [0, 1, 2] in trie
    assert trie.min_word_len[0] == 1 and trie.min_word_len[a] == 2
