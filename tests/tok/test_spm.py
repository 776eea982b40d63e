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
TOK._subset_budget = 10**12  # every encode on a per-text subset engine
TOK_FULL = _tok().warm()  # the engine over the whole vocabulary


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=ALPHABET, max_size=24))
def test_matches_llamacpp_procedure(text):
    meta = spm_meta(PIECES)
    expected = llamacpp_spm(
        meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.scores"], text.replace(" ", "▁")
    )
    assert TOK.encode(text, add_special=False) == expected
    assert TOK_FULL.encode(text, add_special=False) == expected
    assert TOK.decode(expected) == text


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.text(alphabet="ab▁", min_size=2, max_size=5), st.integers(-3, 0), max_size=30
    ),
    st.lists(st.text(alphabet="ab <>é", max_size=16), min_size=1, max_size=3),
)
def test_subset_engine_equals_full_engine(pieces, texts):
    """Including tied scores (where both differ from llama.cpp in the same way)."""
    pieces = {"a": -1.0, "b": -1.0, "▁": -2.0, **{k: float(v) for k, v in pieces.items()}}
    subset = Tokenizer.from_metadata(spm_meta(pieces, extra=[("<>", 4)]))
    subset._subset_budget = 10**12
    full = Tokenizer.from_metadata(spm_meta(pieces, extra=[("<>", 4)])).warm()
    for text in texts:
        assert subset.encode(text) == full.encode(text)
    assert subset._engine is None


def test_full_engine_once_the_subset_budget_is_spent():
    tok = _tok()
    tok._subset_budget = 10
    meta = spm_meta(PIECES)
    for text, built in (("abcd", False), ("dddddddcab", True), ("bca", True)):
        expected = llamacpp_spm(meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.scores"], text)
        assert tok.encode(text, add_special=False) == expected
        assert (tok._engine is not None) == built
    long = _tok()
    long._subset_budget = 10
    long.encode("a" * 11)  # one text over the budget goes straight to the full engine
    assert long._engine is not None


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
