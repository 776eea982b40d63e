"""Fixtures for the GGUF room: tiny models, reference models, a gguf-py oracle view."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fixture_data import tiny_model_file, tiny_names

REPO_ROOT = Path(__file__).resolve().parents[2]
TINY_MODELS = tiny_names()
# gguf-py takes ~3.5 s to parse each tiny model: these run by default, the rest are `slow`.
DEFAULT_TINY = ("llama", "qwen3moe")
REFERENCE = {"smollm2": "smollm2_path", "gemma3": "gemma3_path"}  # tests/conftest.py


def tiny_params(default: tuple[str, ...] = DEFAULT_TINY) -> list:
    """Tiny models as pytest params: those in `default` run always, the others are `slow`."""
    return [
        pytest.param(m, marks=() if m in default else pytest.mark.slow, id=m) for m in TINY_MODELS
    ]


def tiny_path(name: str) -> Path:
    return tiny_model_file(name)


def reference_path(request: pytest.FixtureRequest, name: str) -> Path:
    """A reference model through the store fixtures (fetched on first use)."""
    return Path(request.getfixturevalue(REFERENCE[name]))


@functools.lru_cache(maxsize=4)
def gguf_py_view(path: str) -> dict[str, Any]:
    """What gguf-py's GGUFReader sees: metadata (types, contents) and tensors."""
    import gguf

    r = gguf.GGUFReader(path)
    fields = {}
    for key, field in r.fields.items():
        if key.startswith("GGUF."):
            continue
        fields[key] = ([int(t) for t in field.types], field.contents())
    tensors = [
        {
            "name": t.name,
            "ne": tuple(int(d) for d in t.shape),
            "type": int(t.tensor_type),
            "offset": int(t.data_offset),
            "nbytes": int(t.n_bytes),
            "sha1": hashlib.sha1(np.ascontiguousarray(t.data).view(np.uint8)).hexdigest(),
        }
        for t in r.tensors
    ]
    return {"fields": fields, "tensors": tensors, "alignment": int(r.alignment)}


def plain(value: Any) -> Any:
    """A metadata value as plain Python (numpy arrays to lists), for comparisons."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def assert_matches_gguf_py(f, view: dict[str, Any]) -> None:
    """Our reader's metadata, types and tensor infos equal what gguf-py read."""
    assert list(f.metadata) == list(view["fields"])
    for key, (types, contents) in view["fields"].items():
        vtype, subtype = f.metadata_types[key]
        assert int(vtype) == types[0], key
        if types[0] == 9:  # ARRAY
            assert subtype is not None and int(subtype) == types[1], key
        else:
            assert subtype is None, key
        ours = plain(f.metadata[key])
        if types[0] == 9 and types[1] == 9:
            # gguf-py flattens arrays of arrays; compare the flattened leaves
            ours = _flatten(ours)
        assert ours == contents, key
    assert f.alignment == view["alignment"]
    assert [t["name"] for t in view["tensors"]] == list(f.tensors)
    for t in view["tensors"]:
        info = f.tensors[t["name"]]
        assert info.ne == t["ne"]
        assert int(info.ggml_type) == t["type"]
        assert info.offset == t["offset"]
        assert info.nbytes == t["nbytes"]
        assert hashlib.sha1(f.raw(t["name"])).hexdigest() == t["sha1"], t["name"]


def _flatten(v: Any) -> list:
    out = []
    for x in v:
        out.extend(_flatten(x) if isinstance(x, list) else [x])
    return out
