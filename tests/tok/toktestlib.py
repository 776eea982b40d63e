"""Helpers shared by the tokenizer tests: a synthetic SentencePiece vocabulary and a direct
Python transcription of llama.cpp's SPM merge procedure (a test oracle, not library code)."""

from __future__ import annotations

import heapq

import numpy as np


def llamacpp_spm(tokens: list[str], scores, text: str) -> list[int]:
    """llama.cpp's `llm_tokenizer_spm_session::tokenize` on an already escaped text."""
    tid = {t: i for i, t in enumerate(tokens)}
    syms = [[c, i - 1, i + 1] for i, c in enumerate(text)]  # text, prev, next
    if syms:
        syms[-1][2] = -1
    heap: list = []
    rev: dict[str, tuple[int, int]] = {}

    def add(left: int, right: int) -> None:
        if left == -1 or right == -1:
            return
        s = syms[left][0] + syms[right][0]
        if s in tid:
            heapq.heappush(heap, (-float(scores[tid[s]]), left, right, len(s)))
            rev[s] = (left, right)

    for i in range(1, len(syms)):
        add(i - 1, i)
    while heap:
        _, left, right, size = heapq.heappop(heap)
        ls, rs = syms[left], syms[right]
        if not ls[0] or not rs[0] or len(ls[0]) + len(rs[0]) != size:
            continue
        ls[0] += rs[0]
        rs[0] = ""
        ls[2] = rs[2]
        if rs[2] >= 0:
            syms[rs[2]][1] = left
        add(ls[1], left)
        add(left, ls[2])
    out: list[int] = []
    i = 0 if syms else -1
    while i != -1:
        s = syms[i][0]
        if s in tid:
            out.append(tid[s])
        else:
            out.extend(tid[f"<0x{b:02X}>"] for b in s.encode())
        i = syms[i][2]
    return out


def spm_meta(pieces: dict[str, float], add_space_prefix: bool = False, extra=()) -> dict:
    specials = ["<unk>", "<s>", "</s>"]
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    tokens = specials + byte_tokens + list(pieces) + [t for t, _ in extra]
    scores = [0.0] * 3 + [0.0] * 256 + list(pieces.values()) + [0.0] * len(extra)
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces) + [k for _, k in extra]
    return {
        "general.architecture": "llama",
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": np.array(scores, np.float32),
        "tokenizer.ggml.token_type": np.array(types, np.int32),
        "tokenizer.ggml.add_space_prefix": add_space_prefix,
    }


# A vocabulary where the highest-scored merge is not the "BPE training order": "bc" beats
# "ab", so "abc" must also be reachable as "a" + "bc".
PIECES = {
    "a": -1.0,
    "b": -2.0,
    "c": -3.0,
    "d": -4.0,
    "▁": -5.0,
    "bc": -6.0,
    "ab": -7.0,
    "abc": -8.0,
    "cd": -9.0,
    "▁a": -10.0,
    "▁ab": -11.0,
    "dd": -12.0,
    "ddd": -13.0,
    "dddd": -14.0,
    "cab": -15.0,
    "bca": -16.0,
    "▁▁": -17.0,
}
ALPHABET = "abcd é😀"
