"""llamay.runtime's jax range: the same as pyproject.toml's, and a jax outside it is named."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from llamay import runtime

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def pyproject_jax_range():
    deps = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    (req,) = [Requirement(d) for d in deps if Requirement(d).name == "jax"]
    return req.specifier


@pytest.mark.parametrize(
    "version", ["0.4.38", "0.10.2", "0.11.0", "0.11.1", "0.11.2", "0.12.0", "0.12.0.1",
                "0.12.1", "0.12.2", "0.12.7", "0.13.0", "1.0.0"],
)  # fmt: skip
def test_the_range_is_pyprojects(version):
    assert (runtime.untested_jax(version) is None) == pyproject_jax_range().contains(version)


def test_an_untested_jax_is_named_with_the_range():
    why = runtime.untested_jax("0.11.1")
    assert "jax 0.11.1" in why and ">=0.11.2,<0.12.2" in why


def test_the_running_jax_is_tested():
    assert runtime.untested_jax() is None


def test_importing_with_an_untested_jax_warns():
    code = "import jax; jax.__version__ = '0.10.0'; import llamay.runtime"
    r = subprocess.run(
        [sys.executable, "-W", "always", "-c", code], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert "RuntimeWarning" in r.stderr and "this is jax 0.10.0" in r.stderr
