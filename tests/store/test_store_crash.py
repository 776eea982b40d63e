"""Crash safety across processes: `kill -9` in the middle of a registry pull leaves a
consistent store (no manifest, no visible partial blob) that the next pull completes by
resuming; two processes pulling the same model at once both succeed."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from fixture_data import tiny_model_file

import llamay.store as store
from llamay.store import oci

_PULLER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import llamay.store as store
    from llamay.store import oci

    name, marker, stall_after = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    real = oci.Registry.open_blob

    class Stalling:
        def __init__(self, inner):
            self.inner, self.sent = inner, 0
        def read(self, n=-1):
            if stall_after and self.sent >= stall_after:
                marker.write_text(str(self.sent))
                time.sleep(3600)
            data = self.inner.read(min(n, 1 << 18))
            self.sent += len(data)
            return data
        def __enter__(self):
            return self
        def __exit__(self, *exc):
            self.inner.close()

    def open_blob(self, repository, digest, offset=0):
        r, start = real(self, repository, digest, offset)
        return (Stalling(r) if r is not None and r.length and r.length > (1 << 20) else r), start

    oci.Registry.open_blob = open_blob
    print(store.pull(name, progress=False))
    """
)


def _sha_ok(path: Path) -> bool:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest() == "sha256:" + path.name[7:]


def _spawn(tmp_path: Path, env, name: str, marker: Path, stall_after: int) -> subprocess.Popen:
    script = tmp_path / "puller.py"
    script.write_text(_PULLER)
    child_env = dict(os.environ, LLAMAY_HOME=str(env.home), LLAMAY_CACHE=str(env.cache))
    return subprocess.Popen(
        [sys.executable, str(script), name, str(marker), str(stall_after)],
        env=child_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(marker: Path, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not marker.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the puller exited early: {proc.communicate()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("the puller never reached the stall point")
        time.sleep(0.02)


@pytest.fixture(scope="module")
def tiny_gguf() -> Path:
    return tiny_model_file("llama")


def test_kill_9_during_pull_leaves_a_consistent_store(
    env, registry, tiny_gguf, tmp_path, monkeypatch
) -> None:
    repo = "library/crash"
    pushed = registry.push_model(repo, "latest", tiny_gguf, params={"temperature": 0.1})
    name = f"{registry.host}/{repo}:latest"
    marker = tmp_path / "stalled"
    proc = _spawn(tmp_path, env, name, marker, stall_after=3 << 20)
    _wait_for(marker, proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL

    # consistent: no manifest, every visible blob complete and correct, the partial hidden
    assert store.list_models() == []
    assert not any(f.startswith("manifests/") for f in env.files())
    visible = [p for p in (env.home / "blobs").iterdir() if not p.name.startswith(".")]
    assert all(_sha_ok(p) for p in visible)
    model = pushed.model()
    assert not (env.home / "blobs" / f"sha256-{model.hex}").exists()
    partial = env.home / "blobs" / f".partial-{model.hex}"
    have = partial.stat().st_size
    assert 0 < have <= 3 << 20

    # the next pull (this process) takes the lock the dead one held and resumes
    offsets = []
    real = oci.Registry.open_blob

    def record(self, repository, digest, offset=0):
        if digest == model.digest:
            offsets.append(offset)
        return real(self, repository, digest, offset)

    monkeypatch.setattr(oci.Registry, "open_blob", record)
    path = store.pull(name, progress=False)
    assert offsets == [have]
    assert path.read_bytes() == tiny_gguf.read_bytes()
    assert [m.name for m in store.list_models()] == [name]
    assert not partial.exists()


def test_two_processes_pull_one_model(env, registry, tiny_gguf, tmp_path) -> None:
    repo = "library/twice"
    pushed = registry.push_model(repo, "latest", tiny_gguf)
    name = f"{registry.host}/{repo}:latest"
    procs = [_spawn(tmp_path, env, name, tmp_path / f"m{i}", stall_after=0) for i in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    paths = {out.strip() for out, _ in outs}
    assert paths == {str(env.home / "blobs" / f"sha256-{pushed.model().hex}")}
    assert all(_sha_ok(p) for p in (env.home / "blobs").iterdir())
    assert [m.name for m in store.list_models()] == [name]
