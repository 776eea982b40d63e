"""Special-token partition (llama.cpp's `tokenizer_st_partition`) and byte-level BPE details."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from llamay.tok import Tokenizer, Vocab
from llamay.tok.bpe import parse_merges
from llamay.tok.special import SpecialSplitter
from llamay.tok.vocab import ATTR_LSTRIP, ATTR_RSTRIP

BASE = [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["Ġ"]


def vocab(specials: list[tuple[str, int]], **extra) -> Vocab:
    toks = BASE + [t for t, _ in specials]
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": toks,
        "tokenizer.ggml.merges": [],
        "tokenizer.ggml.token_type": np.array([1] * len(BASE) + [k for _, k in specials], np.int32),
        **extra,
    }
    return Vocab.from_metadata(meta)


def names(v: Vocab, frags) -> list:
    return [v.tokens[f] if isinstance(f, int) else f for f in frags]


def test_longest_token_first_then_shorter():
    v = vocab([("<a>", 3), ("<a><b>", 3), ("<b>", 3)])
    s = SpecialSplitter(v)
    assert names(v, s.split("x<a><b>y<b><a>", True)) == ["x", "<a><b>", "y", "<b>", "<a>"]


def test_raw_mode_only_splits_user_defined():
    v = vocab([("<ctl>", 3), ("<usr>", 4), ("<unk>", 2)])
    s = SpecialSplitter(v)
    assert names(v, s.split("a<ctl>b<usr>c<unk>", False)) == ["a<ctl>b", "<usr>", "c<unk>"]
    assert names(v, s.split("a<ctl>b<usr>c<unk>", True)) == [
        "a", "<ctl>", "b", "<usr>", "c", "<unk>"
    ]  # fmt: skip


def test_lstrip_rstrip():
    v = vocab([("<m>", 3)])
    v.attrs[len(BASE)] |= ATTR_LSTRIP | ATTR_RSTRIP
    s = SpecialSplitter(v)
    assert names(v, s.split("a \t<m>\n b", True)) == ["a", "<m>", "b"]
    assert names(v, s.split("  <m>  ", True)) == ["<m>"]


def test_no_special_tokens_and_empty_text():
    v = vocab([])
    s = SpecialSplitter(v)
    assert s.split("", True) == [] and s.split("abc", True) == ["abc"]


def test_overlapping_occurrences_follow_llamacpp_order():
    # llama.cpp splits the longer token everywhere first, even where a shorter one starts
    # earlier: "<<x>>" with "<x>>" (4 chars) and "<<x" (3 chars) -> "<", "<x>>"
    v = vocab([("<<x", 3), ("<x>>", 3)])
    assert names(v, SpecialSplitter(v).split("<<x>>", True)) == ["<", "<x>>"]


def test_merge_parsing_keeps_first_rank_and_drops_unknown():
    t2i = {t: i for i, t in enumerate(["a", "b", "ab", "c"])}
    assert parse_merges(["a b", "a b", "b c", "x y", "nospace"], t2i) == [("a", "b")]


def test_ignore_merges_emits_whole_word():
    toks = ["a", "b", "c", "ab", "bc", "abc"]
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": toks,
        "tokenizer.ggml.merges": ["b c", "a bc"],  # no path to "abc" via "ab"
        "tokenizer.ggml.add_bos_token": False,
    }
    plain = Tokenizer.from_metadata({**meta, "tokenizer.ggml.pre": "gpt-2"})
    assert [plain.id_to_token(i) for i in plain.encode("ab", add_special=False)] == ["a", "b"]
    llama3 = Tokenizer.from_metadata({**meta, "tokenizer.ggml.pre": "llama-bpe"})  # whole word
    assert [llama3.id_to_token(i) for i in llama3.encode("ab", add_special=False)] == ["ab"]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.text(alphabet="abĠ", min_size=2, max_size=4), max_size=25),
    st.lists(st.text(alphabet="ab <>", max_size=16), min_size=1, max_size=3),
    st.booleans(),
)
def test_bpe_subset_engine_equals_full_engine(words, texts, whole_words):
    """Per-text engines (merges found by splitting the text's tokens) against the engine
    of every merge, with repeated, unknown and order-conflicting merges."""
    toks = ["a", "b", "Ġ", "<>", *dict.fromkeys(words)]
    merges = [f"{w[:k]} {w[k:]}" for w in words for k in (1, len(w) - 1)] + ["x y", "a b"]
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "llama-bpe" if whole_words else "gpt-2",
        "tokenizer.ggml.tokens": toks,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.token_type": np.array([1, 1, 1, 4] + [1] * (len(toks) - 4), np.int32),
        "tokenizer.ggml.add_bos_token": False,
    }
    subset = Tokenizer.from_metadata(meta)
    subset._subset_budget = 10**12
    full = Tokenizer.from_metadata(meta).warm()
    for text in texts:
        assert subset.encode(text) == full.encode(text)
    assert subset._engine is None


def test_bpe_subset_engine_keeps_first_rank_of_repeated_merge():
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": ["a", "b", "ab", "bb"],
        "tokenizer.ggml.merges": ["a b", "b b", "a b"],
        "tokenizer.ggml.add_bos_token": False,
    }
    subset = Tokenizer.from_metadata(meta)
    full = Tokenizer.from_metadata(meta).warm()
    assert [subset.id_to_token(i) for i in subset.encode("abb")] == ["ab", "b"]
    assert full.encode("abb") == subset.encode("abb") and subset._engine is None
