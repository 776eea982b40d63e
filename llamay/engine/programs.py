"""Compiled step programs kept on disk, so a second process skips tracing, lowering and
compiling them: a jitted function whose executables persist by what they are built from.

    @persistent_jit(static_argnames=("cfg",), donate_argnames=("kv",))
    def paged_step(cfg, weights, kv, tokens, ...): ...

    logits, kv = paged_step(cfg, weights, kv, tokens, ...)   # as jax.jit's function
    paged_step.prepare(cfg, weights, kv_spec, ...)           # ready, not run: "memory",
                                                             # "disk" or "compiled"

JAX's persistent compilation cache (`llamay.runtime`) is keyed by the lowered program,
so a process still traces and lowers every program before it can look one up: on a
2-core CPU that is most of a server's start. Here a call's key is what the program is
compiled from (the function and its file, its static arguments, the dynamic arguments'
pytree structure, shapes, dtypes, weak types and shardings, JAX's tracing configuration)
plus the process's environment (llamay's own sources, jax/jaxlib and Python versions,
the backend, its devices, the CPU's features, `LLAMAY_*` settings and `XLA_FLAGS`). A
miss lowers and compiles through `jax.jit`, afresh (`_compile`: never an executable
read from JAX's cache), and writes the executable, serialised with
`jax.experimental.serialize_executable` (donation and shardings are part of it), to
`$LLAMAY_CACHE/programs/<key>.prog` (atomic write); a hit in a later process loads it
in tens of milliseconds, and a call in the same process finds it in memory.

Weights are arguments, never constants, so the key holds their shapes and GGUF types
(the pytree's static data), not the file: two files of one architecture and types share
programs, and a different model or numerics is a different key.

An entry that cannot be used (truncated, corrupted, from another format, failing to
deserialise) is logged in one line, removed and rebuilt; never an error. Each file
carries a SHA-256 of its payload, checked before XLA sees a byte. The native CPU
kernels' FFI targets a program calls are registered before it is loaded. Loading an
entry unpickles it: the cache directory is trusted as JAX's own cache is.
`LLAMAY_NO_PROGRAM_CACHE=1` (or `LLAMAY_NO_COMPILE_CACHE=1`) makes these plain
`jax.jit` functions. At most `MAX_BYTES` are kept, least recently used evicted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import hashlib
import inspect
import json
import logging
import os
import pickle
import re
import struct
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from llamay.files import atomic_write_bytes, unlink
from llamay.runtime import cache_root

log = logging.getLogger(__name__)

FORMAT = 1
MAGIC = b"llamay-program\n"
MAX_BYTES = 4 << 30
#: What programs came from in this process: "memory" (already here), "disk" (loaded),
#: "compiled" (built and stored), "unstored" (built, not storable), "rejected" (a bad
#: entry, rebuilt), plus the seconds spent loading and building.
STATS: Counter = Counter()
_PARAM_KINDS = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


_disabled: list[str] = []


def enabled() -> bool:
    return not (
        _disabled
        or os.environ.get("LLAMAY_NO_PROGRAM_CACHE")
        or os.environ.get("LLAMAY_NO_COMPILE_CACHE")
    )


def disable(reason: str) -> None:
    """Turn the program cache off for the rest of this process (once, logged): a model
    sharded over several devices. A compiled executable takes its arguments only where
    it was compiled for them and returns committed arrays, where jax.jit places
    uncommitted ones (a KV pool made on the default device) beside the sharded weights."""
    if not _disabled:
        log.info("program cache off in this process: %s", reason)
        _disabled.append(reason)


def cache_dir() -> Path:
    return cache_root() / "programs"


class _Unkeyable(Exception):
    """An argument with no stable text (an object printed by its address)."""


def persistent_jit(
    fun: Callable | None = None, *, static_argnames=(), donate_argnames=()
) -> Program | Callable[[Callable], Program]:
    """`jax.jit(fun, static_argnames=..., donate_argnames=...)` whose compiled programs
    persist across processes (see the module docstring). `fun`'s parameters must be
    positional-or-keyword (no *args, **kwargs or keyword-only ones)."""

    def wrap(f: Callable) -> Program:
        return Program(f, static_argnames=static_argnames, donate_argnames=donate_argnames)

    return wrap if fun is None else wrap(fun)


class Program:
    """A jitted function with persistent executables (`persistent_jit`). `lower`,
    `trace` and `eval_shape` are jax.jit's."""

    def __init__(self, fun: Callable, *, static_argnames=(), donate_argnames=()):
        static_argnames = tuple(static_argnames)
        self._jit = jax.jit(fun, static_argnames=static_argnames, donate_argnames=donate_argnames)
        functools.update_wrapper(self, fun)
        self.name = f"{fun.__module__}.{fun.__qualname__}"
        try:  # keyed by its own file too: a function outside llamay's sources
            self._file = inspect.getsourcefile(fun)
        except TypeError:
            self._file = None
        params = list(inspect.signature(fun).parameters.values())
        self._plain = any(p.kind not in _PARAM_KINDS for p in params)
        self._names = [p.name for p in params]
        self._defaults = [p.default for p in params]
        self._static = [i for i, p in enumerate(params) if p.name in static_argnames]
        self._dynamic = [i for i, p in enumerate(params) if p.name not in static_argnames]
        self._ready: dict[Any, jax.stages.Compiled] = {}
        self._locks: dict[Any, threading.Lock] = {}
        self._lock = threading.Lock()

    def lower(self, *args, **kwargs):
        return self._jit.lower(*args, **kwargs)

    def trace(self, *args, **kwargs):
        return self._jit.trace(*args, **kwargs)

    def eval_shape(self, *args, **kwargs):
        return self._jit.eval_shape(*args, **kwargs)

    def disk_key(self, *args, **kwargs) -> str:
        """The hex key these arguments' program is kept on disk under."""
        full = self._full(args, kwargs)
        return self._disk_key(self._key(full, [full[i] for i in self._dynamic]))

    def _cache_size(self) -> int:
        """Programs held in this process (as jax.jit's own `_cache_size`)."""
        return len(self._ready) + self._jit._cache_size()

    def clear_cache(self) -> None:
        """Forget the programs held in memory (the disk keeps its copies)."""
        with self._lock:
            self._ready.clear()
            self._locks.clear()
        self._jit.clear_cache()

    def __call__(self, *args, **kwargs):
        if self._plain or not enabled() or not _trace_state_clean():
            return self._jit(*args, **kwargs)  # off, or called inside another trace
        full = self._full(args, kwargs)
        dyn = [full[i] for i in self._dynamic]
        key = self._key(full, dyn)
        compiled = self._ready.get(key)
        if compiled is None:
            compiled = self._obtain(key, full, dyn)[0]
            if compiled is None:
                return self._jit(*args, **kwargs)
        return compiled(*dyn)

    def prepare(self, *args, **kwargs) -> str:
        """Make the program for these arguments ready without running it (arrays or
        `jax.ShapeDtypeStruct`s with their shardings): "memory" if it already was,
        "disk" if loaded, "compiled" if built here (stored when it can be), "jit" when
        the program cache is off (the arguments are lowered and compiled, which fills
        only JAX's caches)."""
        if self._plain or not enabled():
            self._jit.lower(*args, **kwargs).compile()
            return "jit"
        full = self._full(args, kwargs)
        dyn = [full[i] for i in self._dynamic]
        key = self._key(full, dyn)
        if key in self._ready:
            STATS["memory"] += 1
            return "memory"
        return self._obtain(key, full, dyn)[1]

    # -- keys --------------------------------------------------------------------------

    def _full(self, args: tuple, kwargs: dict) -> list:
        if len(args) > len(self._names):
            raise TypeError(f"{self.name} takes {len(self._names)} arguments, got {len(args)}")
        full = list(args) + self._defaults[len(args) :]
        for k, v in kwargs.items():
            try:
                full[self._names.index(k)] = v
            except ValueError:
                raise TypeError(f"{self.name} got an unexpected argument {k!r}") from None
        missing = [
            n for n, v in zip(self._names, full, strict=True) if v is inspect.Parameter.empty
        ]
        if missing:
            raise TypeError(f"{self.name} is missing arguments: {', '.join(missing)}")
        return full

    def _key(self, full: list, dyn: list):
        leaves, tree = jax.tree_util.tree_flatten(dyn)
        statics = tuple(full[i] for i in self._static)
        return (statics, tree, tuple(_aval(x) for x in leaves), _trace_context())

    def _disk_key(self, key) -> str:
        statics, tree, avals, context = key
        text = "\n".join(
            [
                f"format {FORMAT}",
                self.name,
                _file_digest(self._file),
                _stable(statics),
                _checked(str(tree)),
                _stable(avals),
                _context_text(context),
                _environment(),
                _settings(),
            ]
        )
        return hashlib.sha256(text.encode()).hexdigest()

    # -- building and loading ----------------------------------------------------------

    def _obtain(self, key, full: list, dyn: list) -> tuple[jax.stages.Compiled | None, str]:
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:  # one thread builds or loads a program; the others wait for it
            if key in self._ready:
                STATS["memory"] += 1
                return self._ready[key], "memory"
            try:
                digest = self._disk_key(key)
            except _Unkeyable as exc:
                log.info("%s: not kept on disk (%s)", self.name, exc)
                digest = None
            path = cache_dir() / f"{digest[:40]}.prog" if digest else None
            if path is not None and path.exists():
                t0 = time.perf_counter()
                compiled = _load(path, digest, dyn)
                if compiled is not None:
                    STATS["disk"] += 1
                    STATS["load_s"] += time.perf_counter() - t0
                    self._ready[key] = compiled
                    return compiled, "disk"
                STATS["rejected"] += 1
            t0 = time.perf_counter()
            specs = list(full)
            for i in self._dynamic:
                specs[i] = jax.tree_util.tree_map(_spec, full[i])
            compiled, fresh = _compile(self._jit.lower(*specs))
            STATS["build_s"] += time.perf_counter() - t0
            stored = path is not None and fresh and _store(path, digest, self.name, compiled)
            STATS["compiled" if stored else "unstored"] += 1
            self._ready[key] = compiled
            return compiled, "compiled"


