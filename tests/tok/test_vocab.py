"""llama.cpp's vocabulary load rules: defaults, special ids, attributes, end-of-generation."""

from __future__ import annotations

import numpy as np
import pytest

from llamay.errors import TokenizerError, UnsupportedTokenizerError
from llamay.tok import Tokenizer, Vocab
from llamay.tok.vocab import ATTR_CONTROL, ATTR_RSTRIP, ATTR_USER_DEFINED


def bpe_meta(tokens, types=None, merges=(), **extra) -> dict:
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": list(tokens),
        "tokenizer.ggml.merges": list(merges),
    }
    if types is not None:
        meta["tokenizer.ggml.token_type"] = np.array(types, np.int32)
    meta.update(extra)
    return meta


BASE = [chr(c) for c in range(ord("a"), ord("z") + 1)]


def test_bpe_defaults_disable_out_of_range_ids():
    v = Vocab.from_metadata(bpe_meta(BASE))  # default BOS/EOS 11 = "l"
    assert v.special["bos"] == 11 and v.special["eos"] == 11 and not v.add_bos
    v = Vocab.from_metadata(bpe_meta(BASE[:5]))  # 11 is out of range -> disabled
    assert v.special["bos"] is None and v.special["eos"] is None


def test_metadata_overrides_and_bad_ids():
    meta = bpe_meta(BASE, **{"tokenizer.ggml.bos_token_id": 3, "tokenizer.ggml.eos_token_id": 99})
    with pytest.warns(UserWarning, match="eos_token_id = 99"):
        v = Vocab.from_metadata(meta)
    assert v.special["bos"] == 3 and v.special["eos"] == 11  # 99: warned, default kept


def test_llama3_pre_adds_bos_by_default():
    v = Vocab.from_metadata(bpe_meta(BASE, **{"tokenizer.ggml.pre": "llama-bpe"}))
    assert v.add_bos and v.ignore_merges and v.clean_spaces
    v = Vocab.from_metadata(bpe_meta(BASE, **{"tokenizer.ggml.pre": "smollm"}))
    assert not v.add_bos and not v.clean_spaces


def test_spm_and_bert_defaults():
    spm = Vocab.from_metadata({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": BASE})
    assert (spm.special["bos"], spm.special["eos"], spm.special["unk"]) == (1, 2, 0)
    assert spm.add_bos and not spm.add_eos and spm.add_space_prefix
    bert = Vocab.from_metadata(
        {"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": [f"t{i}" for i in range(200)]}
    )
    assert (bert.special["bos"], bert.special["sep"], bert.special["unk"]) == (101, 102, 100)
    assert bert.add_bos and bert.add_sep and bert.lowercase and bert.strip_accents


def test_add_bos_without_bos_is_an_error():
    meta = bpe_meta(BASE[:5], **{"tokenizer.ggml.add_bos_token": True})
    with pytest.raises(TokenizerError, match="add_bos_token"):
        Vocab.from_metadata(meta)


@pytest.mark.parametrize(
    "meta, match",
    [
        ({}, "no tokenizer.ggml.model"),
        ({"tokenizer.ggml.model": "t5", "tokenizer.ggml.tokens": BASE}, "'t5'"),
        ({"tokenizer.ggml.model": "nope", "tokenizer.ggml.tokens": BASE}, "'nope'"),
        ({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": BASE}, "merges"),
        ({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["a", "b", "a"]}, "duplicate"),
        ({"tokenizer.ggml.model": "llama"}, "tokens"),
    ],
)
def test_errors(meta, match):
    with pytest.raises(TokenizerError, match=match):
        Vocab.from_metadata(meta)


def test_unsupported_is_a_tokenizer_error_subclass():
    with pytest.raises(UnsupportedTokenizerError):
        Vocab.from_metadata(bpe_meta(BASE, **{"tokenizer.ggml.pre": "kimi-k2"}))


def test_eog_by_text_and_control_fixup():
    toks = BASE + ["<|im_end|>", "<|endoftext|>", "<|fim_pad|>", "<start>"]
    v = Vocab.from_metadata(bpe_meta(toks, types=[1] * len(toks)))
    ids = {t: i for i, t in enumerate(toks)}
    assert v.eog_ids == {ids["<|im_end|>"], ids["<|endoftext|>"], ids["<|fim_pad|>"], 11}
    assert v.special["eot"] == ids["<|im_end|>"]  # first EOT candidate by id
    for t in ("<|im_end|>", "<|endoftext|>", "<|fim_pad|>"):
        assert v.attrs[ids[t]] & ATTR_CONTROL  # normal-typed but control-looking
    assert not v.attrs[ids["<start>"]] & ATTR_CONTROL


def test_gpt_oss_end_is_not_eog():
    toks = BASE + ["<|return|>", "<|call|>", "<|end|>", "<|channel|>"]
    v = Vocab.from_metadata(bpe_meta(toks, types=[1] * 26 + [3] * 4))
    ids = {t: i for i, t in enumerate(toks)}
    assert ids["<|end|>"] not in v.eog_ids and {ids["<|return|>"], ids["<|call|>"]} <= v.eog_ids
    assert v.attrs[ids["<|end|>"]] == ATTR_USER_DEFINED == v.attrs[ids["<|channel|>"]]


def test_phi3_rstrip_by_model_name():
    toks = BASE + ["<|user|>", "<|endoftext|>"]
    meta = bpe_meta(toks, types=[1] * 26 + [3, 3], **{"general.name": "Phi-3 mini"})
    v = Vocab.from_metadata(meta)
    assert v.attrs[26] & ATTR_RSTRIP and not v.attrs[27] & ATTR_RSTRIP
    tok = Tokenizer(v)
    assert tok.encode("<|user|>  ab", add_special=False, parse_special=True) == [26, 0, 1]
