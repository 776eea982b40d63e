"""BERT WordPiece. There is no llama.cpp oracle for a BERT tokenizer here, so this is a
SANITY CHECK against the `tokenizers` library's own BERT WordPiece pipeline on a small
hand-built vocabulary, converted to GGUF form the way llama.cpp's converter does
(`##piece` -> `piece`, `word` -> `▁word`, `[SPECIAL]` unchanged)."""

from __future__ import annotations

import numpy as np
import pytest

from llamay.tok import Tokenizer

HF_VOCAB = [
    "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
    "hello", "world", "un", "##believ", "##able", "the", "quick", "brown", "fox",
    "##es", "jump", "##s", "##ed", ",", ".", "!", "'", "s", "cafe", "naive", "re",
    "##sume", "中", "文", "a", "b", "##a", "##b", "$", "5", "##0", "e",
]  # fmt: skip
TEXTS = [
    "Hello, world!",
    "unbelievable foxes jumped.",
    "The QUICK brown fox's jumps",
    "Café naïve résumé",
    "中文 a$50 ab ba",
    "xyz unknownword hello",
    "  \t spaced\n\nout  ",
    "",
]


def gguf_form(tok: str) -> str:
    if tok.startswith("[") and tok.endswith("]"):
        return tok
    return tok[2:] if tok.startswith("##") else "\u2581" + tok


@pytest.fixture(scope="module")
def pair():
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import normalizers, pre_tokenizers
    from tokenizers.models import WordPiece

    ref = HFTokenizer(WordPiece({t: i for i, t in enumerate(HF_VOCAB)}, unk_token="[UNK]"))
    ref.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=True)
    ref.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    types = [3 if t.startswith("[") else 1 for t in HF_VOCAB]
    meta = {
        "general.architecture": "bert",
        "tokenizer.ggml.model": "bert",
        "tokenizer.ggml.tokens": [gguf_form(t) for t in HF_VOCAB],
        "tokenizer.ggml.token_type": np.array(types, np.int32),
        "tokenizer.ggml.unknown_token_id": 1,
        "tokenizer.ggml.cls_token_id": 2,
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.seperator_token_id": 3,
        "tokenizer.ggml.padding_token_id": 0,
        "tokenizer.ggml.mask_token_id": 4,
    }
    return ref, Tokenizer.from_metadata(meta)


@pytest.mark.parametrize("text", TEXTS)
def test_same_ids_as_tokenizers_bert_wordpiece(pair, text):
    ref, tok = pair
    assert tok.encode(text, add_special=False) == ref.encode(text, add_special_tokens=False).ids


def test_cls_and_sep(pair):
    _, tok = pair
    assert tok.encode("hello", add_special=True) == [2, 5, 3]


def test_decode_uses_phantom_space(pair):
    _, tok = pair
    ids = tok.encode("unbelievable fox", add_special=False)
    assert tok.decode(ids) == " unbelievable fox"  # llama.cpp keeps the leading phantom space
