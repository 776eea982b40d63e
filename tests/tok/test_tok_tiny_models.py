"""The tiny fixture models' tokenizers (all a copy of SmolLM2's) load and agree with the
token ids llama.cpp's fixture generator used (`tokens_a` in `<m>.llamacpp.npz`)."""

from __future__ import annotations

import numpy as np
import pytest
from fixture_data import tiny_model_file

from llamay.gguf import open_gguf
from llamay.tok import Tokenizer

TINY = ["bert", "llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3", "olmo2", "starcoder2"]


@pytest.mark.parametrize("name", TINY)
def test_tiny_tokenizer(fixtures_dir, name):
    path = tiny_model_file(name)
    tok = Tokenizer.from_metadata(open_gguf(path).metadata)
    assert (tok.model, tok.pre, tok.vocab_size, tok.bos_id, tok.eos_id) == (
        "gpt2", "smollm", 49152, 1, 2
    )  # fmt: skip
    expected = np.load(fixtures_dir / "tiny" / f"{name}.llamacpp.npz")["tokens_a"].tolist()
    ids = tok.encode("The quick brown fox jumps over the lazy dog. " * 4, add_special=True)
    assert ids[:24] == expected
    assert tok.chat_template_source == "gguf"
