"""Issue 19: Ollama's /api/pull and /api/push over real loopback, driven by the official
`ollama` client (its `ProgressResponse` validated strictly), against a CNCF distribution
registry (`docker-registry`, the `registry` fixture).

Pull (api.md, "Pull a Model"): "pulling manifest", per layer `{"status": "pulling <digest>",
"digest", "total", "completed"}`, "verifying sha256 digest", "writing manifest", "success"
streamed, and `{"status": "success"}` alone with `stream: false`; a model already present
streams the same sequence. Push ("Push a Model"): "retrieving manifest", per layer
`{"status": "pushing <digest>", "digest", "total", ...}`, "pushing manifest", "success";
what lands on the registry is read back with the registry's own API and pulled into an
empty store, byte for byte.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import ollama
import pytest
from fixture_data import tiny_model_file
from ollama._types import ProgressResponse

import llamay.store as store
from llamay.serve import create_app
from llamay.serve.app import serve_in_thread
from llamay.serve.models import Models

_ids = itertools.count()


@pytest.fixture(scope="module")
def tiny() -> Path:
    return tiny_model_file("llama")


@contextlib.contextmanager
def _server() -> Iterator[str]:
    app = create_app(Models({}, use_store=True, default_keep_alive=-1))
    with serve_in_thread(app) as url:
        yield url


def _strict(parts) -> list[dict]:
    """Each streamed part through the client's typed model, strictly, as dicts."""
    out = []
    for p in parts:
        again = ProgressResponse.model_validate_json(p.model_dump_json(exclude_none=True))
        out.append(again.model_dump(exclude_none=True))
    return out


def _pull_sequence(events: list[dict], blobs) -> None:
    """Ollama's pull sequence: manifest, each blob from 0 (or complete) to its size in
    order, verifying, writing, success."""
    statuses = [e["status"] for e in events]
    assert statuses[0] == "pulling manifest"
    assert statuses[-3:] == ["verifying sha256 digest", "writing manifest", "success"]
    middle = events[1:-3]
    assert [e["digest"] for e in middle] == sorted(
        (e["digest"] for e in middle), key=[b.digest for b in blobs].index
    )
    for b in blobs:
        mine = [e for e in middle if e["digest"] == b.digest]
        assert mine, f"no event for {b.digest}"
        assert all(e["status"] == f"pulling {b.hex[:12]}" and e["total"] == b.size for e in mine)
        done = [e["completed"] for e in mine]
        assert done == sorted(done) and done[-1] == b.size


def test_pull_streams_ollamas_sequence_fresh_and_present(env, registry, tiny) -> None:
    repo = f"library/pulled{next(_ids)}"
    pushed = registry.push_model(repo, "latest", tiny, params={"temperature": 0.2})
    name = f"{registry.host}/{repo}:latest"
    with _server() as url:
        client = ollama.Client(host=url)
        order = [*pushed.layers, pushed.config]  # Ollama's: the layers, then the config
        fresh = _strict(client.pull(name, stream=True))
        _pull_sequence(fresh, order)
        assert any(e["completed"] == 0 for e in fresh if "digest" in e)  # really fetched
        assert store.resolve(name, progress=False).read_bytes() == tiny.read_bytes()
        present = _strict(client.pull(name, stream=True))
        _pull_sequence(present, order)
        # present: each layer reported once, complete
        assert [e["completed"] for e in present if "digest" in e] == [b.size for b in order]
        one = client.pull(name, stream=False)
        assert ProgressResponse.model_validate_json(one.model_dump_json()).status == "success"
        # curl's form (api.md): a body without Content-Type, stream false
        r = httpx.post(f"{url}/api/pull", content=json.dumps({"model": name, "stream": False}))
        assert r.status_code == 200 and r.json() == {"status": "success"}
        with pytest.raises(ollama.ResponseError) as e:
            client.pull(f"{registry.host}/library/absent:latest", stream=False)
        assert "absent" in e.value.error


def _registry_get(registry, path: str, accept: str | None = None) -> tuple[int, bytes, dict]:
    c = registry.connection()
    try:
        c.request("GET", path, headers={"Accept": accept} if accept else {})
        r = c.getresponse()
        return r.status, r.read(), {k.lower(): v for k, v in r.getheaders()}
    finally:
        c.close()


def test_push_uploads_blobs_then_the_manifest(env, registry, tiny, tmp_path, monkeypatch) -> None:
    src_repo = f"library/source{next(_ids)}"
    pushed = registry.push_model(src_repo, "v1", tiny, system="Be brief.")
    store.pull(f"{registry.host}/{src_repo}:v1", progress=False)
    dst_repo = f"me/pushed{next(_ids)}"
    dst = f"{registry.host}/{dst_repo}:v2"
    store.copy(f"{registry.host}/{src_repo}:v1", dst)
    with _server() as url:
        client = ollama.Client(host=url)
        events = _strict(client.push(dst, stream=True))
        statuses = [e["status"] for e in events]
        assert statuses[0] == "retrieving manifest"
        assert statuses[-2:] == ["pushing manifest", "success"]
        digests = [e["digest"] for e in events if "digest" in e]
        assert sorted(set(digests), key=digests.index) == [
            b.digest for b in (*pushed.layers, pushed.config)
        ]
        for b in pushed.blobs():
            mine = [e for e in events if e.get("digest") == b.digest]
            assert mine and all(e["status"] == f"pushing {b.hex[:12]}" for e in mine)
            assert mine[-1]["completed"] == mine[-1]["total"] == b.size
        # the registry has the manifest under the new name, and every blob
        status, raw, headers = _registry_get(
            registry, f"/v2/{dst_repo}/manifests/v2", pushed.media_type
        )
        assert status == 200 and json.loads(raw) == json.loads(pushed.dumps())
        assert headers["docker-content-digest"] == "sha256:" + hashlib.sha256(raw).hexdigest()
        for b in pushed.blobs():
            status, data, _ = _registry_get(registry, f"/v2/{dst_repo}/blobs/{b.digest}")
            assert status == 200 and "sha256:" + hashlib.sha256(data).hexdigest() == b.digest
        # pushing again: every blob is already there (reported complete), stream false
        again = client.push(dst, stream=False)
        assert again.status == "success"
        # a name without a registry, and one not in the store: Ollama-shaped errors
        with pytest.raises(ollama.ResponseError) as e:
            client.push("plain:latest", stream=False)
        assert e.value.status_code == 400 and "host/namespace/name" in e.value.error
        with pytest.raises(ollama.ResponseError) as e:
            client.push(f"{registry.host}/me/never:1", stream=False)
        assert e.value.status_code == 404
    # an empty store pulls what was pushed, byte for byte
    monkeypatch.setenv("LLAMAY_HOME", str(tmp_path / "other-home"))
    path = store.pull(dst, progress=False)
    assert path.read_bytes() == tiny.read_bytes()
