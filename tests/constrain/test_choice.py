"""Lexicon / choice constraints over the shared lexicon trie, with multi-byte tokens."""

from __future__ import annotations

import numpy as np
import pytest

from llamay.constrain.choice import LexiconConstraint, choices
from llamay.errors import ConstraintError, UnsupportedConstraintError
from llamay.sample.constraint import unpack_mask_np

PIECES = [
    b"y",
    b"e",
    b"s",
    b"ye",
    b"yes",
    b"n",
    b"o",
    b"no",
    b" ",
    b", ",
    b",",
    b"Y",
    b"N",
    b"x",
    b"<eos>",
    b"YES",
    b"o,",
]
EOS = 14
ID = {p: i for i, p in enumerate(PIECES)}


def allowed(c) -> set[bytes]:
    return {PIECES[i] for i in np.flatnonzero(unpack_mask_np(c.mask(), len(PIECES)))}


def run(c, toks) -> bool:
    for p in toks:
        if p not in allowed(c):
            return False
        c.advance(ID[p])
    return c.accepting


def test_choice_masks_prefixes_and_ends():
    c = choices(PIECES, [EOS], ["yes", "no"])
    assert allowed(c) == {b"y", b"ye", b"yes", b"n", b"no"}
    c.advance(ID[b"ye"])
    assert allowed(c) == {b"s"}
    c.advance(ID[b"s"])
    assert c.accepting and c.done and allowed(c) == {b"<eos>"}
    assert run(choices(PIECES, [EOS], ["yes", "no"]), [b"n", b"o"])
    assert not run(choices(PIECES, [EOS], ["yes", "no"]), [b"n"])


def test_case_options():
    c = LexiconConstraint(PIECES, [EOS], ["yes"], cases=("lower", "upper", "title"))
    assert allowed(c) >= {b"y", b"Y", b"YES", b"yes"} and b"N" not in allowed(c)
    assert run(LexiconConstraint(PIECES, [EOS], ["yes"], cases=("upper",)), [b"YES"])


def test_repeated_words_with_separator():
    c = LexiconConstraint(PIECES, [EOS], ["yes", "no"], separator=", ", min_words=2, max_words=3)
    assert run(c, [b"yes", b", ", b"no"])
    assert b"<eos>" in allowed(c) and b", " in allowed(c)
    c2 = LexiconConstraint(PIECES, [EOS], ["yes", "no"], separator=", ", min_words=2, max_words=3)
    assert not run(c2, [b"yes"])  # one word is too few
    c3 = LexiconConstraint(PIECES, [EOS], ["yes", "no"], separator=", ", max_words=2)
    assert run(c3, [b"n", b"o,", b" ", b"ye", b"s"])  # a token spanning word and separator
    assert c3.done


def test_fail_closed():
    c = choices(PIECES, [EOS], ["yes", "no"])
    with pytest.raises(ConstraintError):
        c.advance(ID[b"x"])
    with pytest.raises(ConstraintError):
        c.advance(EOS)
    with pytest.raises(UnsupportedConstraintError, match="separator"):
        LexiconConstraint(PIECES, [EOS], ["no", "no,"], separator=",", max_words=2)
    with pytest.raises(ConstraintError):
        choices(PIECES, [EOS], [])


def test_triggered_constraint_is_free_until_the_trigger():
    from llamay.constrain.trigger import Triggered

    pieces = PIECES + [b"</think>", b"</th", b"ink>"]
    inner = choices(pieces, [EOS], ["yes", "no"])
    c = Triggered(inner, pieces, trigger="</think>")
    assert unpack_mask_np(c.mask(), len(pieces)).all() and c.accepting
    for t in (b"x", b"n", b"</th", b"ink>"):
        c.advance(pieces.index(t))
    assert c.triggered and not c.accepting
    assert run_on(c, pieces, [b"no"])
    c2 = Triggered(choices(pieces, [EOS], ["yes"]), pieces, trigger_token=len(pieces) - 3)
    c2.advance(len(pieces) - 3)
    with pytest.raises(ConstraintError):
        c2.advance(ID[b"n"])


def run_on(c, pieces, toks) -> bool:
    for p in toks:
        c.advance(pieces.index(p))
    return c.accepting
