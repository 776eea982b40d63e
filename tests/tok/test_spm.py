"""SentencePiece (`llama`) vocabularies: the `tokenizers` BPE built from scores against a
direct Python transcription of llama.cpp's bigram-merge procedure (a test oracle only)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from toktestlib import ALPHABET, PIECES, llamacpp_spm, spm_meta

from llamay.errors import TokenizerError
from llamay.tok import Tokenizer
from llamay.tok.spm import _split_pairs_slow, split_pairs


def _tok(**kw) -> Tokenizer:
    return Tokenizer.from_metadata(spm_meta(PIECES, **kw))


TOK = _tok()


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=ALPHABET, max_size=24))
def test_matches_llamacpp_procedure(text):
    meta = spm_meta(PIECES)
    expected = llamacpp_spm(
        meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.scores"], text.replace(" ", "▁")
    )
    assert TOK.encode(text, add_special=False) == expected
    assert TOK.decode(expected) == text


def test_merges_by_score_not_training_order():
    ids = TOK.encode("abc", add_special=False)
    assert [TOK.id_to_token(i) for i in ids] == ["abc"]
    ids = TOK.encode("cabc", add_special=False)
    meta = spm_meta(PIECES)
    assert ids == llamacpp_spm(meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.scores"], "cabc")


def test_byte_fallback_and_bos():
    ids = TOK.encode("é", add_special=True)
    assert ids[0] == TOK.bos_id == 1
    assert [TOK.id_to_token(i) for i in ids[1:]] == ["<0xC3>", "<0xA9>"]
    assert TOK.decode(ids, skip_special=True) == "é"


def test_add_space_prefix_after_special_tokens():
    tok = _tok(add_space_prefix=True)
    assert [tok.id_to_token(i) for i in tok.encode("ab", add_special=False)] == ["▁ab"]
    ids = tok.encode("a</s>a", add_special=False, parse_special=True)
    assert [tok.id_to_token(i) for i in ids] == ["▁a", "</s>", "▁a"]
    # llama.cpp drops the prefix space of the first token when decoding
    assert tok.decode(tok.encode("ab", add_special=False)) == "ab"


def test_user_defined_split_even_in_raw_mode():
    tok = Tokenizer.from_metadata(spm_meta(PIECES, extra=[("<tag>", 4), ("<ctl>", 3)]))
    ids = tok.encode("a<tag>b<ctl>", add_special=False, parse_special=False)
    texts = [tok.id_to_token(i) for i in ids]
    assert texts[:3] == ["a", "<tag>", "b"]
    assert "<ctl>" not in texts  # control text stays text without parse_special
    ids = tok.encode("a<tag>b<ctl>", add_special=False, parse_special=True)
    assert [tok.id_to_token(i) for i in ids] == ["a", "<tag>", "b", "<ctl>"]


def test_split_pairs_vectorised_equals_slow():
    tokens = ["a", "b", "ab", "ba", "aba", "bab", "abab", "x", "😀", "a😀", "😀b", "a😀b", "zz"]
    fast = {tuple(r) for r in split_pairs(tokens).tolist()}
    slow = {tuple(r) for r in _split_pairs_slow(tokens).tolist()}
    assert fast == slow and len(fast) == 13


def test_bad_input_fails_clearly():
    with pytest.raises(TokenizerError, match="surrogate"):
        TOK.encode("a\ud800b")
    with pytest.raises(IndexError):
        TOK.decode([10**6])
    with pytest.raises(IndexError):
        TOK.token_to_piece(-1)
    with pytest.raises(IndexError):
        TOK.incremental_decoder().feed(-1)
