"""Process-wide JAX settings llamay relies on."""

from __future__ import annotations

import os
from pathlib import Path

import jax

_done = False


def cache_root() -> Path:
    return Path(os.environ.get("LLAMAY_CACHE", Path.home() / ".cache" / "llamay"))


def enable_compilation_cache() -> None:
    """Persist compiled executables (`~/.cache/llamay/jax`) so a second process starts fast."""
    global _done
    if _done or os.environ.get("LLAMAY_NO_COMPILE_CACHE"):
        return
    path = cache_root() / "jax"
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    _done = True
