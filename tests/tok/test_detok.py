"""Detokenisation: llama.cpp's clean-up passes and streaming without broken UTF-8."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from toktestlib import PIECES, spm_meta

from llamay.tok.detok import clean_up_spaces, gpt2_byte_chars


def clean_spaces_c(text: bytes) -> bytes:
    """Direct transcription of the three passes in llama.cpp's `detokenize` (test oracle)."""
    t = bytearray(text)

    def pass1(t):
        n, total = len(t), 1 if t else 0
        for i in range(1, n):
            x = t[i]
            if t[i - 1] == 0x20 and x in b"?!.,":
                total -= 1
            t[total] = x
            total += 1
        return t[:total]

    def pass2(t):
        n, total, i = len(t), 1 if t else 0, 1
        while i < n:
            x = t[i]
            if x == 0x27 and i + 1 < n and t[i - 1] == 0x20 and t[i + 1] == 0x20:
                total -= 1
                i += 1
                t[i] = 0
            t[total] = x
            total += 1
            i += 1
        return t[:total]

    def pass3(t):
        n, total = len(t), 1 if t else 0
        for i in range(1, n):
            x = t[i]
            if t[i - 1] == 0x20 and x == 0x27 and i + 1 < n:
                x1 = t[i + 1]
                if x1 in b"sm":
                    total -= 1
                elif x1 not in b"td" and i + 2 < n and bytes([x1, t[i + 2]]) in (b"re", b"ve"):
                    total -= 1
            t[total] = x
            total += 1
        return t[:total]

    return bytes(pass3(pass2(pass1(t))))


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=" ',.!?smrevtdx", max_size=20))
def test_clean_spaces_matches_llamacpp_passes(text):
    b = text.encode()
    assert clean_up_spaces(b) == clean_spaces_c(b)


def test_gpt2_byte_table_is_a_bijection():
    chars = gpt2_byte_chars()
    assert len(set(chars)) == 256 and chars[ord("A")] == "A" and chars[ord(" ")] == "Ġ"


MULTIBYTE = "é日本😀👩‍👩‍👧🇫🇷𠀀a "


@pytest.fixture(scope="module")
def spm_tok():
    from llamay.tok import Tokenizer

    return Tokenizer.from_metadata(spm_meta(PIECES))


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=MULTIBYTE, max_size=12))
def test_streaming_byte_fallback_never_breaks_utf8(spm_tok, text):
    ids = spm_tok.encode(text, add_special=False)
    dec = spm_tok.incremental_decoder()
    pieces = [dec.feed(i) for i in ids] + [dec.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)


def test_streaming_holds_back_partial_characters(spm_tok):
    ids = spm_tok.encode("😀", add_special=False)
    assert len(ids) == 4  # four <0xXX> byte tokens
    dec = spm_tok.incremental_decoder()
    assert [dec.feed(i) for i in ids] == ["", "", "", "😀"]
    assert dec.flush() == ""


def test_streaming_flushes_an_incomplete_tail_as_replacement(spm_tok):
    ids = spm_tok.encode("😀", add_special=False)[:2]
    dec = spm_tok.incremental_decoder()
    assert dec.feed_many(ids) == ""
    assert dec.flush() == "\ufffd"
    assert spm_tok.decode(ids) == "\ufffd"


@pytest.mark.model
def test_smollm2_streaming_emoji_and_cjk(smollm2_tok):
    tok = smollm2_tok
    text = "emoji 😀🎉👩‍👩‍👧‍👦 日本語のテキスト 🇫🇷 한국어"
    ids = tok.encode(text, add_special=False)
    dec = tok.incremental_decoder()
    pieces = [dec.feed(i) for i in ids]
    assert "".join(pieces) + dec.flush() == text
    assert all("\ufffd" not in p for p in pieces)
    # some byte-level tokens carry only part of a character
    assert any(p == "" for p in pieces)


@pytest.mark.model
def test_gemma3_byte_fallback_streaming(gemma3_tok):
    tok = gemma3_tok
    text = "rare 𠀀𠀁 chars"
    ids = tok.encode(text, add_special=False)
    assert any(tok.id_to_token(i).startswith("<0x") for i in ids)
    dec = tok.incremental_decoder()
    assert "".join(dec.feed(i) for i in ids) + dec.flush() == text == tok.decode(ids)
