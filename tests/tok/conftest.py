"""Fixtures for the tokenizer tests: real-model tokenizers (built once per session) and the
llama.cpp goldens.

Real models come from `$LLAMAY_TEST_MODELS_DIR` when that is set (the file must be there,
else it is missing: a skip, or a failure in CI), otherwise from the store fixtures of
`tests/conftest.py`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from fixture_data import missing

MODEL_FILES = {
    "smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
}
GOLDEN_FILES = {
    "smollm2": "smollm2-135m-instruct-q4_1.json",
    "gemma3": "gemma-3-270m-q4_k_m.json",
}


def _model_path(request, name: str) -> Path:
    env = os.environ.get("LLAMAY_TEST_MODELS_DIR")
    if env:
        path = Path(env) / MODEL_FILES[name]
        if not path.is_file():
            missing(f"{path} is absent (LLAMAY_TEST_MODELS_DIR={env})")
        return path
    return request.getfixturevalue(f"{name}_path")


def _tokenizer(request, name: str):
    from llamay.gguf import open_gguf
    from llamay.tok import Tokenizer

    return Tokenizer.from_metadata(open_gguf(_model_path(request, name)).metadata).warm()


@pytest.fixture(scope="session")
def smollm2_tok(request):
    return _tokenizer(request, "smollm2")


@pytest.fixture(scope="session")
def gemma3_tok(request):
    return _tokenizer(request, "gemma3")


def _subset_tokenizer(request, name: str):
    """A tokenizer that never builds its full engine: every `encode` runs on a per-text
    subset engine (`Tokenizer`'s ski-rental path with an unlimited budget)."""
    from llamay.gguf import open_gguf
    from llamay.tok import Tokenizer

    tok = Tokenizer.from_metadata(open_gguf(_model_path(request, name)).metadata)
    tok._subset_budget = 10**12
    return tok


@pytest.fixture(scope="session")
def smollm2_subset_tok(request):
    return _subset_tokenizer(request, "smollm2")


@pytest.fixture(scope="session")
def gemma3_subset_tok(request):
    return _subset_tokenizer(request, "gemma3")


@pytest.fixture(scope="session")
def llamacpp_goldens(fixtures_dir) -> dict[str, dict]:
    d = fixtures_dir / "llamacpp"
    return {name: json.loads((d / f).read_text()) for name, f in GOLDEN_FILES.items()}
