"""Debris after crashes: a pull or a KV snapshot save killed with `kill -9` leaves a partial
file; the next pull of the same digest removes (or, from a registry, resumes) it, and
`llamay gc` removes every partial no live process holds, and none that one does. Snapshot
saves fsync the file before the rename and the directory after it."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
from typer.testing import CliRunner

import llamay.store as store
from llamay.kv import snapshot as kv_snapshot
from llamay.store import CATALOG, CatalogEntry, Source, register_source

PAYLOAD = b"GGUF" + bytes(range(256)) * 4096  # 1 MiB and a bit
DIGEST = hashlib.sha256(PAYLOAD).hexdigest()
NAME = "debris:1"

# A pull whose source writes a quarter of the model, then hangs (until killed).
_STALLED_PULL = textwrap.dedent(
    """
    import sys, time
    from dataclasses import dataclass
    from pathlib import Path
    from typing import ClassVar
    import llamay.store as store
    from llamay.store import CATALOG, CatalogEntry, Source, register_source

    marker, digest, size = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])

    @register_source
    @dataclass(frozen=True)
    class Stalling(Source):
        kind: ClassVar[str] = "test-stalling"
        def fetch(self, sink, *, progress=True):
            sink.write(b"GGUF" + b"\\0" * (size // 4))
            marker.write_text("stalled")
            time.sleep(3600)
        def describe(self): return "a stalling source"
        def to_json(self): return {"kind": self.kind}
        @classmethod
        def from_json(cls, data): return cls()

    CATALOG["debris:1"] = CatalogEntry("debris:1", digest, size, Stalling())
    store.pull("debris:1", progress=False)
    """
)

# A KV snapshot save that hangs after writing part of the file (until killed).
_STALLED_SAVE = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import numpy as np
    from llamay.kv import snapshot

    marker = Path(sys.argv[1])

    def stalling_savez(f, **arrays):
        f.write(b"PK\\x03\\x04 half a snapshot")
        f.flush()
        marker.write_text("stalled")
        time.sleep(3600)

    snapshot.np.savez = stalling_savez
    kv = np.zeros((1, 3, 1, 2), np.float32)
    snapshot.store_snapshot(snapshot.Snapshot("sha256:" + "0" * 64, "float32", [1, 2, 3], kv, kv))
    """
)


@register_source
@dataclass(frozen=True)
class _Complete(Source):
    kind: ClassVar[str] = "test-complete"
    data: bytes = PAYLOAD

    def fetch(self, sink, *, progress: bool = True) -> None:
        sink.write(self.data)

    def describe(self) -> str:
        return "the complete source"

    def to_json(self):
        return {"kind": self.kind, "data": self.data.hex()}

    @classmethod
    def from_json(cls, data):
        return cls(bytes.fromhex(data["data"]))


def _catalogue(monkeypatch, name: str, data: bytes) -> None:
    entry = CatalogEntry(name, hashlib.sha256(data).hexdigest(), len(data), _Complete(data))
    monkeypatch.setitem(CATALOG, name, entry)


def _spawn(tmp_path: Path, env, script: str, *args: str) -> tuple[subprocess.Popen, Path]:
    path = tmp_path / "child.py"
    path.write_text(script)
    marker = tmp_path / "stalled"
    child_env = dict(os.environ, LLAMAY_HOME=str(env.home), LLAMAY_CACHE=str(env.cache))
    proc = subprocess.Popen(
        [sys.executable, str(path), str(marker), *args],
        env=child_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not marker.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the child exited early: {proc.communicate()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("the child never reached its stall point")
        time.sleep(0.05)
    return proc, marker


def _kill_9(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL


def _partials(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if ".partial" in p.name)


def test_killed_pull_partial_is_removed_by_the_next_pull(env, tmp_path, monkeypatch) -> None:
    proc, _ = _spawn(tmp_path, env, _STALLED_PULL, DIGEST, str(len(PAYLOAD)))
    blobs = env.home / "blobs"
    try:
        [partial] = _partials(blobs)
        assert partial.name == f".partial-{DIGEST}" and partial.stat().st_size > 0
        assert store.gc(grace_s=0) == []  # its puller is alive: gc leaves it
        # nor does another pull's sweep of day-old partials, however old it looks
        os.utime(partial, (time.time() - 3 * 86400,) * 2)
        _catalogue(monkeypatch, "other:1", b"GGUF another model")
        store.pull("other:1", progress=False)
        assert partial.exists()
    finally:
        _kill_9(proc)
    assert partial.exists() and store.list_models()[0].name == "other:1"  # debris, not a model
    _catalogue(monkeypatch, NAME, PAYLOAD)
    path = store.pull(NAME, progress=False)
    assert path.read_bytes() == PAYLOAD
    assert _partials(blobs) == []


def test_gc_removes_the_partial_of_a_killed_pull(env, tmp_path) -> None:
    proc, _ = _spawn(tmp_path, env, _STALLED_PULL, DIGEST, str(len(PAYLOAD)))
    _kill_9(proc)
    blobs = env.home / "blobs"
    [partial] = _partials(blobs)
    legacy = blobs / ".partial-0123456789ab-cafe01"  # an older llamay's non-resumable name
    legacy.write_bytes(b"x")
    os.utime(legacy, (time.time() - 2 * 3600,) * 2)
    from llamay_cli.main import app

    r = CliRunner().invoke(app, ["gc"])
    assert r.exit_code == 0, r.output
    assert _partials(blobs) == []
    assert f"removed {partial.name}" in r.stdout and f"removed {legacy.name}" in r.stdout


def test_killed_snapshot_save_leaves_a_partial_that_only_gc_removes(env, tmp_path) -> None:
    kv = env.home / "kv"
    proc, _ = _spawn(tmp_path, env, _STALLED_SAVE)
    try:
        [partial] = _partials(kv)
        assert store.gc() == [] and partial.exists()  # being written: kept
    finally:
        _kill_9(proc)
    legacy = kv / "tmpab12cd34.partial"  # what older saves (tempfile.mkstemp) left
    legacy.write_bytes(b"PK")
    assert kv_snapshot.stored_snapshots(root=env.home) == []
    assert sorted(store.gc()) == sorted([partial, legacy])
    assert list(kv.iterdir()) == []


def test_snapshot_save_fsyncs_file_then_renames_then_fsyncs_the_directory(env, monkeypatch) -> None:
    calls: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        calls.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst):
        calls.append(("replace", str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(kv_snapshot.os, "fsync", fsync)
    monkeypatch.setattr(kv_snapshot.os, "replace", replace)
    kv = np.arange(12, dtype=np.float32).reshape(1, 3, 2, 2)
    snap = kv_snapshot.Snapshot("sha256:" + "1" * 64, "float32", [5, 6, 7], kv, kv)
    digest = kv_snapshot.store_snapshot(snap)
    final = env.home / "kv" / f"{digest.removeprefix('sha256:')}.kv.npz"
    kinds = [k for k, _ in calls]
    assert kinds == ["fsync", "replace", "fsync"], calls
    assert ".partial" in calls[0][1] and calls[1][1] == str(final)
    assert calls[2][1] == str(final.parent)
    got = kv_snapshot.load_snapshot(digest, root=env.home)
    assert got.tokens == [5, 6, 7] and np.array_equal(got.k, kv)
    assert _partials(final.parent) == []


@pytest.mark.parametrize(
    "bad", ["evil\n", "sha256:" + "a" * 64 + "\n", "../x", "", "sha256:", "abc"]
)
def test_snapshot_digests_must_be_plain(env, bad) -> None:
    from llamay.errors import SnapshotError

    with pytest.raises(SnapshotError, match="not a snapshot digest"):
        kv_snapshot.load_snapshot(bad, root=env.home)
