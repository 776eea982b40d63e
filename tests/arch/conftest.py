"""The tiny reference models of tests/fixtures/tiny (its README documents them)."""

from __future__ import annotations

import numpy as np
import pytest
from fixture_data import tiny_model_file

import llamay

# The README's suggested tolerance against llama.cpp (2-3x its measured llama.cpp-vs-exact
# deviation; llama.cpp rounds activations to int8 blocks and keeps an f16 KV cache).
LLAMACPP_TOL = {
    "llama": 0.5,
    "qwen2": 0.5,
    "qwen3": 1.0,
    "qwen3moe": 0.5,
    "phi3": 0.5,
    "gemma2": 0.5,
    "gemma3": 1.0,
    "olmo2": 0.5,
    "starcoder2": 0.5,
}
TINY_DECODERS = tuple(LLAMACPP_TOL)


class Tiny:
    """One tiny model with its two references, loaded once per test session."""

    _cache: dict[str, Tiny] = {}

    def __init__(self, tiny_dir, name: str):
        self.name = name
        self.model = llamay.load(tiny_model_file(name))
        self.exact = np.load(tiny_dir / f"{name}.exact.npz")
        self.ref = np.load(tiny_dir / f"{name}.llamacpp.npz")
        self._logits: dict[tuple[int, ...], np.ndarray] = {}

    @classmethod
    def get(cls, tiny_dir, name: str) -> Tiny:
        if name not in cls._cache:
            cls._cache[name] = cls(tiny_dir, name)
        return cls._cache[name]

    def logits(self, ids) -> np.ndarray:
        """The model's logits for `ids`, memoised (several tests read the same rows)."""
        key = tuple(int(i) for i in ids)
        if key not in self._logits:
            self._logits[key] = self.model.logits(list(key))
        return self._logits[key]


@pytest.fixture(scope="session")
def tiny_dir(fixtures_dir):
    return fixtures_dir / "tiny"
