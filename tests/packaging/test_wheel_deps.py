"""The built wheel: its base install pulls no GPU packages (no nvidia-*, jax-cuda*, libtpu),
the way the seed checks that a GPU binary links no driver; the `cuda` and `tpu` extras name
them. Checked in the wheel's metadata, and by resolving the base install with pip against
the configured index (skipped when no index answers)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser

import pytest
from pkgtestlib import built_dist, clean_env

# building the wheel and resolving its dependencies take tens of seconds
pytestmark = pytest.mark.slow

GPU_PACKAGE = re.compile(r"^(nvidia-.*|jax-cuda.*|jax_cuda.*|jaxlib-cuda.*|libtpu.*|jax-tpu.*)$")
GPU_EXTRA = re.compile(r"\[[^\]]*(cuda|tpu|gpu)[^\]]*\]")


def metadata(wheel) -> dict:
    with zipfile.ZipFile(wheel) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        return Parser().parsestr(z.read(name).decode())


def split(reqs: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """(base requirements, {extra: requirements})."""
    base, extras = [], {}
    for r in reqs:
        m = re.search(r"""extra\s*==\s*["']([^"']+)["']""", r)
        if m:
            extras.setdefault(m.group(1), []).append(r)
        else:
            base.append(r)
    return base, extras


def req_name(r: str) -> str:
    return re.split(r"[\s\[<>=!~;(]", r.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_wheel_and_sdist_are_built():
    wheel, sdist = built_dist()
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    assert "llamay/__init__.py" in names and "llamay_cli/main.py" in names
    assert any(n.endswith("entry_points.txt") for n in names)
    assert not any(n.startswith(("tests/", "site/", "scripts/")) for n in names)
    with tarfile.open(sdist) as t:
        names = t.getnames()
    assert any(n.endswith("/pyproject.toml") for n in names)
    # the suite and its oracle data travel with the source (MANIFEST.in), not its caches
    shipped = ("conftest.py", "fixtures/tiny/recipe.json", "fixtures/llamacpp/corpus.json")
    for part in shipped:
        assert any(n.endswith(f"/tests/{part}") for n in names), part
    assert not any(n.endswith((".gguf", ".pyc")) for n in names)


def test_base_requirements_name_no_gpu_package():
    meta = metadata(built_dist()[0])
    base, extras = split(meta.get_all("Requires-Dist") or [])
    assert base, "the wheel declares no dependencies at all"
    for r in base:
        assert not GPU_PACKAGE.match(req_name(r)), f"base dependency {r!r} is a GPU package"
        assert not GPU_EXTRA.search(r), f"base dependency {r!r} asks for a GPU extra"
    assert "jax" in {req_name(r) for r in base}


def test_cuda_and_tpu_extras_name_the_accelerator_packages():
    meta = metadata(built_dist()[0])
    _, extras = split(meta.get_all("Requires-Dist") or [])
    assert {"cuda", "tpu"} <= set(meta.get_all("Provides-Extra") or [])
    assert any("cuda" in r for r in extras["cuda"]), extras["cuda"]
    assert any("tpu" in r for r in extras["tpu"]), extras["tpu"]


def test_base_install_resolves_no_gpu_package(tmp_path):
    """pip resolves the wheel's base install (everything it would download) into a report."""
    wheel, _ = built_dist()
    report = tmp_path / "report.json"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--report",
            str(report),
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=clean_env(),
    )
    if r.returncode != 0:
        text = r.stdout + r.stderr
        if re.search(
            r"No matching distribution|Could not find a version|connection|"
            r"NewConnectionError|Network is unreachable",
            text,
            re.I,
        ):
            pytest.skip(f"no package index answers here: {text.strip().splitlines()[-1]}")
        pytest.fail(f"pip could not resolve the base install:\n{text[-3000:]}")
    installs = json.loads(report.read_text())["install"]
    names = sorted(i["metadata"]["name"].lower().replace("_", "-") for i in installs)
    assert "jax" in names and "jaxlib" in names, names
    gpu = [n for n in names if GPU_PACKAGE.match(n)]
    assert not gpu, f"the base install would pull GPU packages: {gpu}"


@pytest.mark.parametrize(
    ("requirement", "gpu"),
    [
        ("jax>=0.12", False),
        ("jaxlib>=0.12", False),
        ("numpy>=2.0", False),
        ("jax[cuda12]>=0.12", True),
        ("jax[tpu]>=0.12", True),
        ("nvidia-cublas-cu12>=12", True),
        ("jax-cuda12-plugin[with-cuda]>=0.12", True),
        ("libtpu>=0.0.1", True),
    ],
)
def test_the_check_flags_gpu_requirements(requirement, gpu):
    flagged = bool(GPU_PACKAGE.match(req_name(requirement)) or GPU_EXTRA.search(requirement))
    assert flagged == gpu
