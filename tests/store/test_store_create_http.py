"""`/api/create` reads no file the client names: over HTTP, FROM is a store model or a blob
the client uploaded (`/api/blobs/<digest>`, driven by the official `ollama` client); a
file on the server only behind `--allow-local-files`, and then only a GGUF file. The
requests are the ones that read `/etc/passwd` and the working directory's `secret.txt`
into the store before."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import ollama
import pytest
from fixture_data import tiny_model_file

import llamay.store as store
from llamay.serve import create_app
from llamay.serve.app import serve_in_thread
from llamay.serve.models import Models
from llamay.store import manifest as media

SECRET = b"the server's secret\n"


@pytest.fixture(scope="module")
def tiny() -> Path:
    """Built (once) before `env` points LLAMAY_HOME at an empty store."""
    return tiny_model_file("llama")


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The server's working directory, holding `secret.txt`, with `sub/` below it."""
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    (work / "secret.txt").write_bytes(SECRET)
    monkeypatch.chdir(work)
    return work


@contextlib.contextmanager
def _server(allow_local_files: bool = False) -> Iterator[str]:
    app = create_app(Models({}, use_store=True, default_keep_alive=-1))
    app.state.llamay.extra["allow_local_files"] = allow_local_files
    with serve_in_thread(app) as url:
        yield url


def _stored_bytes(env) -> list[bytes]:
    blobs = env.home / "blobs"
    return [p.read_bytes() for p in blobs.iterdir()] if blobs.is_dir() else []


HOSTILE = [
    {"model": "evil", "from": "sub/../../../../etc/passwd"},
    {"model": "evil", "from": "/etc/passwd"},
    {"model": "evil", "from": "secret.txt"},
    {"model": "evil", "from": "./secret.txt"},
    {"model": "evil", "modelfile": "FROM sub/../../../../etc/passwd\n"},
    {"model": "evil", "modelfile": "FROM secret.txt\n"},
    {"model": "evil", "modelfile": "FROM /etc/passwd\nSYSTEM x\n"},
    {"model": "evil", "from": "tiny\nFROM /etc/passwd"},
]


@pytest.mark.parametrize("allow_local_files", [False, True])
def test_create_reads_no_file_outside_the_store(env, workdir, allow_local_files) -> None:
    passwd = Path("/etc/passwd").read_bytes()
    with _server(allow_local_files) as url:
        for body in HOSTILE:
            r = httpx.post(url + "/api/create", json=body, timeout=30)
            assert 400 <= r.status_code < 500, (body, r.status_code, r.text)
            assert "error" in r.json()
    # nothing was copied in, no model was made
    assert all(b not in (passwd, SECRET) for b in _stored_bytes(env))
    assert store.list_models() == []


def test_allowed_local_file_must_be_gguf(env, workdir, tiny) -> None:
    with _server(allow_local_files=True) as url:
        r = httpx.post(url + "/api/create", json={"model": "evil", "from": "secret.txt"})
        assert r.status_code == 400 and "not a GGUF file" in r.json()["error"]
        r = httpx.post(url + "/api/create", json={"model": "mine", "from": str(tiny)})
        assert r.status_code == 200, r.text
    [entry] = store.list_models()
    assert entry.name == "mine:latest" and entry.path.read_bytes() == tiny.read_bytes()


def test_local_file_refused_without_the_flag(env, workdir, tiny) -> None:
    with _server() as url:
        r = httpx.post(url + "/api/create", json={"model": "mine", "from": str(tiny)})
    assert r.status_code == 400 and "local files are not allowed" in r.json()["error"]
    assert store.list_models() == []


def test_create_from_an_uploaded_blob_with_the_ollama_client(env, workdir, tiny) -> None:
    with _server() as url:
        client = ollama.Client(host=url)
        digest = client.create_blob(tiny)
        assert digest == "sha256:" + hashlib.sha256(tiny.read_bytes()).hexdigest()
        assert httpx.head(f"{url}/api/blobs/{digest}").status_code == 200
        client.create(model="uploaded", files={"tiny.gguf": digest}, system="Be brief.")
        assert "uploaded:latest" in [m.model for m in client.list().models]
    [entry] = store.list_models()
    assert entry.digest == digest and entry.path.read_bytes() == tiny.read_bytes()
    assert entry.layer_path(media.SYSTEM).read_text() == "Be brief."


def test_blob_upload_is_verified(env, workdir) -> None:
    wrong = "sha256:" + hashlib.sha256(b"something else").hexdigest()
    good = "sha256:" + hashlib.sha256(SECRET).hexdigest()
    with _server() as url:
        assert httpx.head(f"{url}/api/blobs/{good}").status_code == 404
        r = httpx.post(f"{url}/api/blobs/{wrong}", content=SECRET)
        assert r.status_code == 400 and "hash to" in r.json()["error"]
        assert httpx.head(f"{url}/api/blobs/{wrong}").status_code == 404
        r = httpx.post(f"{url}/api/blobs/sha256:../../etc", content=SECRET)
        assert r.status_code in (400, 404)
        assert httpx.head(f"{url}/api/blobs/sha256:xyz").status_code == 400
        # a blob that is not a GGUF file is stored, but no model is made from it
        assert httpx.post(f"{url}/api/blobs/{good}", content=SECRET).status_code == 201
        r = httpx.post(
            url + "/api/create", json={"model": "evil", "files": {"x.gguf": good}}, timeout=30
        )
        assert r.status_code == 400 and "not a GGUF file" in r.json()["error"]
    assert store.list_models() == []
    assert not [p for p in (env.home / "blobs").iterdir() if p.name.startswith(".partial")]
