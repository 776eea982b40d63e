"""Shared test fixtures: the reference models (through the store) and the oracle data.

The model fixtures resolve `smollm2:135m` / `gemma3:270m` through `llamay.store` using the
default store (`$LLAMAY_HOME`, default `~/.llamay`) and wheel cache (`$LLAMAY_CACHE`, default
`~/.cache/llamay`), so CI can cache them outside the clone. The goldens live in
`tests/fixtures/`, the tiny models are rebuilt into the cache on first use
(`tests/fixture_data.py`). What cannot be found or fetched skips the test, or fails it in CI
(`CI=true` or `--require-fixtures`). The run ends with one line counting skips by reason.
"""

from __future__ import annotations

import collections
import json
import os
from pathlib import Path

import pytest
from fixture_data import FIXTURES, missing, require_fixtures
from skip_counts import format_skips

REPO_ROOT = Path(__file__).resolve().parents[1]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--require-fixtures",
        action="store_true",
        help="a missing fixture or reference model fails the test instead of skipping it "
        "(also with CI=true); make test passes it",
    )


def pytest_configure(config: pytest.Config) -> None:
    require_fixtures(config.getoption("--require-fixtures"))


def skip_reason(report: pytest.TestReport) -> str:
    """The reason a skipped test gave, without pytest's `Skipped: ` prefix."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    reasons = collections.Counter(
        skip_reason(r) for r in terminalreporter.stats.get("skipped", []) if r.skipped
    )
    if log := os.environ.get("LLAMAY_SKIP_LOG"):  # scripts/run-tests.sh adds up all files
        with open(log, "a") as f:
            f.write(json.dumps(dict(reasons)) + "\n")
    terminalreporter.write_line(format_skips(reasons))


def _model_or_skip(name: str) -> Path:
    from llamay.errors import FetchError
    from llamay.store import resolve

    try:
        return resolve(name)
    except FetchError as e:
        missing(f"reference model {name} is not available and cannot be fetched: {e}")


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
    """`tests/fixtures` (goldens from llama.cpp / transformers / numpy, JSON-Schema suite)."""
    if not FIXTURES.is_dir():
        missing(f"the fixtures directory {FIXTURES} is absent")
    return FIXTURES
