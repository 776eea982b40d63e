"""Splitting special-token text out of raw text, as llama.cpp's `tokenizer_st_partition`.

llama.cpp walks its special tokens (CONTROL, USER_DEFINED and UNKNOWN), longest text
first, and for each one splits every remaining text fragment at each occurrence. With
`parse_special=False` only USER_DEFINED tokens are split out (control and unknown token
text stays plain text). A token with the LSTRIP/RSTRIP attribute also eats the ASCII
whitespace to its left/right.

Scanning every fragment for each of thousands of special tokens (Gemma has ~6400) would be
slow on long prompts, so a walk over the set of the special texts' prefixes (a trie as flat
strings: a set comprehension, several times faster to build than nested dicts) first finds
the few special tokens that occur in the text at all; the exact llama.cpp procedure then
runs over those only (an absent token can never match a fragment of the text, so the
result is the same).
"""

from __future__ import annotations

import re

from llamay.tok.vocab import (
    ATTR_CONTROL,
    ATTR_LSTRIP,
    ATTR_RSTRIP,
    ATTR_UNKNOWN,
    Vocab,
)

_C_SPACE = " \t\n\v\f\r"  # C isspace() in the "C" locale


class SpecialSplitter:
    """Partitions text into `str` fragments and `int` special-token ids."""

    def __init__(self, vocab: Vocab) -> None:
        self._ids = vocab.special_ids
        self._order = {tid: k for k, tid in enumerate(self._ids)}
        self._text = {tid: vocab.tokens[tid] for tid in self._ids}
        attrs = vocab.attrs
        self._plain_only = {  # tokens skipped when parse_special is False
            tid for tid in self._ids if int(attrs[tid]) & (ATTR_CONTROL | ATTR_UNKNOWN)
        }
        self._lstrip = {tid for tid in self._ids if int(attrs[tid]) & ATTR_LSTRIP}
        self._rstrip = {tid for tid in self._ids if int(attrs[tid]) & ATTR_RSTRIP}
        self._by_text = {t: tid for tid, t in self._text.items()}
        self._prefixes = {t[:k] for t in self._by_text for k in range(1, len(t) + 1)}
        firsts = sorted({t[0] for t in self._by_text})
        self._first = (
            re.compile("[" + "".join(re.escape(c) for c in firsts) + "]") if firsts else None
        )

    def _present(self, text: str, parse_special: bool) -> list[int]:
        """Special tokens occurring in `text`, in partition order."""
        if self._first is None:
            return []
        found: set[int] = set()
        prefixes, by_text = self._prefixes, self._by_text
        n = len(text)
        for m in self._first.finditer(text):
            p = m.start()
            q = p + 1
            while q <= n:
                piece = text[p:q]
                if piece not in prefixes:
                    break
                tid = by_text.get(piece)
                if tid is not None:
                    found.add(tid)
                q += 1
        if not parse_special:
            found -= self._plain_only
        return sorted(found, key=self._order.__getitem__)

    def split(self, text: str, parse_special: bool) -> list[str | int]:
        if not text:
            return []
        frags: list[str | int] = [text]
        for tid in self._present(text, parse_special):
            tok = self._text[tid]
            lstrip = tid in self._lstrip
            rstrip = tid in self._rstrip
            out: list[str | int] = []
            for frag in frags:
                if not isinstance(frag, str) or tok not in frag:
                    out.append(frag)
                    continue
                pos = 0
                end = len(frag)
                while True:
                    j = frag.find(tok, pos, end)
                    if j < 0:
                        break
                    left = frag[pos:j]
                    if lstrip:
                        left = left.rstrip(_C_SPACE)
                    if left:
                        out.append(left)
                    out.append(tid)
                    pos = j + len(tok)
                    if rstrip:
                        while pos < end and frag[pos] in _C_SPACE:
                            pos += 1
                    if pos >= end:
                        break
                if pos < end:
                    out.append(frag[pos:end])
            frags = out
        return frags