#: A debug option at its default value, which JAX's cache key counts (it leaves out
#: most dump options): our builds get JAX cache keys of their own, never those of the
#: same program compiled by plain jit.
_OWN_KEY = {"xla_dump_large_constants": False}
_hits = threading.local()


def _count_hit(event: str, **_) -> None:
    if event == "/jax/compilation_cache/cache_hits":
        _hits.n = getattr(_hits, "n", 0) + 1


jax.monitoring.register_event_listener(_count_hit)


def _compile(lowered) -> tuple[jax.stages.Compiled, bool]:
    """A fresh XLA compile of `lowered`: never an executable read from JAX's persistent
    cache (XLA:CPU re-serialises one of those without all its kernels: "Function
    wrapped_iota not found" when the copy runs), and not written there either (this
    cache keeps it). Returns (compiled, whether it may be stored)."""
    before = getattr(_hits, "n", 0)
    try:
        from jax._src import config

        no_write = config.persistent_cache_min_compile_time_secs(float("inf"))
    except Exception:  # noqa: BLE001 - an internal that may move: writes are harmless
        no_write = contextlib.nullcontext()
    with no_write:
        compiled = lowered.compile(_OWN_KEY)
    return compiled, getattr(_hits, "n", 0) == before


def abstract(tree):
    """`tree` with its jax arrays as `jax.ShapeDtypeStruct`s (shape, dtype, weak type,
    sharding): what `Program.prepare` needs of them, kept however the arrays are used."""
    return jax.tree_util.tree_map(_spec, tree)


