"""Shared by the packaging tests: one wheel + sdist build per test session."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
INSTALL_SH = REPO / "packaging" / "install.sh"
INSTALL_PS1 = REPO / "packaging" / "install.ps1"
CHECK_SCRIPTS = REPO / "packaging" / "check_scripts.sh"


@functools.cache
def built_dist() -> tuple[Path, Path]:
    """(wheel, sdist) of the checkout, built once with `python -m build` (as `make build`)."""
    out = Path(tempfile.mkdtemp(prefix="llamay-dist-"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    r = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(REPO)],
        capture_output=True,
        text=True,
        cwd=out,
        timeout=600,
    )
    assert r.returncode == 0, f"python -m build failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    (wheel,) = out.glob("llamay-*.whl")
    (sdist,) = out.glob("llamay-*.tar.gz")
    return wheel, sdist


def base_python() -> str:
    """The interpreter this test environment's venv was made from."""
    return getattr(sys, "_base_executable", sys.executable)


def clean_env(**extra: str) -> dict[str, str]:
    """The environment minus anything that would point pip or Python at this venv."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")
    }
    env.update(extra)
    return env
