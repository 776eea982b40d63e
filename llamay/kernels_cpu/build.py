"""Build, cache and register the native kernels (C++ XLA FFI handlers in `src/`).

The library is compiled on first use with the system C++ compiler (`LLAMAY_CXX`, else
`CXX`, else `c++`) for this CPU (`-march=native`), cached under the llamay cache
directory (`~/.cache/llamay/kernels_cpu/`) by a hash of the sources, the compiler's
version, the flags and the CPU's features, then loaded with ctypes and registered with
XLA. Two processes building at once: a file lock makes the second wait for the first,
and the library appears by atomic rename, so no one loads a half-written file.

`LLAMAY_CPU_KERNELS` (read on first use):
  unset / "auto"  the native kernels when they build; else the XLA path, with one log
                  line saying why and how to get the fast path
  "native"        the native kernels, or an error if they cannot be built
  "xla"           never build; the XLA path
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import fcntl
import functools
import hashlib
import logging
import os
import platform
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np

from llamay.errors import NativeKernelError
from llamay.runtime import cache_root

ENV = "LLAMAY_CPU_KERNELS"
CHOICES = ("auto", "native", "xla")
SRC = Path(__file__).parent / "src"
# Each source with its own floating-point contraction: ggml's numerics need every f32
# operation as written (explicit fmaf only); the exact kernels want FMAs wherever they fit.
SOURCES = {
    "qmatmul_ggml.cc": ("-ffp-contract=off",),
    "qmatmul_ggml_iq.cc": ("-ffp-contract=off",),
    "qmatmul_ggml_float.cc": ("-ffp-contract=off",),
    "qmatmul_exact.cc": ("-ffp-contract=fast",),
    "paged_attention.cc": ("-ffp-contract=fast",),
    "ggml_attention.cc": ("-ffp-contract=off",),
    "ggml_flash_attention.cc": ("-ffp-contract=off",),
    "ggml_elementwise.cc": ("-ffp-contract=off",),
    "logprobs.cc": ("-ffp-contract=off",),
}
HEADERS = ("blocks.h", "ggml_cache.h", "ggml_float.h", "operands.h", "parallel.h", "vec16.h")
#: Headers written at build time (into the build directory, on the include path).
GENERATED = ("iq_tables.h",)
HANDLERS = (
    "LlamayQmmExact",
    "LlamayQmmExactMulti",
    "LlamayQmmQ8",
    "LlamayQmmQ8K",
    "LlamayQmmGgmlMulti",
    "LlamayQmmGgmlFloat",
    "LlamayQmmIQ",
    "LlamayPagedAttention",
    "LlamayGgmlAttention",
    "LlamayGgmlFlashAttention",
    "LlamayGgmlSwiglu",
    "LlamayGgmlRmsNorm",
    "LlamayGgmlRope",
    "LlamayLogprobArgmax",
    "LlamayArgmax",
    "LlamayTopK",
)

log = logging.getLogger("llamay.kernels_cpu")


@dataclass(frozen=True)
class Variant:
    """One build of the sources: `native` (SIMD for this CPU), `scalar` (no intrinsics
    or vector types: the portable path) or, on x86-64, `avx2` (AVX2, FMA and F16C, no
    AVX-512: the vector paths of most x86 CPUs). The last two are built in tests to check
    they equal the native one on any host. Its handlers are registered as
    `<prefix><handler>`."""

    name: str
    flags: tuple[str, ...]

    @property
    def prefix(self) -> str:
        return "llamay_" if self.name == "native" else f"llamay_{self.name}_"


_COMMON = ("-std=c++17", "-O3", "-fPIC", "-w")
VARIANTS = {
    "native": Variant("native", (*_COMMON, "-march=native")),
    "scalar": Variant("scalar", (*_COMMON, "-march=native", "-DLLAMAY_SCALAR")),
}
if platform.machine().lower() in ("x86_64", "amd64"):
    VARIANTS["avx2"] = Variant("avx2", (*_COMMON, "-march=x86-64-v3"))


def compiler() -> str:
    return os.environ.get("LLAMAY_CXX") or os.environ.get("CXX") or "c++"


def _compiler_version(cxx: str) -> str:
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NativeKernelError(f"no C++ compiler {cxx!r} ({e})") from None
    if out.returncode:
        raise NativeKernelError(f"C++ compiler {cxx!r} failed: {out.stderr.strip()[:200]}")
    return out.stdout


def _cpu_features() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return " ".join(sorted(set(line.split(":", 1)[1].split())))
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()}"


def _c_array(name: str, table: np.ndarray) -> str:
    """An int8 C array (1-D or 2-D) `name` holding `table`."""
    if table.ndim == 1:
        return f"inline constexpr int8_t {name}[{table.size}] = {{{', '.join(map(str, table))}}};\n"
    rows = ",\n".join("  {" + ", ".join(str(int(v)) for v in row) + "}" for row in table)
    dims = f"[{table.shape[0]}][{table.shape[1]}]"
    return f"alignas(64) inline constexpr int8_t {name}{dims} = {{\n{rows}\n}};\n"


@functools.cache
def generated_headers() -> dict[str, str]:
    """`GENERATED`'s text: iq_tables.h, the i-quants' grids, ksigns and the 4-bit
    codebooks as int8 C arrays, from `llamay.quant.iq_tables` (the one source: the
    numpy/jnp dequantisation reads the same tables)."""
    from llamay.quant import iq_tables, iquants

    parts = [
        "// Generated by llamay/kernels_cpu/build.py from llamay/quant/iq_tables.py.\n",
        "#pragma once\n#include <cstdint>\nnamespace llamay {\n",
        _c_array("IQ4NL_VALUES", np.asarray(iq_tables.IQ4NL_VALUES)),
        _c_array("MXFP4_VALUES", np.asarray(iq_tables.MXFP4_VALUES)),
        _c_array("KSIGNS", iquants.ksigns()),
        *(_c_array(name, iquants.grid(name)) for name in iq_tables.GRIDS),
        "}  // namespace llamay\n",
    ]
    return {"iq_tables.h": "".join(parts)}


def _key(cxx: str, variant: Variant) -> str:
    h = hashlib.sha256()
    for name in (*SOURCES, *HEADERS):
        h.update(name.encode() + b"\0" + (SRC / name).read_bytes())
    for name, text in generated_headers().items():
        h.update(name.encode() + b"\0" + text.encode())
    flags = " ".join((*variant.flags, *(f for fs in SOURCES.values() for f in fs)))
    for part in (_compiler_version(cxx), flags, _cpu_features(), jax.__version__):
        h.update(b"\0" + part.encode())
    return h.hexdigest()[:20]


def library_path(variant: Variant = VARIANTS["native"]) -> Path:
    """Where the library for this compiler, CPU and sources is (built or not)."""
    cxx = compiler()
    return cache_root() / "kernels_cpu" / f"llamay_kernels_{variant.name}_{_key(cxx, variant)}.so"


def build(variant: Variant = VARIANTS["native"]) -> Path:
    """The library's path, compiling it first if it is not in the cache."""
    path = library_path(variant)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it right now
        if path.exists():
            return path
        with tempfile.TemporaryDirectory(dir=path.parent, prefix=".build-") as tmp:
            for name, text in generated_headers().items():
                (Path(tmp) / name).write_text(text)
            base = [
                compiler(),
                *variant.flags,
                f"-I{jax.ffi.include_dir()}",
                f"-I{SRC}",
                f"-I{tmp}",
            ]
            objects = [str(Path(tmp) / (src + ".o")) for src in SOURCES]
            compiles = [
                [*base, *flags, "-c", str(SRC / src), "-o", obj]
                for (src, flags), obj in zip(SOURCES.items(), objects, strict=True)
            ]
            # the sources at once, one compiler per core: minutes on one core each
            with concurrent.futures.ThreadPoolExecutor(_cores()) as pool:
                list(pool.map(_run, compiles))
            _run([compiler(), "-shared", *objects, "-o", str(Path(tmp) / "lib.so")])
            os.replace(Path(tmp) / "lib.so", path)
    return path