def _spec(x):
    """A jax array leaf as its shape, dtype and sharding (lowering reads no values; a
    donated or deleted array has those still); anything else as it is."""
    if isinstance(x, jax.Array):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding, weak_type=x.weak_type)
    return x


def _aval(x):
    try:  # jax arrays and ShapeDtypeStructs (no isinstance: jax.Array's is slow)
        return (x.shape, x.dtype, x.weak_type, x.sharding)
    except AttributeError:
        pass
    if isinstance(x, np.ndarray | np.generic):
        return (x.shape, x.dtype, False, None)
    return (type(x),)  # a Python scalar: weakly typed, its value not in the program


def _trace_state_clean() -> bool:
    try:
        from jax._src import core

        return core.trace_state_clean()
    except Exception:  # noqa: BLE001 - an internal that may move: assume a top-level call
        return True


def _trace_context():
    try:
        from jax._src import config

        return config.trace_context()
    except Exception:  # noqa: BLE001 - an internal that may move: the flags that matter
        return (jax.config.jax_enable_x64, jax.config.jax_default_matmul_precision)


def _context_text(context) -> str:
    """JAX's tracing configuration as text; an object without one (the empty AxisEnv of
    a top-level call) by its type."""
    out = []
    for v in context:
        try:
            out.append(_stable(v))
        except _Unkeyable:
            out.append(type(v).__qualname__)
    return ",".join(out)


