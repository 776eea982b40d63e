"""Process-wide JAX settings llamay relies on."""

from __future__ import annotations

import os
from pathlib import Path

import jax

_done = False


def cache_root() -> Path:
    return Path(os.environ.get("LLAMAY_CACHE", Path.home() / ".cache" / "llamay"))


# A bounded cache also makes JAX guard every read and write with a file lock: without one
# it writes entries in place, and another process reading a half-written executable aborts.
COMPILE_CACHE_MAX_BYTES = 4 << 30


def enable_compilation_cache() -> None:
    """Persist compiled executables (`~/.cache/llamay/jax`, at most 4 GiB, least recently
    used evicted) so a second process starts fast; safe with several processes at once."""
    global _done
    if _done or os.environ.get("LLAMAY_NO_COMPILE_CACHE"):
        return
    path = cache_root() / "jax"
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    # Every program, however quick to compile: reading a small one back (~3 ms) beats
    # compiling it (10-90 ms on CPU), and it lets `llamay warmup` leave nothing to compile.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    jax.config.update("jax_compilation_cache_max_size", COMPILE_CACHE_MAX_BYTES)
    _done = True
