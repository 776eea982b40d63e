"""The content-addressed model store.

Layout under `store_dir()` (`$LLAMAY_HOME`, default `~/.llamay`):

    blobs/sha256-<hex>                 model files (and small layers), named by their sha256,
                                       read-only
    manifests/[<ns>/]<name>/<tag>.json one per catalogue/local name: name, tag, digest, size,
                                       source, created (and, for `create`/`cp`, an Ollama
                                       manifest of the model's layers under "manifest")
    manifests/<host>/<ns>/<name>/<tag> one per registry name, in Ollama's shape and layout
                                       (`llamay.store.manifest`): config + layers
    locks/sha256-<hex>.lock            advisory locks held while a blob is written or removed

A pull streams the file from its `Source` into a temporary file inside `blobs/`, hashing
as it writes, verifies size and sha256, renames it into place and only then writes the
manifest (atomically, via a temporary file and rename). Any failure leaves neither a
partial blob nor a manifest behind and raises `FetchError` saying what failed. The one
exception is a *resumable* source (a registry blob): its download goes to the hidden
`blobs/.partial-<hex>`, which an interruption (a broken connection, Ctrl-C, kill -9) leaves
for the next pull to continue with a ranged request; it is never visible as a blob.

A registry name (`host/ns/name:tag`) is pulled with the OCI protocol (`llamay.store.oci`):
manifest by tag, then every blob by digest, each verified, then the manifest.

    pull(name, progress=True) -> Path       fetch a catalogue or registry model (no-op if
                                            present); `events=` gets /api/pull-style progress
    push(name) -> str                       upload a registry name's blobs and manifest to its
                                            registry (`events=`: /api/push-style progress)
    resolve(name_or_path) -> Path           a GGUF file path, or a store name (pulled if needed;
                                            `llamay.library.resolve` adds the Ollama store)
    list_models() -> list[ModelEntry]
    remove(name)
    copy(src, dst)                          another name for the same blobs
    create(name, modelfile, directory)      a model from a Modelfile (FROM + TEMPLATE/...)
    gc() -> list[Path]                      remove blobs no manifest references and partial
                                            files no live process holds
    receive_blob(digest, chunks) -> Path    an uploaded blob, verified (`/api/blobs`)
    store_dir() -> Path

The modules, by concern: `blobs` (files, locks, writing a blob), `entries` (manifests as
`ModelEntry`s), `pulling` (pull, resolve), `pushing` (push), `upkeep` (remove, copy, gc),
`creating` (create); `names`, `manifest`, `catalog`, `source`, `oci`, `wheel` below them.
The store never imports `llamay.ollama`: what spans both stores is `llamay.library`.
"""

from llamay.store.blobs import (
    RESUME_ATTEMPTS,
    blob_path,
    check_gguf,
    has_blob,
    receive_blob,
    store_dir,
)
from llamay.store.catalog import CATALOG, DEFAULT_MODEL, CatalogEntry, known_names
from llamay.store.creating import FileSource, LayeredModel, create
from llamay.store.entries import ModelEntry, list_models
from llamay.store.manifest import Layer, Manifest
from llamay.store.names import ModelRef, parse_name
from llamay.store.oci import OciBlobSource
from llamay.store.pulling import pull, resolve
from llamay.store.pushing import push
from llamay.store.source import SOURCE_KINDS, Source, register_source, source_from_json
from llamay.store.upkeep import GC_GRACE_S, copy, gc, remove
from llamay.store.wheel import WheelPart, WheelSource, wheel_cache_dir

__all__ = [
    "CATALOG",
    "DEFAULT_MODEL",
    "GC_GRACE_S",
    "RESUME_ATTEMPTS",
    "SOURCE_KINDS",
    "CatalogEntry",
    "FileSource",
    "Layer",
    "LayeredModel",
    "Manifest",
    "ModelEntry",
    "ModelRef",
    "OciBlobSource",
    "Source",
    "WheelPart",
    "WheelSource",
    "blob_path",
    "check_gguf",
    "copy",
    "create",
    "gc",
    "has_blob",
    "known_names",
    "list_models",
    "parse_name",
    "pull",
    "push",
    "receive_blob",
    "register_source",
    "remove",
    "resolve",
    "source_from_json",
    "store_dir",
    "wheel_cache_dir",
]
