"""The tiny qwen3 in the new tensor types against llama.cpp (tests/fixtures/quant-types/
README.md): quantised by llama.cpp itself to IQ4_NL, IQ4_XS, IQ3_S, TQ1_0 and TQ2_0, and
with every matrix random blocks of each of the 12 types (the others need an importance
matrix to be quantised). Every tensor dequantises as gguf-py does, bit for bit, and
numerics="llamacpp" logits stay within the tiny README's tolerance of llama.cpp's.

The GGUFs (4-9 MB) are rebuilt: the quantised ones with llama-cpp-python's
`llama_model_quantize` (deterministic; without llama-cpp-python they cannot be, and those
tests skip saying so), the random ones by the maker's `random_model` (numpy, llamay)."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import subprocess

import gguf
import numpy as np
import pytest
from fixture_data import tiny_model_file

import llamay
from llamay.gguf import GGUFFile
from llamay.quant import dequantize

HERE = pathlib.Path(__file__).resolve().parent
FIXTURES = HERE.parent / "fixtures" / "quant-types"
MAKER = FIXTURES / "make_quant_types.py"
LLAMACPP_PYTHON = pathlib.Path.home() / ".cache/llamay/llamacpp-venv/bin/python"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
MADE = [name for name, m in MANIFEST.items() if "error" not in m]
TOLERANCE = 1.0  # tests/fixtures/tiny/README.md: "≈1.0 for qwen3"


def _maker():
    spec = importlib.util.spec_from_file_location("make_quant_types", MAKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MAKE = _maker()
RANDOM = [f"random-{t}" for t in MAKE.RANDOM_TYPES]


@pytest.fixture(scope="module")
def quantised(tmp_path_factory):
    out = tmp_path_factory.mktemp("quant-types")
    src = str(tiny_model_file("qwen3"))

    def build(name: str) -> pathlib.Path:
        dst = out / f"qwen3-{name}.gguf"
        if name.startswith("random-") and not dst.exists():
            MAKE.random_model(src, str(dst), name.removeprefix("random-"))
        if not dst.exists():
            if not LLAMACPP_PYTHON.exists():
                pytest.skip(f"llama-cpp-python ({LLAMACPP_PYTHON}) is needed to rebuild {name}")
            cmd = [str(LLAMACPP_PYTHON), str(MAKER), "--quantize", src, str(dst)]
            subprocess.run([*cmd, str(MANIFEST[name]["ftype"])], check=True, capture_output=True)
        return dst

    return build


@pytest.mark.parametrize("name", MADE + RANDOM)
def test_every_tensor_dequantises_as_gguf_py(quantised, name):
    path = quantised(name)
    gf = GGUFFile(path)
    types = {i.ggml_type.name for i in gf.tensors.values()}
    want = MANIFEST[name]["tensor_types"] if name in MANIFEST else ["F32", "Q3_K", name[7:]]
    assert types == set(want)
    for t in gguf.GGUFReader(path).tensors:
        expect = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        got = dequantize(gf.raw(t.name), gf.tensors[t.name].ggml_type)
        np.testing.assert_array_equal(got.view(np.uint32), expect.view(np.uint32), t.name)


@pytest.mark.parametrize("name", MADE + RANDOM)
def test_llamacpp_numerics_logits_near_llamacpp(quantised, name):
    ref = np.load(FIXTURES / f"qwen3-{name}.llamacpp.npz")
    m = llamay.load(quantised(name), numerics="llamacpp")
    got = np.asarray(m.logits(ref["tokens"].tolist()))
    worst = max(
        float(np.abs(np.take_along_axis(got, ref["top_ids"], 1) - ref["top_logits"]).max()),
        float(np.abs(got[:, ref["probe_ids"]] - ref["probe_logits"]).max()),
    )
    print(f"{name}: max |llamay - llama.cpp| = {worst:.3g} (tolerance {TOLERANCE})")
    assert worst <= TOLERANCE
    gap = ref["top_logits"][:, 0] - ref["top_logits"][:, 1]
    sure = gap > TOLERANCE
    np.testing.assert_array_equal(got.argmax(1)[sure], ref["top_ids"][sure, 0])
