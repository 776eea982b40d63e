"""The bearer-token challenge and blob redirects, with a small token-guarded front
(127.0.0.1) to the loopback distribution registry: 401 + `WWW-Authenticate: Bearer`, a
token service, and blobs redirected to a "storage" path that must not see the token."""

from __future__ import annotations

import http.client
import http.server
import json
import threading
import urllib.parse
from pathlib import Path

import pytest
from fixture_data import tiny_model_file

import llamay.store as store
from llamay.errors import FetchError

TOKEN = "tok-123"


class _Front(http.server.BaseHTTPRequestHandler):
    registry_host: str
    log: list
    issue_token = True
    realm: str | None = None
    huge_manifest = False

    def log_message(self, *args) -> None:  # quiet
        pass

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _proxy(self, path: str, keep: tuple[str, ...]) -> None:
        parts = path.split("/")  # a case-insensitive front, as hf.co's is
        path = "/".join(parts[:2] + [x.lower() for x in parts[2:4]] + parts[4:])
        h, p = self.registry_host.rsplit(":", 1)
        c = http.client.HTTPConnection(h, int(p), timeout=30)
        headers = {k: self.headers[k] for k in keep if self.headers.get(k)}
        c.request("GET", path, headers=headers)
        r = c.getresponse()
        body = r.read()
        out = {
            k: v
            for k, v in r.getheaders()
            if k in ("Content-Type", "Docker-Content-Digest", "Content-Range")
        }
        self._send(r.status, body, out)
        c.close()

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        self.log.append((url.path, self.headers.get("Authorization")))
        if url.path == "/token":
            q = urllib.parse.parse_qs(url.query)
            assert q["service"] == ["front"], q
            body = json.dumps({"token": TOKEN} if self.issue_token else {}).encode()
            self._send(200, body, {"Content-Type": "application/json"})
        elif url.path.startswith("/storage/"):
            assert self.headers.get("Authorization") is None, "token leaked to storage"
            self._proxy(url.path.removeprefix("/storage"), ("Range",))
        elif self.headers.get("Authorization") != f"Bearer {TOKEN}":
            repo = url.path.split("/")[2:4]
            host = f"127.0.0.1:{self.server.server_address[1]}"
            realm = self.realm or f"http://{host}/token"
            challenge = (
                f'Bearer realm="{realm}",service="front",scope="repository:{"/".join(repo)}:pull"'
            )
            self._send(401, b'{"errors":[]}', {"WWW-Authenticate": challenge})
        elif self.huge_manifest:
            self._send(200, b" " * (5 << 20), {"Content-Type": "application/json"})
        elif "/blobs/" in url.path:
            self._send(307, b"", {"Location": "/storage" + url.path})
        else:
            self._proxy(url.path, ("Accept",))


@pytest.fixture
def front(registry):
    handler = type("Front", (_Front,), {"registry_host": registry.host, "log": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield handler, f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def tiny_gguf() -> Path:
    """Built before `env` empties LLAMAY_HOME/LLAMAY_CACHE (it reads the real store)."""
    return tiny_model_file("llama")


def test_bearer_challenge_and_redirected_blobs(env, registry, front, tiny_gguf) -> None:
    handler, host = front
    pushed = registry.push_model("library/guarded", "latest", tiny_gguf, system="hi")
    path = store.pull(f"{host}/library/guarded:latest", progress=False)
    assert path.read_bytes() == tiny_gguf.read_bytes()
    paths = [p for p, _ in handler.log]
    assert paths[:3] == ["/v2/library/guarded/manifests/latest", "/token", paths[2]]
    assert handler.log[2][1] == f"Bearer {TOKEN}"
    storage = [(p, a) for p, a in handler.log if p.startswith("/storage/")]
    assert len(storage) == len(pushed.blobs()) and all(a is None for _, a in storage)


def test_token_service_without_token(env, registry, front, tiny_gguf) -> None:
    handler, host = front
    handler.issue_token = False
    registry.push_model("library/guarded2", "latest", tiny_gguf)
    with pytest.raises(FetchError, match="answered without a token"):
        store.pull(f"{host}/library/guarded2:latest", progress=False)
    assert env.files() == []


def test_token_realm_must_be_http(env, registry, front, tmp_path) -> None:
    handler, host = front
    secret = tmp_path / "secret"
    secret.write_text('{"token": "local-secret"}')
    handler.realm = secret.as_uri()
    with pytest.raises(FetchError, match="not an http\\(s\\) URL"):
        store.pull(f"{host}/library/x:latest", progress=False)
    assert all(a != "Bearer local-secret" for _, a in handler.log)


def test_oversized_manifest_is_refused(env, registry, front) -> None:
    handler, host = front
    handler.huge_manifest = True
    with pytest.raises(FetchError, match="larger than"):
        store.pull(f"{host}/library/x:latest", progress=False)
    assert env.files() == []


def test_mixed_case_registry_names(env, registry, front, tiny_gguf) -> None:
    """`hf.co/Org/Repo-GGUF:Q4_K_M`-style names keep their case on disk and on the wire."""
    _, host = front
    registry.push_model("someorg/tiny-gguf", "Q4_K_M", tiny_gguf)
    name = f"{host}/SomeOrg/Tiny-GGUF:Q4_K_M"
    path = store.pull(name, progress=False)
    assert path.read_bytes() == tiny_gguf.read_bytes()
    assert (env.home / "manifests" / host / "SomeOrg" / "Tiny-GGUF" / "Q4_K_M").is_file()
    assert [m.name for m in store.list_models()] == [name]
    store.remove(name)
    assert env.files() == []
