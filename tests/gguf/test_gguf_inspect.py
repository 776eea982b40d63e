"""The summary dict behind `llamay show`."""

from __future__ import annotations

import json

import numpy as np
import pytest
from gguf_testlib import reference_path, tiny_path

from llamay.gguf import GGMLType, GGUFFile, GGUFWriter
from llamay.gguf.constants import GGUFValueType as T
from llamay.gguf.inspect import summary


def test_summary_of_a_written_file(tmp_path):
    w = GGUFWriter(tmp_path / "s.gguf")
    w.add("general.architecture", "llama")
    w.add("general.name", "tiny")
    w.add("general.file_type", 7, T.UINT32)
    w.add("llama.context_length", 512, T.UINT32)
    w.add("tokenizer.ggml.tokens", ["a", "b", "c"])
    w.add("tokenizer.chat_template", "{{ messages }}")
    w.add_tensor("a", np.zeros((4, 8), np.float32))
    w.add_tensor("b", np.zeros((2, 34), np.uint8), GGMLType.Q8_0)
    w.add_tensor("c", np.zeros(8, np.float32))
    w.write(fsync=False)
    s = summary(tmp_path / "s.gguf")
    assert s["architecture"] == "llama" and s["name"] == "tiny"
    assert s["file_type"] == "Q8_0"
    assert s["tensor_count"] == 3
    assert s["tensor_types"] == {"F32": 2, "Q8_0": 1}
    assert list(s["tensor_types"]) == ["F32", "Q8_0"]  # most common first
    assert s["parameter_count"] == 32 + 64 + 8
    assert s["context_length"] == 512
    assert s["vocab_size"] == 3
    assert s["has_chat_template"] is True
    json.dumps(s)


def test_summary_of_a_bare_file(tmp_path):
    w = GGUFWriter(tmp_path / "bare.gguf")
    w.add("x", 1)
    w.write(fsync=False)
    s = summary(tmp_path / "bare.gguf")
    assert s["architecture"] is None and s["context_length"] is None
    assert s["tensor_count"] == 0 and s["parameter_count"] == 0
    assert s["has_chat_template"] is False and s["vocab_size"] is None


def test_summary_of_tiny_model_accepts_an_open_file():
    with GGUFFile(tiny_path("qwen3moe")) as f:
        s = summary(f)
        assert f.tensors  # still open
    assert s["architecture"] == "qwen3moe"
    assert s["context_length"] == 2048 and s["has_chat_template"] is True
    assert s["tensor_count"] == 26


@pytest.mark.model
def test_summary_of_reference_models(request):
    s = summary(reference_path(request, "smollm2"))
    assert s["architecture"] == "llama" and s["file_type"] == "Q4_1"
    assert s["tensor_types"] == {"Q4_1": 210, "F32": 61, "Q8_0": 1}
    assert s["parameter_count"] == 134_515_008 and s["context_length"] == 8192
    assert s["has_chat_template"] is True
    g = summary(reference_path(request, "gemma3"))
    assert g["architecture"] == "gemma3" and g["file_type"] == "Q4_K_M"
    assert g["context_length"] == 32768 and g["vocab_size"] == 262144
    assert g["has_chat_template"] is False
