"""Lets lm-eval's own `lm_eval` command find the models declared as `lm_eval.models`
entry points (llamay's: `llamay = llamay.eval.lm_eval_adapter:LlamayLM`).

lm-eval 0.4.13 has no plugin discovery: its registry knows the models listed in
`lm_eval/models/__init__.py` plus whatever the running program registers, and its
command line imports nothing else. The registry does accept lazy "module:attr"
placeholders, so what is missing is a few lines run in every process that imports lm-eval.
They come from a `.pth` file in site-packages (`install_pth`; `llamay eval lm-eval-plugin`
writes it): at interpreter start Python runs its one line, which loads this file by path
(stdlib only: no JAX, no lm-eval) and calls `install()`. That puts a finder on
`sys.meta_path` that waits for `lm_eval.api.registry`; once that module has run, it lists
lm-eval's built-in models (as lm-eval itself does on first lookup) and registers each
entry point as a placeholder, so nothing of llamay is imported until `--model llamay`.

This file must stay stdlib-only and import nothing from llamay: it runs at every start.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.metadata
import sys
import sysconfig
from pathlib import Path

GROUP = "lm_eval.models"
REGISTRY_MODULE = "lm_eval.api.registry"
PTH_NAME = "llamay_lm_eval.pth"


def register_entry_points(registry_module) -> list[str]:
    """Register every `lm_eval.models` entry point in lm-eval's model registry (as a
    lazy placeholder); returns the names added."""
    # lm-eval lists its built-in models only when the registry is empty at the first
    # lookup; adding ours first would hide them, so list them now.
    importlib.import_module("lm_eval.models")
    registry = registry_module.model_registry
    added = []
    for ep in importlib.metadata.entry_points(group=GROUP):
        if ep.name not in registry:
            registry.register(ep.name, target=ep.value)
            added.append(ep.name)
    return added


class _Loader(importlib.abc.Loader):
    """The registry module's own loader, then `register_entry_points`."""

    def __init__(self, inner) -> None:
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module) -> None:
        self._inner.exec_module(module)
        register_entry_points(module)

    def __getattr__(self, name):  # get_source, get_filename, ... of the real loader
        return getattr(self._inner, name)


class _RegistryFinder(importlib.abc.MetaPathFinder):
    # Marks instances across copies of this module (each .pth load makes its own class).
    llamay_lm_eval_hook = True

    def find_spec(self, name, path, target=None):
        if name != REGISTRY_MODULE:
            return None
        for finder in sys.meta_path:
            if _is_hook(finder) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader)
                return spec
        return None


def _is_hook(finder) -> bool:
    return getattr(finder, "llamay_lm_eval_hook", False) is True


def install() -> None:
    """Register the entry points when lm-eval's registry is imported (now, if it is)."""
    if REGISTRY_MODULE in sys.modules:
        register_entry_points(sys.modules[REGISTRY_MODULE])
    elif not any(_is_hook(f) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegistryFinder())


def pth_line(hook_file: Path | None = None) -> str:
    """The `.pth` line: load this file by path and `install()`; nothing once it is gone
    (llamay uninstalled), so Python never reports a broken line."""
    p = str(Path(hook_file or __file__).resolve())
    return (
        f"import os, importlib.util as u; p = {p!r}; "
        "s = os.path.exists(p) and u.spec_from_file_location('_llamay_lm_eval_hook', p); "
        "m = s and u.module_from_spec(s); s and s.loader.exec_module(m); m and m.install()\n"
    )


def site_packages() -> Path:
    """This interpreter's site-packages (purelib)."""
    return Path(sysconfig.get_paths()["purelib"])


def install_pth(site_dir: Path | None = None) -> Path:
    """Write the `.pth` file into `site_dir` (default: this interpreter's site-packages)."""
    path = Path(site_dir or site_packages()) / PTH_NAME
    path.write_text(pth_line())
    return path


def remove_pth(site_dir: Path | None = None) -> Path | None:
    """Remove the `.pth` file; its path, or None if there was none."""
    path = Path(site_dir or site_packages()) / PTH_NAME
    if not path.exists():
        return None
    path.unlink()
    return path