def _cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _run(cmd: list[str]) -> None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NativeKernelError(f"building the native CPU kernels failed: {e}") from None
    if out.returncode:
        raise NativeKernelError(
            f"building the native CPU kernels failed ({' '.join(cmd[:2])} ...): "
            f"{out.stderr.strip()[-600:]}"
        )


@functools.cache
def _registered(variant_name: str) -> str:
    """Build (or find), load and register a variant once per process: its target prefix."""
    variant = VARIANTS[variant_name]
    lib = ctypes.CDLL(str(build(variant)))
    for name in HANDLERS:
        target = variant.prefix + name
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, name)), platform="cpu")
    return variant.prefix


def choice() -> str:
    value = os.environ.get(ENV, "auto") or "auto"
    if value not in CHOICES:
        raise NativeKernelError(f"{ENV}={value!r} is not one of {', '.join(CHOICES)}")
    return value


_failed: dict[str, str] = {}


def targets(variant: str = "native") -> str | None:
    """The registered FFI target prefix of `variant`, or None when the XLA path is to be
    used (`LLAMAY_CPU_KERNELS=xla`, or "auto" and the build failed: logged once)."""
    mode = choice()
    if mode == "xla":
        return None
    if variant in _failed and mode == "auto":
        return None
    try:
        return _registered(variant)
    except NativeKernelError as e:
        if mode == "native":
            raise
        _failed[variant] = str(e)
        log.warning(
            "native CPU kernels unavailable, using the slower XLA path: %s. For the fast "
            "path install a C++17 compiler (g++ or clang++; or set LLAMAY_CXX to one) and "
            "run `llamay warmup` or `make install`; LLAMAY_CPU_KERNELS=xla silences this.",
            e,
        )
        return None
