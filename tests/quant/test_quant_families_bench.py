"""bench/quant_families.py's file-making step: llama.cpp's quantiser run on a real GGUF
(the tiny qwen3, rows multiples of 256, and a 576-wide one cut from it is not needed: the
fallbacks are what llama.cpp wrote) gives files whose matrix types are what the script
reports (its gguf-py read back equals llamay's own reader), made once (cached)."""

from __future__ import annotations

import collections
import pathlib

import pytest
from fixture_data import missing, tiny_model_file

from llamay.gguf import open_gguf

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def B(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(REPO_ROOT))
    from bench import quant_families

    if not (quant_families.VENV / "bin" / "python").exists():
        missing(f"llama-cpp-python's venv {quant_families.VENV} is needed to quantise")
    src = tiny_model_file("qwen3")
    monkeypatch.setattr(quant_families, "MODELS_DIR", tmp_path)
    monkeypatch.setattr(quant_families, "source_path", lambda name: src)
    return quant_families


@pytest.mark.parametrize("ftype", ["TQ2_0", "IQ4_NL"])
def test_made_file_holds_the_types_reported(B, ftype):
    path = B.make("tiny", ftype)
    reported = B.tensor_types(path)
    tensors = open_gguf(path).tensors
    ours = collections.Counter(t.ggml_type.name for t in tensors.values() if len(t.shape) > 1)
    assert reported == dict(ours)
    # most block matrices are `ftype` (llama.cpp's mix keeps a few, e.g. attn_v, wider)
    blocks = [t.ggml_type.name for n, t in tensors.items() if n.startswith("blk.")]
    assert collections.Counter(b for b in blocks if b != "F32").most_common(1)[0][0] == ftype
    mtime = path.stat().st_mtime_ns
    assert B.make("tiny", ftype) == path and path.stat().st_mtime_ns == mtime  # cached
