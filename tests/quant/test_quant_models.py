"""Every tensor of the tiny fixtures and the reference models, dequantised bit-exact vs gguf-py.

numpy is compared on whole tensors (in row chunks, to bound memory); the jitted jnp path
on a fixed sample of rows per tensor, so the number of compiled shapes stays small.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import jax
import numpy as np
import pytest
from fixture_data import tiny_model_file, tiny_names

from llamay.gguf.reader import GGUFFile
from llamay.quant import dequantize, dequantize_jnp

REFERENCE = ["smollm2_path", "gemma3_path"]  # the store's models (tests/conftest.py)

ROWS_PER_CHUNK = 8192
JNP_ROWS = 8

_jit_dequant = jax.jit(dequantize_jnp, static_argnums=1)


def bits(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).view(np.uint32)


def check_file(path: Path) -> int:
    """Compare every tensor; return how many were checked."""
    with GGUFFile(path) as f:
        for name, info in f.tensors.items():
            raw = f.raw(name).reshape(-1, f.raw(name).shape[-1])
            qtype = gguf.GGMLQuantizationType(int(info.ggml_type))
            for start in range(0, raw.shape[0], ROWS_PER_CHUNK):
                chunk = raw[start : start + ROWS_PER_CHUNK]
                expect = np.asarray(gguf.quants.dequantize(chunk, qtype), np.float32)
                ours = dequantize(chunk, info.ggml_type)
                if not np.array_equal(bits(ours), bits(expect)):
                    pytest.fail(f"{path.name}: {name} ({info.ggml_type.name}) rows {start}+")
            rows = np.unique(np.linspace(0, raw.shape[0] - 1, JNP_ROWS).astype(int))
            sample = np.ascontiguousarray(raw[rows])
            got = _jit_dequant(sample, info.ggml_type)
            if not np.array_equal(bits(got), bits(dequantize(sample, info.ggml_type))):
                pytest.fail(f"{path.name}: {name} ({info.ggml_type.name}) jnp differs")
        return len(f.tensors)


@pytest.mark.parametrize("model", tiny_names())
def test_tiny_model_tensors(model):
    assert check_file(tiny_model_file(model)) > 0


@pytest.mark.model
@pytest.mark.parametrize("name", REFERENCE)
def test_reference_model_tensors(request, name):
    assert check_file(request.getfixturevalue(name)) > 0
