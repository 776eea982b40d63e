"""Fixtures of the eval tests: loaded models shared across the modules."""

from __future__ import annotations

import numpy as np
import pytest
from fixture_data import tiny_model_file

import llamay


@pytest.fixture(scope="session")
def tiny_llama_model():
    return llamay.load(tiny_model_file("llama"))


@pytest.fixture(scope="session")
def smollm2_model(smollm2_path):
    return llamay.load(smollm2_path)


def _log_softmax(logits):
    x = np.asarray(logits, np.float64)
    mx = x.max(-1, keepdims=True)
    return x - mx - np.log(np.exp(x - mx).sum(-1, keepdims=True))


@pytest.fixture(scope="session")
def log_softmax():
    """log-softmax over the last axis, in float64."""
    return _log_softmax