_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def _checked(text: str) -> str:
    if _ADDRESS.search(text):
        raise _Unkeyable(f"no stable text: {text[:120]}")
    return text


def _stable(obj) -> str:
    """Text that names `obj` the same in every process (or _Unkeyable)."""
    if obj is None or isinstance(obj, bool | int | float | complex | str | bytes):
        return repr(obj)
    if isinstance(obj, enum.Enum):
        return f"{type(obj).__qualname__}.{obj.name}"
    if isinstance(obj, type):
        return f"{obj.__module__}.{obj.__qualname__}"
    if isinstance(obj, np.ndarray | np.generic):
        a = np.asarray(obj)
        return f"array({a.dtype},{a.shape},{hashlib.sha256(a.tobytes()).hexdigest()[:16]})"
    if isinstance(obj, np.dtype):
        return f"dtype({obj})"
    if isinstance(obj, list | tuple):
        return type(obj).__name__ + "(" + ",".join(_stable(v) for v in obj) + ")"
    if isinstance(obj, dict):
        return (
            "{"
            + ",".join(f"{_stable(k)}:{_stable(v)}" for k, v in sorted(obj.items(), key=repr))
            + "}"
        )
    if isinstance(obj, frozenset | set):
        return "{" + ",".join(sorted(_stable(v) for v in obj)) + "}"
    if dataclasses.is_dataclass(obj):
        fields = ",".join(
            f"{f.name}={_stable(getattr(obj, f.name))}" for f in dataclasses.fields(obj)
        )
        return f"{type(obj).__module__}.{type(obj).__qualname__}({fields})"
    return _checked(f"{type(obj).__qualname__}:{obj!r}")


def _file_digest(path: str | None) -> str:
    """The bytes of the file a function is defined in (llamay's are in `_environment`
    already; an outside one's imports are not followed)."""
    if path is None:
        raise _Unkeyable("no source file")
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError as exc:
        raise _Unkeyable(f"source file unreadable: {exc}") from None


#: llamay's rooms that no program is traced from (HTTP, storage): edits there keep keys.
_UNTRACED = frozenset({"serve", "store", "ollama"})
_SOURCES = frozenset({".py", ".c", ".cc", ".cpp", ".h", ".hpp"})


