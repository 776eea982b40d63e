"""Manifests read back as `ModelEntry`s: one model's, or every model's (`list_models`)."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from llamay.errors import LlamayError
from llamay.store import manifest as media
from llamay.store.blobs import blob_path, manifests_dir, store_dir
from llamay.store.catalog import known_names, suggest
from llamay.store.manifest import Manifest
from llamay.store.names import ModelRef, manifest_path, parse_name

MANIFEST_SCHEMA = 1


@dataclass(frozen=True)
class ModelEntry:
    """A model in the store, as `list_models()` reports it."""

    name: str  # canonical `[ns/]name:tag`
    digest: str  # `sha256:<hex>`
    size: int
    modified: datetime  # when the manifest was last written (UTC)
    path: Path  # the blob
    source: dict[str, Any] | None = None
    #: The Ollama-shaped manifest (registry names; catalogue names that carry layers).
    manifest: Manifest | None = None

    def layer_path(self, media_type: str) -> Path | None:
        """The blob of the manifest's (last) layer of `media_type`, if there is one."""
        if self.manifest is None:
            return None
        layer = self.manifest.layer(media_type)
        return None if layer is None else self.path.parent / f"sha256-{layer.hex}"

    def adapter_paths(self) -> list[Path]:
        """The blobs of its LoRA adapter layers (Modelfile `ADAPTER`), in manifest order."""
        if self.manifest is None:
            return []
        return [
            self.path.parent / f"sha256-{x.hex}"
            for x in self.manifest.layers
            if x.media_type == media.ADAPTER
        ]


def _parse_manifest(path: Path, ref: ModelRef, root: Path) -> ModelEntry:
    """Read and check a manifest; raises `LlamayError`/`OSError`/`ValueError` when malformed."""
    if ref.host:
        return _parse_oci_manifest(path, ref, root)
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    digest, size = data.get("digest"), data.get("size")
    if not isinstance(digest, str) or not digest.startswith("sha256:"):
        raise ValueError(f"bad digest {digest!r}")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ValueError(f"bad size {size!r}")
    source = data.get("source")
    oci = data.get("manifest")
    return ModelEntry(
        name=str(ref),
        digest=digest,
        size=size,
        modified=datetime.fromtimestamp(path.stat().st_mtime, UTC),
        path=blob_path(digest, root),
        source=source if isinstance(source, dict) else None,
        manifest=Manifest.loads(json.dumps(oci), f"{path}: manifest") if oci else None,
    )


def _parse_oci_manifest(path: Path, ref: ModelRef, root: Path) -> ModelEntry:
    man = Manifest.loads(path.read_bytes(), str(path))
    model = man.model()
    for layer in man.blobs():
        blob_path(layer.digest, root)  # every digest well-formed
    return ModelEntry(
        name=str(ref),
        digest=model.digest,
        size=model.size,
        modified=datetime.fromtimestamp(path.stat().st_mtime, UTC),
        path=blob_path(model.digest, root),
        source={"kind": "registry", "host": ref.host, "repository": ref.remote_repository},
        manifest=man,
    )


def adapter_paths(name: str, root: Path | None = None) -> list[Path]:
    """The LoRA adapter blobs (Modelfile `ADAPTER` layers) of the store's model `name`;
    [] when it has none, or the name is no model of the store."""
    try:
        entry = read_entry(root or store_dir(), parse_name(name))
    except (LlamayError, OSError, ValueError):
        return []
    return [] if entry is None else entry.adapter_paths()


def projector_path(name: str, root: Path | None = None) -> Path | None:
    """The vision projector blob (a `projector` layer: an mmproj GGUF) of the store's model
    `name`; None when it has none, or the name is no model of the store."""
    try:
        entry = read_entry(root or store_dir(), parse_name(name))
    except (LlamayError, OSError, ValueError):
        return None
    return None if entry is None else entry.layer_path(media.PROJECTOR)


def read_entry(root: Path, ref: ModelRef) -> ModelEntry | None:
    """The manifest's entry for `ref`, or None if there is no (readable) manifest."""
    path = manifest_path(manifests_dir(root), ref)
    if not path.is_file():
        return None
    try:
        return _parse_manifest(path, ref, root)
    except (OSError, ValueError, LlamayError) as e:
        warnings.warn(f"ignoring malformed manifest {path}: {e}", stacklevel=3)
        return None


def blob_ok(entry: ModelEntry) -> bool:
    """The model blob (and, for a registry manifest, every layer) is there at its size."""
    blobs = [(entry.path, entry.size)]
    if entry.manifest is not None and entry.source and entry.source.get("kind") == "registry":
        blobs += [(entry.path.parent / f"sha256-{x.hex}", x.size) for x in entry.manifest.blobs()]
    try:
        return all(p.is_file() and p.stat().st_size == n for p, n in blobs)
    except OSError:
        return False


def complete_entry(root: Path, ref: ModelRef) -> ModelEntry | None:
    """`ref`'s entry if its manifest is readable and its blobs are all there."""
    entry = read_entry(root, ref)
    return entry if entry is not None and blob_ok(entry) else None


def _manifest_files(manifests: Path) -> Iterator[tuple[Path, str]]:
    """(path, name text) of every manifest: `[ns/]name/tag.json` and `host/ns/name/tag`."""
    for dirpath, dirnames, filenames in os.walk(manifests):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for fn in sorted(filenames):
            if fn.startswith("."):
                continue
            path = Path(dirpath) / fn
            rel = path.relative_to(manifests).parts
            if len(rel) == 4:
                yield path, f"{rel[0]}/{rel[1]}/{rel[2]}:{rel[3]}"
            elif fn.endswith(".json") and len(rel) <= 3:
                yield path, "/".join(rel[:-1]) + ":" + fn.removesuffix(".json")
            else:
                warnings.warn(f"ignoring {path}: not a manifest path", stacklevel=3)


def list_models(root: Path | None = None) -> list[ModelEntry]:
    """Every model in the store, sorted by name. Malformed manifests are skipped with a warning."""
    entries, bad = scan(store_dir() if root is None else root)
    for path, e in bad:
        warnings.warn(f"ignoring malformed manifest {path}: {e}", stacklevel=2)
    return entries


def scan(root: Path) -> tuple[list[ModelEntry], list[tuple[Path, Exception]]]:
    """(the readable models sorted by name, the malformed manifests with their errors)."""
    manifests = manifests_dir(root)
    if not manifests.is_dir():
        return [], []
    out, bad = [], []
    for path, text in _manifest_files(manifests):
        try:
            ref = parse_name(text)
            if ref.host and len(path.relative_to(manifests).parts) != 4:
                raise ValueError(f"{text} is a registry name in a non-registry place")
            out.append(_parse_manifest(path, ref, root))
        except (OSError, ValueError, LlamayError) as e:
            bad.append((path, e))
    return sorted(out, key=lambda m: m.name), bad


def referenced(entry: ModelEntry) -> set[str]:
    """Every digest (`sha256:<hex>`) a model's manifest references."""
    refs = {entry.digest}
    if entry.manifest is not None:
        refs |= {x.digest for x in entry.manifest.blobs()}
    return refs


def unknown_message(ref: ModelRef, root: Path) -> str:
    local = [m.name for m in list_models(root)]
    names = sorted(set(known_names()) | set(local))
    hint = suggest(ref, names)
    msg = f"unknown model {str(ref)!r}"
    if hint:
        msg += f" (did you mean {', '.join(hint)}?)"
    return (
        msg + f"; known models: {', '.join(names) or '(none)'}. A path to a .gguf file works too."
    )
