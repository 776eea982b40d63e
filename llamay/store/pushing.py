"""Pushing a store model to an OCI registry, as `ollama push` does: every blob the
manifest references (the layers, then the config, Ollama's order) that the registry
lacks is uploaded (HEAD to ask, POST for an upload session, one monolithic PUT with
`?digest=`), then the manifest is PUT under its tag. The reverse of `pulling._pull_registry`.

Events, when a sink is given, are Ollama's `/api/push` stream: `{"status": "retrieving
manifest"}`, `{"status": "pushing <12 hex>", "digest", "total", "completed"}` per blob,
`{"status": "pushing manifest"}`, `{"status": "success"}`.
"""

from __future__ import annotations

import http.client
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llamay.errors import FetchError, InvalidModelNameError, ModelNotFoundError
from llamay.store.blobs import blob_path, store_dir
from llamay.store.entries import blob_ok, read_entry
from llamay.store.manifest import Layer
from llamay.store.names import parse_name
from llamay.store.oci import TIMEOUT_S, Registry, default_scheme

CHUNK = 1 << 20


class _Pusher:
    """HTTP to one registry for one push, answering a bearer challenge (with the
    `Registry` client's token logic) once per request."""

    def __init__(self, host: str, scheme: str, timeout: float):
        self.registry = Registry(host, scheme, timeout=timeout)
        self.host, self.scheme, self.timeout = host, scheme, timeout

    def _conn(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        return cls(self.host, timeout=self.timeout)

    def request(
        self,
        method: str,
        url: str,
        body: bytes | Path | None = None,
        headers: dict[str, str] | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        for attempt in range(2):
            hdrs = dict(headers or {})
            if self.registry.token:
                hdrs["Authorization"] = f"Bearer {self.registry.token}"
            c = self._conn()
            try:
                if isinstance(body, Path):
                    hdrs["Content-Length"] = str(body.stat().st_size)
                    c.putrequest(method, url)
                    for k, v in hdrs.items():
                        c.putheader(k, v)
                    c.endheaders()
                    sent = 0
                    with open(body, "rb") as f:
                        while chunk := f.read(CHUNK):
                            c.send(chunk)
                            sent += len(chunk)
                            if progress is not None:
                                progress(sent)
                else:
                    if body is not None:
                        hdrs["Content-Length"] = str(len(body))
                    c.request(method, url, body=body, headers=hdrs)
                r = c.getresponse()
                data = r.read()
                got = {k.lower(): v for k, v in r.getheaders()}
            except (OSError, http.client.HTTPException) as e:
                raise FetchError(f"{method} {self.scheme}://{self.host}{url}: {e}") from e
            finally:
                c.close()
            challenge = got.get("www-authenticate", "")
            if r.status == 401 and attempt == 0 and challenge:
                self.registry._authenticate(challenge)
                continue
            return r.status, got, data
        raise AssertionError("unreachable")

    def fail(self, what: str, status: int, data: bytes) -> FetchError:
        detail = data[:2000].decode("utf-8", "replace").strip()
        return FetchError(
            f"{what} on {self.host}: HTTP {status}" + (f": {detail}" if detail else "")
        )


def _upload(p: _Pusher, repo: str, layer: Layer, path: Path, emit) -> None:
    short = f"pushing {layer.hex[:12]}"

    def event(done: int) -> None:
        emit(status=short, digest=layer.digest, total=layer.size, completed=done)

    status, _, _ = p.request("HEAD", f"/v2/{repo}/blobs/{layer.digest}")
    if status == 200:  # the registry has it: nothing to send
        event(layer.size)
        return
    event(0)
    status, headers, data = p.request("POST", f"/v2/{repo}/blobs/uploads/")
    if status != 202 or "location" not in headers:
        raise p.fail(f"starting the upload of {layer.digest} to {repo}", status, data)
    loc = urllib.parse.urlsplit(headers["location"])
    if loc.netloc and loc.netloc != p.host:
        raise FetchError(f"the registry {p.host} sent the upload of {layer.digest} elsewhere")
    query = (
        loc.query + ("&" if loc.query else "") + urllib.parse.urlencode({"digest": layer.digest})
    )
    status, _, data = p.request(
        "PUT",
        f"{loc.path}?{query}",
        body=path,
        headers={"Content-Type": "application/octet-stream"},
        progress=event,
    )
    if status not in (201, 204):
        raise p.fail(f"uploading {layer.digest} to {repo}", status, data)


def push(
    name: str,
    *,
    insecure: bool = False,
    events: Callable[[dict[str, Any]], None] | None = None,
    timeout: float = TIMEOUT_S,
) -> str:
    """Push the store model `name` (a registry name `host/namespace/name:tag`) to its
    registry; returns the manifest digest the registry states. Plain HTTP for loopback
    hosts or with `insecure`. Raises `InvalidModelNameError` (not a registry name),
    `ModelNotFoundError` (not in the store) or `FetchError`."""

    def emit(**ev: Any) -> None:
        if events is not None:
            events(ev)

    ref = parse_name(name)
    if not ref.host:
        raise InvalidModelNameError(
            f"{ref} names no registry: push needs host/namespace/name:tag (copy the model "
            "to such a name first, e.g. llamay cp or /api/copy)"
        )
    root = store_dir()
    entry = read_entry(root, ref)
    if entry is None or not blob_ok(entry) or entry.manifest is None:
        raise ModelNotFoundError(f"model {ref} is not (completely) in the store {root}")
    man = entry.manifest
    emit(status="retrieving manifest")
    p = _Pusher(ref.host, default_scheme(ref.host, insecure), timeout)
    repo = ref.remote_repository
    for layer in (*man.layers, man.config):  # Ollama's order: the layers, then the config
        path = blob_path(layer.digest, root)
        if not path.is_file() or path.stat().st_size != layer.size:
            raise FetchError(f"{path} (a layer of {ref}) is missing or damaged; pull it again")
        _upload(p, repo, layer, path, emit)
    emit(status="pushing manifest")
    status, headers, data = p.request(
        "PUT",
        f"/v2/{repo}/manifests/{ref.tag}",
        body=man.dumps(),
        headers={"Content-Type": man.media_type},
    )
    if status not in (201, 200):
        raise p.fail(f"putting the manifest of {ref}", status, data)
    emit(status="success")
    return headers.get("docker-content-digest", "")
