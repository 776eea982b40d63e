"""The jax range and the accelerator extras declared in pyproject.toml.

- The base `jax`/`jaxlib` range admits the jax running these tests: CI runs them on the
  newest jax (`make test`) and on 0.11.2 in `.venv-jax011` (`make test-jax011`).
- `[cuda]` and `[cuda13]` ask for jax's own `cuda12` and `cuda13` extras.
- `[metal]` is jax-mps on macOS arm64 only (an environment marker), and pip resolves it for
  that target to a 0.11 jax. pip's `--platform` picks wheels but evaluates markers for the
  machine it runs on, so the Mac check evaluates the marker for macOS arm64 with
  `packaging` and hands pip the requirement the marker selects.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from importlib.metadata import version

import pytest
from packaging.requirements import Requirement
from packaging.version import Version
from pkgtestlib import REPO, clean_env

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
EXTRAS = PROJECT["optional-dependencies"]

APPLE_SILICON = {"sys_platform": "darwin", "platform_machine": "arm64"}
OTHER_MACHINES = [
    {"sys_platform": "linux", "platform_machine": "x86_64"},
    {"sys_platform": "linux", "platform_machine": "aarch64"},
    {"sys_platform": "darwin", "platform_machine": "x86_64"},  # Intel Macs: no jax-mps wheel
    {"sys_platform": "win32", "platform_machine": "AMD64"},
]
MAC_WHEELS = ["--platform", "macosx_14_0_arm64", "--python-version", "3.12"]


def requirements(reqs: list[str]) -> dict[str, Requirement]:
    return {Requirement(r).name: Requirement(r) for r in reqs}


@pytest.mark.parametrize("name", ["jax", "jaxlib"])
def test_the_jax_range_admits_the_running_jax(name):
    req = requirements(PROJECT["dependencies"])[name]
    running = version(name)
    assert req.specifier.contains(running), f"{name} {running} is outside {req}"


@pytest.mark.parametrize(("extra", "jax_extra"), [("cuda", "cuda12"), ("cuda13", "cuda13")])
def test_cuda_extras_ask_for_jax_cuda_wheels_in_the_base_range(extra, jax_extra):
    (req,) = [Requirement(r) for r in EXTRAS[extra]]
    base = requirements(PROJECT["dependencies"])["jax"]
    assert req.name == "jax" and req.extras == {jax_extra}
    assert req.specifier == base.specifier, f"[{extra}] {req} vs the base {base}"


def test_metal_extra_is_jax_mps_on_apple_silicon_only():
    (req,) = [Requirement(r) for r in EXTRAS["metal"]]
    assert req.name == "jax-mps"
    assert req.marker is not None and req.marker.evaluate(APPLE_SILICON)
    for env in OTHER_MACHINES:
        assert not req.marker.evaluate(env), env


def pip_dry_run(report, *args: str) -> dict[str, str]:
    """{name: version} of what `pip install --dry-run ARGS` would install (report: a path)."""
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
    cmd += ["--report", str(report), *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=clean_env())
    if r.returncode != 0:
        text = r.stdout + r.stderr
        if re.search(r"connection|NewConnectionError|Network is unreachable", text, re.I):
            pytest.skip(f"no package index answers here: {text.strip().splitlines()[-1]}")
        pytest.fail(f"pip could not resolve {args}:\n{text[-3000:]}")
    installs = json.loads(report.read_text())["install"]
    return {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in installs}


@pytest.mark.slow
def test_metal_extra_resolves_to_jax_mps_and_a_0_11_jax_on_macos_arm64(tmp_path):
    (req,) = [Requirement(r) for r in EXTRAS["metal"]]
    assert req.marker.evaluate(APPLE_SILICON)
    selected = f"{req.name}{req.specifier}"  # what a Mac's pip installs for the extra
    wheels = [*MAC_WHEELS, "--only-binary=:all:", "--target", str(tmp_path / "t")]
    got = pip_dry_run(tmp_path / "mac.json", *wheels, str(REPO), selected)
    assert "jax-mps" in got, got
    jax = Version(got["jax"])
    assert (jax.major, jax.minor) == (0, 11), got
    assert got["jaxlib"] == got["jax"], got


@pytest.mark.slow
def test_metal_extra_changes_nothing_off_apple_silicon(tmp_path):
    """Here (Linux CI) `[metal]` resolves to exactly the plain install: no jax-mps, and
    jax is not held back to the 0.11 that jax-mps needs."""
    (req,) = [Requirement(r) for r in EXTRAS["metal"]]
    if req.marker.evaluate():
        pytest.skip("this machine is Apple silicon: [metal] applies here")
    plain = pip_dry_run(tmp_path / "plain.json", str(REPO))
    metal = pip_dry_run(tmp_path / "metal.json", f"{REPO}[metal]")
    assert "jax-mps" not in metal and metal == plain
