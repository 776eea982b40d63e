"""Process-wide JAX settings llamay relies on."""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

import jax

_done = False

# The jax releases llamay is tested on, as pyproject.toml requires them: the whole suite on
# the newest, the quick suites on 0.11.2 (`make test-jax011`: what jax-mps needs and CUDA 13
# images ship). No API llamay uses differs between them (checked against both releases); a
# difference found later belongs here, behind one name, not in version checks at call sites.
JAX_OLDEST = (0, 11, 2)
JAX_BEFORE = (0, 12, 2)


def _release(version: str) -> tuple[int, ...]:
    """The leading numbers of a version string: "0.12.0.1" -> (0, 12, 0, 1)."""
    m = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(p) for p in m.group().split(".")) if m else ()


def untested_jax(version: str = jax.__version__) -> str | None:
    """Why `version` of jax is outside the tested range, or None when it is inside."""
    if JAX_OLDEST <= _release(version) < JAX_BEFORE:
        return None
    oldest, before = (".".join(map(str, v)) for v in (JAX_OLDEST, JAX_BEFORE))
    return (
        f"llamay is tested on jax >={oldest},<{before}; this is jax {version} "
        f"(pip install 'jax>={oldest},<{before}' for a tested one)"
    )


# pip keeps the range; this names it for a jax that pip did not choose (a preinstalled
# image, a checkout on PYTHONPATH, --no-deps)
if (_why := untested_jax()) is not None:
    warnings.warn(_why, RuntimeWarning, stacklevel=2)


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


def physical_cores() -> int:
    """The cores this process may run on, SMT siblings counted once: llama.cpp's default
    thread count on Linux (common_cpu_get_num_math); the CPU count elsewhere."""
    try:
        cpus = os.sched_getaffinity(0)
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
    cores = set()
    for cpu in cpus:
        topo = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
        try:
            with open(topo + "physical_package_id") as f, open(topo + "core_id") as g:
                cores.add((f.read().strip(), g.read().strip()))
        except OSError:
            cores.add(("cpu", str(cpu)))
    return max(1, len(cores))