@functools.cache
def _environment() -> str:
    """The process's part of every key."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if p.suffix in _SOURCES and rel.parts[0] not in _UNTRACED and p.is_file():
            h.update(str(rel).encode() + b"\0" + p.read_bytes() + b"\0")
    devices = jax.devices()
    client = devices[0].client
    from jax._src.lib import version_str as jaxlib_version

    return "\n".join(
        [
            f"llamay sources {h.hexdigest()}",
            f"jax {jax.__version__} jaxlib {jaxlib_version} python {sys.version}",
            f"backend {client.platform} {client.platform_version} processes {jax.process_count()}",
            "devices " + ",".join(f"{d.id}:{d.device_kind}" for d in devices),
            f"cpu {_cpu_features()}",
        ]
    )


def _settings() -> str:
    """The environment's settings that choose kernels at trace time (read at each build:
    a test may change them between two)."""
    env = sorted(
        (k, v)
        for k, v in os.environ.items()
        if (k.startswith("LLAMAY_") and k not in ("LLAMAY_CACHE", "LLAMAY_HOME"))
        or k in ("XLA_FLAGS", "JAX_PLATFORMS")
    )
    return f"env {env}"


def _cpu_features() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features", "model name")):
                return " ".join(sorted(set(line.split(":", 1)[1].split())))
    except OSError:
        pass
    import platform

    return f"{platform.machine()} {platform.processor()}"


# -- the files -------------------------------------------------------------------------


def _store(path: Path, digest: str, name: str, compiled: jax.stages.Compiled) -> bool:
    """Write `compiled` to `path`; False (logged) when it cannot be serialised."""
    from jax.experimental import serialize_executable

    try:
        payload, in_tree, out_tree = serialize_executable.serialize(compiled)
        body = pickle.dumps((payload, in_tree, out_tree), protocol=pickle.HIGHEST_PROTOCOL)
        unloaded = compiled._executable._unloaded_executable
        if unloaded.host_callbacks:
            raise ValueError("it calls back into Python")
        devices = [d.id for d in unloaded.device_list]  # in the program's order
        targets = sorted(set(re.findall(r'custom_call_target="([^"]+)"', compiled.as_text() or "")))
    except Exception as exc:  # noqa: BLE001 - kept in memory only; the process goes on
        log.info("%s: the program cannot be kept on disk (%s: %s)", name, type(exc).__name__, exc)
        return False
    header = json.dumps(
        {
            "format": FORMAT,
            "key": digest,
            "function": name,
            "devices": devices,
            "targets": targets,
            "sha256": hashlib.sha256(body).hexdigest(),
            "jax": jax.__version__,
        }
    ).encode()
    try:
        atomic_write_bytes(path, MAGIC + struct.pack("<Q", len(header)) + header + body)
    except OSError as exc:
        log.warning("cannot write the program cache entry %s: %s", path, exc)
        return False
    _evict(path.parent)
    return True


def _load(path: Path, digest: str, dyn: list) -> jax.stages.Compiled | None:
    """The program in `path`, or None (logged once, the file removed) when it cannot be
    used: a wrong magic, format or key, a payload whose digest differs, a pytree that is
    not the call's, or an executable that fails to load."""
    try:
        data = path.read_bytes()
        if not data.startswith(MAGIC):
            raise ValueError("not a program file")
        at = len(MAGIC)
        (n,) = struct.unpack_from("<Q", data, at)
        header = json.loads(data[at + 8 : at + 8 + n])
        body = data[at + 8 + n :]
        if header.get("format") != FORMAT or header.get("key") != digest:
            raise ValueError(f"format {header.get('format')} key {str(header.get('key'))[:12]}")
        if hashlib.sha256(body).hexdigest() != header.get("sha256"):
            raise ValueError("payload digest differs (truncated or corrupted)")
        payload, in_tree, out_tree = pickle.loads(body)
        if in_tree != jax.tree_util.tree_structure((tuple(dyn), {})):
            raise ValueError("pytree differs from the call's")
        _register_targets(header.get("targets", []))
        by_id = {d.id: d for d in jax.devices()}
        devices = [by_id[i] for i in header["devices"]]
        from jax.experimental import serialize_executable

        compiled = serialize_executable.deserialize_and_load(
            payload, in_tree, out_tree, backend=devices[0].client, execution_devices=devices
        )
    except Exception as exc:  # noqa: BLE001 - a bad entry is rebuilt, never fatal
        log.warning(
            "ignoring the program cache entry %s (%s: %s); rebuilding it",
            path.name,
            type(exc).__name__,
            exc,
        )
        unlink(path)
        return None
    try:
        os.utime(path)  # recently used: evicted last
    except OSError:
        pass
    return compiled


def _register_targets(targets: list[str]) -> None:
    """Register the native CPU kernels' FFI targets that `targets` names (a program read
    from disk is not traced, and tracing is where the kernels register themselves)."""
    if not any(t.startswith("llamay_") for t in targets):
        return
    from llamay.kernels_cpu.build import HANDLERS, VARIANTS
    from llamay.kernels_cpu.build import targets as register

    for variant in VARIANTS.values():
        if any(variant.prefix + h in targets for h in HANDLERS):
            if register(variant.name) is None:
                raise RuntimeError(f"the native CPU kernels ({variant.name}) are not available")


def _evict(directory: Path) -> None:
    """Remove the least recently used entries while the directory holds over MAX_BYTES."""
    try:
        entries = [
            (e.stat().st_mtime, e.stat().st_size, e)
            for e in os.scandir(directory)
            if e.name.endswith(".prog")
        ]
    except OSError:
        return
    total = sum(s for _, s, _ in entries)
    for _, size, e in sorted(entries, key=lambda t: t[0]):
        if total <= MAX_BYTES:
            return
        unlink(Path(e.path))
        total -= size
