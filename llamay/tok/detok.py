"""Token ids back to text, as llama.cpp's `token_to_piece` and `llama_detokenize`.

A token's piece is bytes: SentencePiece/WordPiece normal tokens with `▁` turned back into
spaces, byte-level BPE tokens mapped back through the GPT-2 byte table, `<0xXX>` byte
tokens as that byte, control/unknown tokens as their text only when special tokens are
rendered, user-defined tokens always as their text, and other kinds as nothing.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Sequence

from llamay.tok.vocab import (
    ATTR_BYTE,
    ATTR_CONTROL,
    ATTR_NORMAL,
    ATTR_UNKNOWN,
    ATTR_USER_DEFINED,
    KIND_BPE,
    Vocab,
)

_SPECIAL = ATTR_UNKNOWN | ATTR_CONTROL


def gpt2_byte_chars() -> list[str]:
    """GPT-2's byte -> printable character table (bytes_to_unicode)."""
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + n)
            n += 1
    return [table[b] for b in range(256)]


_GPT2_DECODE = {ord(c): b for b, c in enumerate(gpt2_byte_chars())}


def _decode_byte_level(text: str) -> bytes:
    try:
        return bytes(_GPT2_DECODE[ord(c)] for c in text)
    except KeyError:
        pass
    out = bytearray()
    for c in text:  # llama.cpp's rendering of a character outside the byte table
        b = _GPT2_DECODE.get(ord(c))
        if b is not None:
            out.append(b)
        else:
            out += b"[UNK_BYTE_0x" + c.encode("utf-8").hex().encode() + text.encode("utf-8") + b"]"
    return bytes(out)


def _byte_value(text: str) -> int:
    return int(text[3:5], 16)


class Pieces:
    """Lazily built `token_to_piece` tables (with and without special-token text)."""

    def __init__(self, vocab: Vocab) -> None:
        self._vocab = vocab
        self._tables: dict[bool, list[bytes]] = {}

    def table(self, special: bool) -> list[bytes]:
        t = self._tables.get(special)
        if t is None:
            t = self._tables[special] = self._build(special)
        return t

    def _build(self, special: bool) -> list[bytes]:
        v = self._vocab
        attrs = v.attrs.tolist()
        bpe = v.kind == KIND_BPE and not v.escape_whitespaces
        out: list[bytes] = []
        for text, a in zip(v.tokens, attrs, strict=True):
            if a & _SPECIAL and not special:
                out.append(b"")
            elif a & (_SPECIAL | ATTR_USER_DEFINED):
                out.append(text.encode("utf-8", "surrogatepass"))
            elif a & ATTR_NORMAL:
                if bpe:
                    out.append(_decode_byte_level(text))
                else:
                    out.append(text.replace("▁", " ").encode("utf-8", "surrogatepass"))
            elif a & ATTR_BYTE:
                out.append(bytes([_byte_value(text)]))
            else:
                out.append(b"")
        return out


def clean_up_spaces(text: bytes) -> bytes:
    """llama.cpp's `clean_spaces` passes: " ?"/" !"/" ."/" ," lose the space, " ' " becomes
    "'", and " 's"/" 'm"/" 're"/" 've" lose the space before the apostrophe."""
    text = re.sub(rb" (?=[?!.,])", b"", text)
    text = text.replace(b" ' ", b"'")
    return re.sub(rb" '(?=[sm]|re|ve)", b"'", text)


def detokenize(
    vocab: Vocab, pieces: Pieces, ids, remove_special: bool, unparse_special: bool
) -> bytes:
    """llama.cpp's `llama_detokenize` (bytes; may end inside a UTF-8 sequence)."""
    ids = [int(i) for i in ids]
    remove_space = vocab.add_space_prefix
    if remove_special and vocab.add_bos and ids and ids[0] == vocab.special["bos"]:
        remove_space = False
        ids = ids[1:]
    if remove_special and vocab.add_eos and ids and ids[-1] == vocab.special["eos"]:
        ids = ids[:-1]
    table = pieces.table(unparse_special)
    n = len(table)
    for i in ids:
        if not 0 <= i < n:
            raise IndexError(f"token id {i} is outside the vocabulary (size {n})")
    out = b"".join(table[i] for i in ids)
    if remove_space and ids and table[ids[0]].startswith(b" "):
        out = out[1:]
    if vocab.clean_spaces:
        out = clean_up_spaces(out)
    return out


class IncrementalDecoder:
    """Streaming detokeniser: feed ids one at a time, get text that is never a broken
    UTF-8 sequence (incomplete trailing bytes are held back until completed; invalid bytes
    become U+FFFD). `flush()` returns whatever is left at the end.

    Pieces are concatenated as llama.cpp's server streams them (`token_to_piece` per
    token): no leading-space removal and no `clean_spaces` pass, so for vocabularies with
    neither (SmolLM2, Gemma) the stream equals `Tokenizer.decode` of the same ids.
    """

    def __init__(self, tokenizer, skip_special: bool = False) -> None:
        self._table = tokenizer._pieces.table(not skip_special)
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token_id: int) -> str:
        token_id = int(token_id)
        if not 0 <= token_id < len(self._table):
            raise IndexError(f"token id {token_id} is outside the vocabulary")
        return self._utf8.decode(self._table[token_id])

    def feed_many(self, ids) -> str:
        return "".join(self.feed(i) for i in ids)

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)

    def reset(self) -> None:
        self._utf8.reset()


def held_back(text: str, stops: Sequence[str]) -> int:
    """How many trailing characters of `text` could begin one of `stops`."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best


class StopStrings:
    """Stop strings over streamed text, as llama-server and OpenAI apply them: the text
    ends before the first occurrence of any of `stops`, which is never emitted, and a
    tail that could begin one is held back until the next piece tells."""

    def __init__(self, stops: Sequence[str] | None) -> None:
        self.stops = [s for s in (stops or []) if s]
        self.hit: str | None = None  # the stop string found, once found
        self._pending = ""  # text received, not yet emitted

    def feed(self, piece: str, final: bool = False) -> tuple[str, bool]:
        """(the text that may be emitted now, whether a stop string ended it) after
        `piece`; `final`: no more text follows (nothing is held back)."""
        pending = self._pending + piece
        if not self.stops:
            self._pending = ""
            return pending, False
        hits = [(pending.find(s), s) for s in self.stops if s in pending]
        if hits:
            i, self.hit = min(hits)
            self._pending = ""
            return pending[:i], True
        keep = 0 if final else held_back(pending, self.stops)
        self._pending = pending[len(pending) - keep :]
        return pending[: len(pending) - keep], False
