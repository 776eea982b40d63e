"""pyproject lists llamay's packages by hand (the CLI package `llamay_cli` lives in cli/,
which `packages.find` cannot map): every package folder on disk must be in the list, or
the wheel ships without it."""

from __future__ import annotations

import tomllib
import zipfile

import pytest
from pkgtestlib import REPO, built_dist


def _setuptools() -> dict:
    with open(REPO / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]


def _package_folders(top: str, name: str) -> set[str]:
    root = REPO / top
    return {
        ".".join([name, *init.parent.relative_to(root).parts])
        for init in root.rglob("__init__.py")
        if "__pycache__" not in init.parts
    }


def test_every_package_folder_is_listed():
    cfg = _setuptools()
    on_disk = _package_folders("llamay", "llamay") | _package_folders("cli", "llamay_cli")
    listed = set(cfg["packages"])
    assert on_disk - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    assert listed - on_disk == set(), "listed in pyproject.toml but no such package folder"


def test_cli_package_maps_to_cli_folder():
    assert _setuptools()["package-dir"] == {"llamay_cli": "cli"}
    assert (REPO / "cli" / "main.py").is_file()


@pytest.mark.slow
def test_wheel_ships_the_cli_and_the_native_kernel_sources():
    """Built on the user's machine, the native kernels need their C++ sources in the wheel."""
    with zipfile.ZipFile(built_dist()[0]) as z:
        names = set(z.namelist())
    assert {"llamay_cli/main.py", "llamay_cli/store_cmds.py"} <= names
    sources = {
        p.relative_to(REPO).as_posix()
        for p in (REPO / "llamay" / "kernels_cpu" / "src").iterdir()
        if p.suffix in (".cc", ".h")
    }
    assert sources and sources <= names, sorted(sources - names)
