"""Our reader against gguf-py's on the tiny models and the reference models."""

from __future__ import annotations

import numpy as np
import pytest
from gguf_testlib import (
    assert_matches_gguf_py,
    gguf_py_view,
    reference_path,
    tiny_params,
    tiny_path,
)

from llamay.gguf import GGMLType, GGUFFile, GGUFValueType, reader


@pytest.mark.parametrize("model", tiny_params())
def test_tiny_model_matches_gguf_py(model):
    path = tiny_path(model)
    with GGUFFile(path) as f:
        assert f.version == 3
        assert_matches_gguf_py(f, gguf_py_view(str(path)))


@pytest.mark.model
@pytest.mark.parametrize(
    "name", ["smollm2", pytest.param("gemma3", marks=pytest.mark.slow)]
)  # gguf-py needs ~18 s for gemma3's 262k tokens
def test_reference_model_matches_gguf_py(request, name):
    path = reference_path(request, name)
    with GGUFFile(path) as f:
        assert_matches_gguf_py(f, gguf_py_view(str(path)))


def _parse_all_ways(path, monkeypatch):
    """Metadata parsed by the vectorised, the looped and the per-string paths."""
    out = {}
    with GGUFFile(path) as f:
        out["vectorised"] = f.metadata
    with monkeypatch.context() as m:
        m.setattr(reader._Cursor, "_prefixes_vectorised", lambda self, n: None)
        with GGUFFile(path) as f:
            out["loop"] = f.metadata
    with monkeypatch.context() as m:
        m.setattr(reader, "_BULK_STRINGS", 1 << 62)
        with GGUFFile(path) as f:
            out["per-string"] = f.metadata
    return out


def _assert_same_metadata(a, b):
    assert list(a) == list(b)
    for k in a:
        if isinstance(a[k], np.ndarray):
            np.testing.assert_array_equal(a[k], b[k])
        else:
            assert a[k] == b[k], k


def test_string_array_paths_agree_tiny(monkeypatch):
    ways = _parse_all_ways(tiny_path("llama"), monkeypatch)
    assert len(ways["vectorised"]["tokenizer.ggml.tokens"]) == 49152
    _assert_same_metadata(ways["vectorised"], ways["per-string"])
    _assert_same_metadata(ways["loop"], ways["per-string"])


@pytest.mark.model
@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_string_array_paths_agree_reference(request, monkeypatch, name):
    ways = _parse_all_ways(reference_path(request, name), monkeypatch)
    _assert_same_metadata(ways["vectorised"], ways["per-string"])
    _assert_same_metadata(ways["loop"], ways["per-string"])


@pytest.mark.model
def test_reference_models_basics(request):
    with GGUFFile(reference_path(request, "smollm2")) as f:
        assert f.architecture == "llama"
        assert f.metadata_types["llama.context_length"] == (GGUFValueType.UINT32, None)
        assert f.metadata_types["tokenizer.ggml.tokens"] == (
            GGUFValueType.ARRAY,
            GGUFValueType.STRING,
        )
        assert f.tensors["token_embd.weight"].ggml_type == GGMLType.Q8_0
        assert f.raw("token_embd.weight").shape == (49152, 576 // 32 * 34)
    with GGUFFile(reference_path(request, "gemma3")) as f:
        assert f.architecture == "gemma3"
        assert len(f.metadata["tokenizer.ggml.tokens"]) == 262144
        assert f.metadata["tokenizer.ggml.scores"].dtype == np.float32


def test_tensor_views_are_zero_copy_and_shaped():
    with GGUFFile(tiny_path("llama")) as f:
        info = f.tensors["token_embd.weight"]
        raw = f.raw(info.name)
        assert raw.dtype == np.uint8 and not raw.flags.owndata and not raw.flags.writeable
        assert raw.shape == (info.ne[1], info.ne[0] // 32 * 34)
        assert raw.nbytes == info.nbytes
        assert info.shape == tuple(reversed(info.ne))
        assert info.n_elements == info.ne[0] * info.ne[1]
        assert "llama" in repr(f)


def test_views_outlive_close():
    f = GGUFFile(tiny_path("llama"))
    raw = f.raw("token_embd.weight")
    first = bytes(raw[0, :8])
    f.close()  # the map stays alive while views exist
    assert bytes(raw[0, :8]) == first


def test_raw_metadata_is_the_stored_encoding():
    with GGUFFile(tiny_path("llama")) as f:
        enc = f.raw_metadata("general.architecture")
        assert enc[:4] == int(GGUFValueType.STRING).to_bytes(4, "little")
        assert enc[12:] == b"llama"
