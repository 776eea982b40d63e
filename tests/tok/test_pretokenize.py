"""Pre-tokenizer regexes per `tokenizer.ggml.pre` and llama.cpp's semantics of them."""

from __future__ import annotations

import pytest

from llamay.errors import UnsupportedTokenizerError
from llamay.tok.pretokenize import PRE_TYPES, UNSUPPORTED_PRE, pre_spec, pre_tokenizer, to_onig

SAMPLE = "Hello  World's 12345 ~x~ ÉCOLE école ΑΒγ 日本語 \t\n\n  foo()\r\n"


def split(pre: str, text: str) -> list[str]:
    pt = pre_tokenizer(PRE_TYPES[pre], byte_level=False)
    return [s for s, _ in pt.pre_tokenize_str(text)]


@pytest.mark.parametrize("pre", sorted(PRE_TYPES))
def test_every_pre_type_compiles_and_covers_the_text(pre):
    pieces = split(pre, SAMPLE)
    assert "".join(pieces) == SAMPLE  # isolated splits never drop text


def test_names_the_value_and_lists_known_ones():
    with pytest.raises(UnsupportedTokenizerError) as e:
        pre_spec("no-such-pre")
    msg = str(e.value)
    assert "'no-such-pre'" in msg and "smollm" in msg and "llama-bpe" in msg
    for pre in UNSUPPORTED_PRE:
        with pytest.raises(UnsupportedTokenizerError, match=pre):
            pre_spec(pre)


def test_missing_pre_falls_back_to_default_with_warning():
    with pytest.warns(UserWarning, match="default"):
        assert pre_spec(None) is PRE_TYPES["default"]


def test_gpt2_and_smollm():
    assert split("gpt-2", "Hello  world's 123") == ["Hello", " ", " world", "'s", " 123"]
    assert split("smollm", "a 123") == ["a", " ", "1", "2", "3"]


def test_llama3_digits_and_newlines():
    assert split("llama-bpe", "12345 x\n\n y") == ["123", "45", " x", "\n\n", " y"]


def test_qwen2_single_digits():
    assert split("qwen2", "2024") == ["2", "0", "2", "4"]


def test_superbpe_groups_digits_from_the_right():
    assert split("superbpe", "1234567") == ["1", "234", "567"]


def test_llamacpp_category_quirks():
    # llama.cpp's collapsed \p{S} has no ASCII '~'; \p{Lu} etc. mean any letter
    assert to_onig(r"[\p{P}\p{S}]+") == r"[\p{P}[\p{S}&&[^~]]]+"
    assert to_onig(r"[\p{Lu}\p{Ll}]") == r"[\p{L}\p{L}]"
    assert to_onig(r"\s+$").endswith(r"\z")
    # deepseek-v3: "~" is not punctuation/symbol there, so it joins the letters after it
    pieces = split("deepseek-v3", "a~b $c")
    assert pieces == ["a", "~b", " $", "c"]


def test_tekken_case_split_is_ascii_only():
    # llama.cpp's rewritten tekken regex only knows ASCII case; Greek stays one word
    assert split("tekken", "HelloWorld ΑΒγδ") == ["Hello", "World", " ΑΒγδ"]
