"""Test helpers: a CNCF distribution registry on loopback, and a small OCI push client.

`docker-registry` (Debian's package of the distribution registry) is started with a
temporary config bound to 127.0.0.1; models are pushed the way `ollama push` does it:
each blob by a monolithic upload (POST for a session, PUT with `?digest=`), then the
manifest by tag.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from llamay.store import manifest as media
from llamay.store.manifest import Layer, Manifest

REGISTRY_BINARY = "docker-registry"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RegistryServer:
    """A running registry: `host` is `127.0.0.1:<port>`, `root` its storage directory."""

    host: str
    root: Path
    process: subprocess.Popen

    def connection(self) -> http.client.HTTPConnection:
        h, p = self.host.rsplit(":", 1)
        return http.client.HTTPConnection(h, int(p), timeout=30)

    def blob_data_path(self, digest: str) -> Path:
        """Where the registry keeps a blob's bytes on disk (to corrupt it in a test)."""
        hexd = digest.removeprefix("sha256:")
        return self.root / "docker/registry/v2/blobs/sha256" / hexd[:2] / hexd / "data"

    # --- pushing -----------------------------------------------------------------------

    def push_blob(self, repo: str, data: bytes | Path, media_type: str) -> Layer:
        if isinstance(data, Path):
            h = hashlib.sha256()
            with open(data, "rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
            size = data.stat().st_size
        else:
            h, size = hashlib.sha256(data), len(data)
        digest = f"sha256:{h.hexdigest()}"
        c = self.connection()
        try:
            c.request("POST", f"/v2/{repo}/blobs/uploads/")
            r = c.getresponse()
            r.read()
            assert r.status == 202, (r.status, r.reason)
            loc = urllib.parse.urlsplit(r.getheader("Location"))
            query = loc.query + ("&" if loc.query else "") + f"digest={digest}"
            headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
            if isinstance(data, Path):
                with open(data, "rb") as f:
                    c.request("PUT", f"{loc.path}?{query}", body=f, headers=headers)
                    r = c.getresponse()
            else:
                c.request("PUT", f"{loc.path}?{query}", body=data, headers=headers)
                r = c.getresponse()
            body = r.read()
            assert r.status == 201, (r.status, body)
        finally:
            c.close()
        return Layer(media_type, digest, size)

    def push_manifest(self, repo: str, tag: str, manifest: Manifest) -> str:
        raw = manifest.dumps()
        c = self.connection()
        try:
            c.request(
                "PUT",
                f"/v2/{repo}/manifests/{tag}",
                body=raw,
                headers={"Content-Type": manifest.media_type},
            )
            r = c.getresponse()
            body = r.read()
            assert r.status == 201, (r.status, body)
            return r.getheader("Docker-Content-Digest")
        finally:
            c.close()

    def push_model(
        self,
        repo: str,
        tag: str,
        gguf: Path | bytes,
        *,
        template: str | None = None,
        system: str | None = None,
        params: dict | None = None,
        license: str | None = None,
    ) -> Manifest:
        """Push a GGUF and its text layers with an Ollama-typed manifest; returns it."""
        layers = [self.push_blob(repo, gguf, media.MODEL)]
        for text, mt in ((template, media.TEMPLATE), (system, media.SYSTEM)):
            if text is not None:
                layers.append(self.push_blob(repo, text.encode(), mt))
        if params is not None:
            layers.append(self.push_blob(repo, json.dumps(params).encode(), media.PARAMS))
        if license is not None:
            layers.append(self.push_blob(repo, license.encode(), media.LICENSE))
        config = {
            "model_format": "gguf",
            "model_family": "llama",
            "model_families": ["llama"],
            "model_type": "tiny",
            "file_type": "mixed",
            "architecture": "amd64",
            "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": [x.digest for x in layers]},
        }
        cfg = self.push_blob(repo, json.dumps(config).encode(), media.CONFIG)
        man = Manifest(config=cfg, layers=tuple(layers))
        self.push_manifest(repo, tag, man)
        return man


def start_registry(tmp: Path) -> RegistryServer:
    """Start `docker-registry serve` on 127.0.0.1:<free port>; waits until it answers."""
    binary = shutil.which(REGISTRY_BINARY)
    if binary is None:
        raise FileNotFoundError(REGISTRY_BINARY)
    port = free_port()
    root = tmp / "registry-data"
    root.mkdir(parents=True)
    config = tmp / "registry.yml"
    config.write_text(
        "version: 0.1\n"
        "log:\n  level: error\n  accesslog:\n    disabled: true\n"
        f"storage:\n  filesystem:\n    rootdirectory: {root}\n  delete:\n    enabled: true\n"
        f"http:\n  addr: 127.0.0.1:{port}\n  secret: llamay-tests\n"
    )
    log = open(tmp / "registry.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [binary, "serve", str(config)],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={k: v for k, v in os.environ.items() if not k.startswith("REGISTRY_")},
    )
    server = RegistryServer(f"127.0.0.1:{port}", root, proc)
    deadline = time.monotonic() + 20
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"registry exited: {(tmp / 'registry.log').read_text()[-2000:]}")
        try:
            c = server.connection()
            c.request("GET", "/v2/")
            r = c.getresponse()
            r.read()
            c.close()
            if r.status == 200:
                return server
        except OSError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("registry did not start within 20 s")
        time.sleep(0.05)
