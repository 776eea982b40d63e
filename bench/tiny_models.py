"""The test suite's tiny random models for benchmarks: rebuilt byte for byte into
`$LLAMAY_CACHE/fixtures/tiny/` on first use (tests/fixture_data.py, tests/fixtures/tiny/)."""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"


def tiny_model(name: str) -> Path:
    """`llama`, `qwen3`, ... (tests/fixtures/tiny/README.md lists them)."""
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    from fixture_data import tiny_model_file

    return tiny_model_file(name)
