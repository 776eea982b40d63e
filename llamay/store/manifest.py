"""Ollama-shaped image manifests: the OCI/Docker schema-2 manifest with Ollama's layer types.

This is the shape Ollama keeps under `manifests/<host>/<ns>/<name>/<tag>` and the one its
registry serves: a config blob (a small JSON document) and layers, each
`{"mediaType", "digest", "size"}`. The GGUF file is the layer of type `MODEL`; the chat
template, system prompt, sampling parameters and license are small text/JSON layers.
Manifests are written as Go's `json.Encoder` writes them: compact, fields in declaration
order, one trailing newline.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from llamay.errors import FetchError

#: The manifest's own media type (Ollama writes and requests this one).
MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"
#: Also accepted when reading from a registry.
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.docker.container.image.v1+json"

_PREFIX = "application/vnd.ollama.image."
MODEL = _PREFIX + "model"
TEMPLATE = _PREFIX + "template"
PROMPT = _PREFIX + "prompt"  # the template's older name
SYSTEM = _PREFIX + "system"
PARAMS = _PREFIX + "params"
LICENSE = _PREFIX + "license"
MESSAGES = _PREFIX + "messages"
ADAPTER = _PREFIX + "adapter"
PROJECTOR = _PREFIX + "projector"

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


@dataclass(frozen=True)
class Layer:
    """One blob of a manifest (also used for the config)."""

    media_type: str
    digest: str
    size: int
    from_: str = ""  # Ollama's `from`: the name the layer was derived from

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mediaType": self.media_type, "digest": self.digest}
        out["size"] = self.size
        if self.from_:
            out["from"] = self.from_
        return out

    @property
    def hex(self) -> str:
        return self.digest.removeprefix("sha256:")

    @classmethod
    def from_json(cls, data: Any, what: str) -> Layer:
        if not isinstance(data, dict):
            raise ValueError(f"{what} is not a JSON object")
        media, digest, size = data.get("mediaType"), data.get("digest"), data.get("size")
        if not isinstance(media, str) or not media:
            raise ValueError(f"{what} has no mediaType")
        if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
            raise ValueError(f"{what} has a malformed digest {digest!r} (want sha256:<64 hex>)")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ValueError(f"{what} has a malformed size {size!r}")
        frm = data.get("from", "")
        return cls(media, digest, size, frm if isinstance(frm, str) else "")


@dataclass(frozen=True)
class Manifest:
    """A schema-2 manifest: a config layer and the model's layers, in order."""

    config: Layer
    layers: tuple[Layer, ...]
    media_type: str = MANIFEST_V2
    schema_version: int = 2
    #: Fields outside the schema that were present when read (kept on rewrite).
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schemaVersion": self.schema_version,
            "mediaType": self.media_type,
            "config": self.config.to_json(),
            "layers": [layer.to_json() for layer in self.layers],
        }
        out.update(self.extra)
        return out

    def dumps(self) -> bytes:
        """The bytes Ollama would write: compact JSON and a newline."""
        return (json.dumps(self.to_json(), separators=(",", ":")) + "\n").encode()

    @classmethod
    def loads(cls, data: bytes | str, what: str = "manifest") -> Manifest:
        """Parse and check a manifest; raises `ValueError` saying what is wrong."""
        try:
            doc = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{what} is not valid JSON: {e}") from e
        if not isinstance(doc, dict):
            raise ValueError(f"{what} is not a JSON object")
        if doc.get("schemaVersion") != 2:
            raise ValueError(f"{what}: schemaVersion {doc.get('schemaVersion')!r}, expected 2")
        media = doc.get("mediaType", MANIFEST_V2)
        if media not in (MANIFEST_V2, OCI_MANIFEST):
            raise ValueError(
                f"{what}: media type {media!r} is not an image manifest (an index or a "
                "manifest list is not supported)"
            )
        layers = doc.get("layers")
        if not isinstance(layers, list):
            raise ValueError(f"{what} has no layers list")
        config = Layer.from_json(doc.get("config"), f"{what}: config")
        parsed = tuple(Layer.from_json(x, f"{what}: layer {i}") for i, x in enumerate(layers))
        known = {"schemaVersion", "mediaType", "config", "layers"}
        extra = {k: v for k, v in doc.items() if k not in known}
        return cls(config, parsed, media, 2, extra)

    def blobs(self) -> list[Layer]:
        """Every blob the manifest references: config first, then the layers."""
        return [self.config, *self.layers]

    def layer(self, media_type: str) -> Layer | None:
        """The last layer of a type (Ollama lets a later layer override an earlier one)."""
        found = [x for x in self.layers if x.media_type == media_type]
        return found[-1] if found else None

    def model(self) -> Layer:
        layer = self.layer(MODEL)
        if layer is None:
            raise FetchError(
                f"the manifest has no model layer ({MODEL}); its layers: "
                + (", ".join(x.media_type for x in self.layers) or "(none)")
            )
        return layer

    @property
    def total_size(self) -> int:
        return sum(x.size for x in self.blobs())
