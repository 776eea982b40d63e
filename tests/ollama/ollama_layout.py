"""Test helper: write an Ollama-layout store exactly as Ollama writes it.

Blobs are `blobs/sha256-<hex>`; the model blob is linked in (hard link, else symlink) so a
100 MB model costs nothing. JSON is written the way Go's `json.Encoder` writes it: compact,
struct fields in declaration order (map keys sorted), `<`, `>` and `&` escaped as `\\u003c`,
`\\u003e`, `\\u0026`, and a trailing newline. The manifest lives at
`manifests/<host>/<namespace>/<model>/<tag>`.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from llamay.store import manifest as media


def go_json(value: Any, *, sort_keys: bool = False) -> bytes:
    """`json.NewEncoder(w).Encode(value)`: compact, HTML-escaped, newline-terminated."""
    text = json.dumps(value, separators=(",", ":"), sort_keys=sort_keys, ensure_ascii=False)
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return (text + "\n").encode()


class OllamaLayout:
    """Builds `<root>/blobs` and `<root>/manifests` like `ollama create` / `ollama pull`."""

    def __init__(self, root: Path):
        self.root = root
        (root / "blobs").mkdir(parents=True, exist_ok=True)
        (root / "manifests").mkdir(parents=True, exist_ok=True)

    def blob(self, data: bytes, media_type: str) -> dict[str, Any]:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        path = self.root / "blobs" / digest.replace(":", "-")
        if not path.exists():
            path.write_bytes(data)
        return {"mediaType": media_type, "digest": digest, "size": len(data)}

    def link_blob(self, source: Path, media_type: str, digest: str | None = None) -> dict:
        """The model layer: `source` linked in under its digest (not copied)."""
        if digest is None:
            h = hashlib.sha256()
            with open(source, "rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
            digest = "sha256:" + h.hexdigest()
        path = self.root / "blobs" / digest.replace(":", "-")
        if not path.exists():
            try:
                os.link(source, path)
            except OSError:
                path.symlink_to(source)
        return {"mediaType": media_type, "digest": digest, "size": source.stat().st_size}

    def model(
        self,
        name: tuple[str, str, str, str],
        gguf: Path,
        *,
        digest: str | None = None,
        template: str | None = None,
        system: str | None = None,
        params: dict[str, Any] | None = None,
        license: str | None = None,
        family: str = "llama",
        parameter_size: str = "134.52M",
        quantization: str = "Q4_1",
    ) -> Path:
        """Write one model; `name` is (host, namespace, model, tag). Returns the manifest path."""
        layers = [self.link_blob(gguf, media.MODEL, digest)]
        if template is not None:
            layers.append(self.blob(template.encode(), media.TEMPLATE))
        if system is not None:
            layers.append(self.blob(system.encode(), media.SYSTEM))
        if license is not None:
            layers.append(self.blob(license.encode(), media.LICENSE))
        if params is not None:
            layers.append(self.blob(go_json(params, sort_keys=True), media.PARAMS))
        config = {  # model.ConfigV2, in field order; empty omitempty fields left out
            "model_format": "gguf",
            "model_family": family,
            "model_families": [family],
            "model_type": parameter_size,
            "file_type": quantization,
            "architecture": "amd64",
            "os": "linux",
        }
        cfg = self.blob(go_json(config), media.CONFIG)
        manifest = {
            "schemaVersion": 2,
            "mediaType": media.MANIFEST_V2,
            "config": cfg,
            "layers": layers,
        }
        path = self.root / "manifests" / Path(*name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(go_json(manifest))
        return path
