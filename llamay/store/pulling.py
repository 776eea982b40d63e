"""Pulling a model into the store (catalogue or registry), and resolving a name to its file."""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from llamay.errors import FetchError, InvalidModelNameError, ModelNotFoundError
from llamay.files import atomic_write_bytes, atomic_write_json, unlink
from llamay.store.blobs import (
    blob_event,
    blob_path,
    emit,
    events_sink,
    fetch_blob,
    lock,
    manifests_dir,
    store_dir,
)
from llamay.store.catalog import lookup
from llamay.store.entries import (
    MANIFEST_SCHEMA,
    blob_ok,
    read_entry,
    referenced,
    unknown_message,
)
from llamay.store.names import ModelRef, manifest_path, parse_name
from llamay.store.oci import OciBlobSource, Registry, default_scheme
from llamay.store.source import Source, source_from_json, status
from llamay.store.upkeep import drop_unreferenced


def _pull(
    root: Path, ref: ModelRef, sha256: str, size: int | None, source: Source, progress: bool
) -> Path:
    mpath = manifest_path(manifests_dir(root), ref)
    with lock(root, f"sha256-{sha256}", f"pulling {ref}", progress=progress):
        entry = read_entry(root, ref)
        if entry is not None and entry.digest == f"sha256:{sha256}" and blob_ok(entry):
            return entry.path  # another process finished it while we waited
        emit(status="pulling manifest")  # the catalogue's entry is this one's manifest
        blob, actual, created = fetch_blob(root, ref, sha256, size, source, progress)
        emit(status="verifying sha256 digest")  # fetch_blob checked it as it wrote
        emit(status="writing manifest")
        manifest = {
            "schema_version": MANIFEST_SCHEMA,
            "name": ref.repository,
            "tag": ref.tag,
            "digest": f"sha256:{sha256}",
            "size": actual,
            "source": source.to_json(),
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        try:
            atomic_write_json(mpath, manifest)
        except Exception as e:
            if created:
                unlink(blob)
            raise FetchError(f"could not write the manifest {mpath} for {ref}: {e}") from e
    status(f"{ref}: {blob}", progress=progress)
    return blob


def pull(
    name: str,
    progress: bool = True,
    *,
    insecure: bool = False,
    update: bool = False,
    events: Callable[[dict[str, Any]], None] | None = None,
) -> Path:
    """Fetch `name` into the store if it is not there; returns the model blob's path.

    A no-op when the manifest and a blob of the recorded size are present. Otherwise the
    model comes from its catalogue entry (or, for a damaged model outside the catalogue,
    from the source its manifest recorded); a registry name `host/ns/name:tag` comes from
    that registry (plain HTTP for loopback hosts or with `insecure`); with `update`, a
    registry name present in the store is checked against the registry, as `ollama pull`
    does, and a changed model replaces the old (whose blobs no other model uses are removed).
    Progress goes to
    stderr when `progress`. Raises `InvalidModelNameError`, `ModelNotFoundError` (unknown
    name) or `FetchError`.

    `events`, if given, receives progress events shaped like Ollama's `/api/pull` stream:
    `{"status": "pulling manifest"}`, `{"status": "pulling <12 hex>", "digest", "total",
    "completed"}` (repeatedly, per blob), `{"status": "verifying sha256 digest"}`,
    `{"status": "writing manifest"}`, and finally `{"status": "success"}`.
    """
    token = events_sink.set(events)
    try:
        path = _pull_name(name, progress, insecure, update)
    finally:
        events_sink.reset(token)
    if events is not None:
        events({"status": "success"})
    return path


def _pull_name(name: str, progress: bool, insecure: bool, update: bool) -> Path:
    ref = parse_name(name)
    root = store_dir()
    entry = read_entry(root, ref)
    if entry is not None and blob_ok(entry) and not (update and ref.host):
        _present_events(entry)
        return entry.path
    if ref.host:
        path = _pull_registry(root, ref, progress, default_scheme(ref.host, insecure))
        if entry is not None:
            drop_unreferenced(root, referenced(entry))
        return path
    cat = lookup(ref)
    if cat is not None:
        return _pull(root, ref, cat.sha256, cat.size, cat.source, progress)
    if entry is not None and entry.source is not None:
        source = source_from_json(entry.source)
        return _pull(root, ref, entry.digest.removeprefix("sha256:"), entry.size, source, progress)
    raise ModelNotFoundError(unknown_message(ref, root))


def _present_events(entry) -> None:
    """The events of a pull that finds everything present, as `ollama pull` of a model
    it has streams them: the manifest, each layer complete, verification, the manifest
    written (nothing is fetched or rewritten here)."""
    if events_sink.get() is None:
        return
    emit(status="pulling manifest")
    layers = (  # Ollama's order: the layers, then the config
        [(x.digest, x.size) for x in (*entry.manifest.layers, entry.manifest.config)]
        if entry.manifest is not None
        else [(entry.digest, entry.size)]
    )
    for digest, size in layers:
        blob_event(digest, size, size)
    emit(status="verifying sha256 digest")
    emit(status="writing manifest")


def _pull_registry(root: Path, ref: ModelRef, progress: bool, scheme: str) -> Path:
    """Pull `host/ns/name:tag`: the manifest, every blob (verified, resumable), then the
    manifest into `manifests/<host>/<ns>/<name>/<tag>`, Ollama's shape and place."""
    assert ref.host is not None
    registry = Registry.shared(ref.host, scheme)
    status(f"pulling manifest of {ref} from {registry.base}", progress=progress)
    emit(status="pulling manifest")
    man, _ = registry.manifest(ref.remote_repository, ref.tag)
    model = man.model()
    for layer in (*man.layers, man.config):  # Ollama's order: the layers, then the config
        hexdigest = blob_path(layer.digest, root).name.removeprefix("sha256-")
        source = OciBlobSource(ref.host, ref.remote_repository, layer.digest, layer.size, scheme)
        with lock(root, f"sha256-{hexdigest}", f"pulling {layer.digest}", progress=progress):
            fetch_blob(root, ref, hexdigest, layer.size, source, progress and layer.size > 1 << 20)
    emit(status="verifying sha256 digest")
    for layer in man.blobs():  # still all there (a concurrent gc() or rm of another name?)
        got = blob_path(layer.digest, root)
        if not got.is_file() or got.stat().st_size != layer.size:
            raise FetchError(f"{got} disappeared or changed while {ref} was pulled; pull again")
    emit(status="writing manifest")
    mpath = manifest_path(manifests_dir(root), ref)
    try:
        atomic_write_bytes(mpath, man.dumps())
    except Exception as e:
        raise FetchError(f"could not write the manifest {mpath} for {ref}: {e}") from e
    blob = blob_path(model.digest, root)
    status(f"{ref}: {blob}", progress=progress)
    return blob


# --- resolving ------------------------------------------------------------------------------


def looks_like_path(text: str) -> bool:
    return (
        text.lower().endswith(".gguf")
        or text.startswith(("/", "./", "../", "~", ".\\", "..\\"))
        or "\\" in text
        or text in (".", "..")
    )


def resolve(
    name_or_path: str | os.PathLike[str],
    progress: bool = True,
    *,
    elsewhere: Callable[[str], Path | None] | None = None,
) -> Path:
    """A model file for a path or a store name.

    An existing file → that path. A path-like string (ends in `.gguf`, starts with `/`,
    `./`, `~`, ...) that is not a file → `ModelNotFoundError`. Otherwise a store name:
    the stored blob, pulled first if it is in the catalogue and missing; a name that is
    neither in the store nor in the catalogue is offered to `elsewhere` (another store:
    `llamay.library.resolve` passes the local Ollama store's lookup) before a registry name
    is pulled; an unknown name → `ModelNotFoundError` listing the known names.
    """
    is_pathlike = isinstance(name_or_path, os.PathLike)
    text = os.fspath(name_or_path)
    if not isinstance(text, str):
        raise InvalidModelNameError(f"invalid model name or path {name_or_path!r}")
    path = Path(text).expanduser() if "\0" not in text else None
    if path is not None:
        try:
            if path.is_file():
                return path
            if is_pathlike or looks_like_path(text):
                what = "is not a file" if path.exists() else "does not exist"
                raise ModelNotFoundError(f"model file {text} {what}")
        except OSError:  # a name too long for the OS, etc.: try it as a name below
            pass
    ref = parse_name(text)
    entry = read_entry(store_dir(), ref)
    if elsewhere is not None and (entry is None or not blob_ok(entry)) and lookup(ref) is None:
        found = elsewhere(text)
        if found is not None:
            status(f"{text}: using the blob {found} in place", progress=progress)
            return found
    return pull(text, progress=progress)
