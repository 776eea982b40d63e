"""A byte-level vocabulary for constraint tests: ids 0-255 are the bytes, 256+k the
special tokens <s k> (k < 64), 320 end-of-sequence. Text is fed byte by byte, so a
pass/fail table checks the grammar itself, not a tokenizer's segmentation."""

from __future__ import annotations

import pytest
from fixture_data import oracle

SPECIAL0, N_SPECIAL = 256, 64
EOS = SPECIAL0 + N_SPECIAL


def special(k: int) -> int:
    return SPECIAL0 + k


def byte_pieces() -> list[bytes]:
    return (
        [bytes([i]) for i in range(256)]
        + [f"<s{k}>".encode() for k in range(N_SPECIAL)]
        + [b"</s>"]
    )


@pytest.fixture(scope="session")
def byte_tok():
    llg = oracle("llguidance")
    from llamay.constrain.guidance import VocabAdapter

    pieces = byte_pieces()
    adapter = VocabAdapter(pieces, range(SPECIAL0, EOS + 1), EOS, lambda s: list(s.encode()))
    return llg.LLTokenizer(llg.TokenizerWrapper(adapter), n_vocab=len(pieces))


def feed(constraint, items) -> bool:
    """Feed str (as bytes) and int (token ids) items; True if all accepted and complete."""
    for it in items:
        ids = [it] if isinstance(it, int) else list(it.encode())
        for t in ids:
            allowed = constraint.mask()
            if not (int(allowed[t // 32]) >> (t % 32)) & 1:
                return False
            constraint.advance(t)
    return constraint.accepting
