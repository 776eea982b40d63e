"""A word n-gram language model read from an ARPA file, scored with standard backoff.

Scores are log10, as in the ARPA file and as KenLM's `BaseScore` returns them:

    p(w | h) = P(h, w)                      if the n-gram (h, w) is listed
             = B(h) + p(w | h[1:])          otherwise (B = 0 for an unlisted context)

A state is the tuple of the last `order - 1` word ids. Words outside the vocabulary
score as `<unk>` (or -100 when the file lists no `<unk>`).
"""

from __future__ import annotations

import os
from pathlib import Path

from llamay.errors import OCRError

UNK, BOS, EOS = "<unk>", "<s>", "</s>"


class ArpaLM:
    """An n-gram model: `vocab` (word -> id), `order`, and log10 scores."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.vocab: dict[str, int] = {}
        self._prob: dict[tuple[int, ...], float] = {}
        self._backoff: dict[tuple[int, ...], float] = {}
        self.order = 0
        self._read()
        self.unk = self.vocab.get(UNK, -1)
        self.bos = self.vocab.get(BOS, -1)

    def _id(self, word: str) -> int:
        i = self.vocab.get(word)
        if i is None:
            i = self.vocab[word] = len(self.vocab)
        return i

    def _read(self) -> None:
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except OSError as e:
            raise OCRError(f"cannot read the ARPA language model {self.path}: {e}") from None
        section = 0
        counts: dict[int, int] = {}
        for lineno, raw in enumerate(lines, 1):
            line = raw.strip()
            if not line:
                continue
            if line == "\\data\\":
                section = -1
                continue
            if line == "\\end\\":
                break
            if line.startswith("\\") and line.endswith("-grams:"):
                try:
                    section = int(line[1:].split("-")[0])
                except ValueError:
                    raise OCRError(f"{self.path}:{lineno}: bad section header {line!r}") from None
                self.order = max(self.order, section)
                continue
            if section == -1:
                if line.startswith("ngram "):
                    n, c = line[6:].split("=")
                    counts[int(n)] = int(c)
                continue
            if section <= 0:
                continue
            parts = line.split()
            if len(parts) < section + 1:
                raise OCRError(f"{self.path}:{lineno}: expected {section} words in {line!r}")
            try:
                prob = float(parts[0])
                backoff = float(parts[section + 1]) if len(parts) > section + 1 else 0.0
            except ValueError:
                raise OCRError(f"{self.path}:{lineno}: bad number in {line!r}") from None
            key = tuple(self._id(w) for w in parts[1 : section + 1])
            self._prob[key] = prob
            if backoff:
                self._backoff[key] = backoff
        if self.order == 0 or not self.vocab:
            raise OCRError(f"{self.path}: no n-grams found (is this an ARPA file?)")

    def __contains__(self, word: str) -> bool:
        return word in self.vocab and (self.vocab[word],) in self._prob

    def word_id(self, word: str) -> int:
        """The vocabulary id of a word (the `<unk>` id, or -1, when unknown)."""
        i = self.vocab.get(word, -1)
        return i if i >= 0 and (i,) in self._prob else self.unk

    def begin_state(self) -> tuple[int, ...]:
        return (self.bos,) if self.bos >= 0 else ()

    def null_state(self) -> tuple[int, ...]:
        return ()

    def score_id(self, state: tuple[int, ...], wid: int) -> tuple[float, tuple[int, ...]]:
        """(log10 p(word | state), next state) for a word id (-1: unknown, no <unk>)."""
        if wid < 0:
            return -100.0, ()
        ctx = state
        total = 0.0
        while True:
            p = self._prob.get((*ctx, wid))
            if p is not None:
                total += p
                break
            if not ctx:
                total += -100.0
                break
            total += self._backoff.get(ctx, 0.0)
            ctx = ctx[1:]
        nxt = (*state, wid)[-(self.order - 1) :] if self.order > 1 else ()
        return total, nxt

    def score(self, state: tuple[int, ...], word: str) -> tuple[float, tuple[int, ...]]:
        return self.score_id(state, self.word_id(word))

    def end_score(self, state: tuple[int, ...]) -> float:
        """log10 p(</s> | state)."""
        eos = self.vocab.get(EOS, -1)
        return self.score_id(state, eos)[0] if eos >= 0 else 0.0

    def unigrams(self) -> list[str]:
        """Every word with a unigram entry, as pyctcdecode's ARPA reader lists them."""
        inv = {i: w for w, i in self.vocab.items()}
        return [inv[k[0]] for k in self._prob if len(k) == 1]
