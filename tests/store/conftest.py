"""Fixtures for the store tests: an isolated store and wheel cache, and locally built wheels."""

from __future__ import annotations

import hashlib
import os
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from llamay.store import CATALOG, CatalogEntry, WheelPart, WheelSource


@dataclass
class Env:
    home: Path
    cache: Path

    @property
    def wheels(self) -> Path:
        return self.cache / "wheels"

    def files(self) -> list[str]:
        """Every file in the store except lock files, relative, sorted."""
        if not self.home.exists():
            return []
        out = []
        for dirpath, _, names in os.walk(self.home):
            for n in names:
                rel = os.path.relpath(os.path.join(dirpath, n), self.home).replace(os.sep, "/")
                if not rel.startswith("locks/"):
                    out.append(rel)
        return sorted(out)


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Env:
    """LLAMAY_HOME and LLAMAY_CACHE pointed at empty temporary directories."""
    e = Env(home=tmp_path / "home", cache=tmp_path / "cache")
    monkeypatch.setenv("LLAMAY_HOME", str(e.home))
    monkeypatch.setenv("LLAMAY_CACHE", str(e.cache))
    return e


def build_wheel(directory: Path, dist: str, version: str, members: dict[str, bytes]) -> Path:
    """A minimal but well-formed wheel `<dist>-<version>-py3-none-any.whl` with `members`."""
    directory.mkdir(parents=True, exist_ok=True)
    norm = dist.replace("-", "_").lower()
    info = f"{norm}-{version}.dist-info"
    files = dict(members)
    files[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n".encode()
    )
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: llamay-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = [f"{name},,\n" for name in files] + [f"{info}/RECORD,,\n"]
    files[f"{info}/RECORD"] = "".join(record).encode()
    path = directory / f"{norm}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


@dataclass
class FakeModel:
    name: str
    payload: bytes
    sha256: str
    wheels: list[Path]
    entry: CatalogEntry


@pytest.fixture
def fake_model(env: Env, monkeypatch: pytest.MonkeyPatch) -> Callable[..., FakeModel]:
    """Factory: build wheel(s) holding a payload and register a catalogue entry for them."""

    def make(
        name: str = "fake:1",
        *,
        parts: int = 1,
        size: int = 3 << 20,
        sha256: str | None = None,
        catalog_size: int | None | str = "auto",
        into: Path | None = None,
        seed: int = 0,
    ) -> FakeModel:
        payload = hashlib.shake_256(f"{name}/{seed}".encode()).digest(size)
        # a compressible stretch too, so deflate has something to do
        payload = payload[: size // 2] + bytes(size - size // 2)
        cut = [len(payload) * i // parts for i in range(parts + 1)]
        wheels, wheel_parts = [], []
        for i in range(parts):
            dist = f"fake-model-{name.replace(':', '-').replace('/', '-')}-part{i}"
            member = f"{dist.replace('-', '_')}/data/model.gguf.part{i:02d}"
            wheels.append(
                build_wheel(
                    into or env.wheels, dist, "1.0.0", {member: payload[cut[i] : cut[i + 1]]}
                )
            )
            wheel_parts.append(WheelPart(f"{dist}==1.0.0", member))
        digest = sha256 or hashlib.sha256(payload).hexdigest()
        entry = CatalogEntry(
            name=name,
            sha256=digest,
            size=len(payload) if catalog_size == "auto" else catalog_size,  # type: ignore[arg-type]
            source=WheelSource(parts=tuple(wheel_parts)),
        )
        monkeypatch.setitem(CATALOG, name, entry)
        return FakeModel(name, payload, digest, wheels, entry)

    return make


@pytest.fixture
def wheel_builder() -> Callable[[Path, str, str, dict[str, bytes]], Path]:
    """`build_wheel(directory, dist, version, members) -> path`."""
    return build_wheel


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory):
    """A CNCF distribution registry (`docker-registry`) on 127.0.0.1, for the whole session."""
    from oci_registry import start_registry

    try:
        server = start_registry(tmp_path_factory.mktemp("registry"))
    except FileNotFoundError:
        pytest.skip("docker-registry is not installed (apt-get install docker-registry)")
    yield server
    server.process.terminate()
    try:
        server.process.wait(10)
    except Exception:
        server.process.kill()
        server.process.wait()
