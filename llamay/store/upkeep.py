"""Removing and copying names, and collecting garbage: blobs no manifest uses, partial
downloads and partial KV snapshot saves that no live process holds."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from llamay.errors import FetchError, ModelNotFoundError
from llamay.files import (
    PARTIAL_MARK,
    atomic_write_bytes,
    atomic_write_json,
    remove_if_unlocked,
    unlink,
)
from llamay.store import manifest as media
from llamay.store.blobs import (
    PARTIAL_PREFIX,
    blob_path,
    blobs_dir,
    lock,
    manifests_dir,
    partial_hex,
    partial_in_use,
    put_blob,
    store_dir,
)
from llamay.store.entries import (
    MANIFEST_SCHEMA,
    ModelEntry,
    blob_ok,
    list_models,
    read_entry,
    referenced,
    scan,
)
from llamay.store.manifest import Layer, Manifest
from llamay.store.names import manifest_path, parse_name
from llamay.store.source import SOURCE_KINDS

#: `gc()` leaves unreferenced blobs younger than this alone (a pull may be about to use them).
GC_GRACE_S = 3600


def remove(name: str) -> None:
    """Delete a model's manifest, and each of its blobs that no other manifest uses."""
    ref = parse_name(name)
    root = store_dir()
    manifests = manifests_dir(root)
    mpath = manifest_path(manifests, ref)
    if not mpath.is_file():
        raise ModelNotFoundError(f"model {ref} is not in the store {root}")
    entry = read_entry(root, ref)
    if entry is None:  # malformed: the manifest goes, blobs stay (gc() collects them)
        unlink(mpath)
    else:
        drop_unreferenced(root, referenced(entry), before=lambda: unlink(mpath))
    _prune_dirs(mpath.parent, manifests)


def drop_unreferenced(
    root: Path, digests: set[str], before: Callable[[], None] | None = None
) -> None:
    """Under their locks (after `before()`), delete those of `digests` no manifest uses."""
    with contextlib.ExitStack() as stack:
        for d in sorted(digests):
            key = f"sha256-{d.removeprefix('sha256:')}"
            stack.enter_context(lock(root, key, f"using {d}", progress=False))
        if before is not None:
            before()
        in_use = set().union(*(referenced(m) for m in list_models(root)))
        for d in sorted(digests - in_use):
            unlink(blob_path(d, root))


def _prune_dirs(parent: Path, manifests: Path) -> None:
    while parent != manifests:
        try:
            parent.rmdir()
        except OSError:
            break
        parent = parent.parent


def copy(src: str, dst: str) -> ModelEntry:
    """Give the model `src` a second name `dst` (no blob is copied), as `ollama cp` does.

    Between names of one kind the manifest is copied as it is. A catalogue/local name
    copied to a registry name gets an Ollama manifest (with a generated config blob); a
    registry name copied to a local name keeps its layers inside the local manifest.
    Raises `ModelNotFoundError` when `src` is not in the store.
    """
    sref, dref = parse_name(src), parse_name(dst)
    root = store_dir()
    entry = read_entry(root, sref)
    if entry is None or not blob_ok(entry):
        raise ModelNotFoundError(f"model {sref} is not (completely) in the store {root}")
    dpath = manifest_path(manifests_dir(root), dref)
    if dref.host:
        man = entry.manifest
        if man is None:
            config = json.dumps(
                {"model_format": "gguf", "os": "linux", "architecture": "amd64"},
                separators=(",", ":"),
            ).encode()
            man = Manifest(
                config=put_blob(root, config, media.CONFIG),
                layers=(Layer(media.MODEL, entry.digest, entry.size),),
            )
        atomic_write_bytes(dpath, man.dumps())
    else:
        data: dict[str, Any] = {
            "schema_version": MANIFEST_SCHEMA,
            "name": dref.repository,
            "tag": dref.tag,
            "digest": entry.digest,
            "size": entry.size,
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "copied_from": str(sref),
        }
        if entry.source is not None and entry.source.get("kind") in SOURCE_KINDS:
            data["source"] = entry.source
        if entry.manifest is not None:
            data["manifest"] = entry.manifest.to_json()
        atomic_write_json(dpath, data)
    result = read_entry(root, dref)
    assert result is not None
    return result


def gc(root: Path | None = None, grace_s: float = GC_GRACE_S) -> list[Path]:
    """Remove blobs no manifest references, and partial files no live process holds
    (`blobs/.partial-*`, `kv/*.partial*`); returns what was removed.

    Blobs modified less than `grace_s` seconds ago are kept: a pull in progress writes its
    blobs before its manifest. While any manifest is malformed no blob is removed (what it
    references is unknown): `FetchError` names it, to be fixed or removed first.
    """
    root = store_dir() if root is None else root
    removed = _dead_snapshot_partials(root / "kv")
    blobs = blobs_dir(root)
    if not blobs.is_dir():
        return removed
    removed += _dead_blob_partials(root, grace_s)
    entries, bad = scan(root)
    if bad:
        raise FetchError(
            "not collecting garbage while manifests are malformed (the blobs they name are "
            "unknown): " + "; ".join(f"{p}: {e}" for p, e in bad)
        )
    in_use = set().union(*(referenced(m) for m in entries))
    now = time.time()
    for p in sorted(blobs.iterdir()):
        if not p.name.startswith("sha256-"):
            continue
        digest = "sha256:" + p.name.removeprefix("sha256-")
        if digest in in_use:
            continue
        with lock(root, p.name, f"using {digest}", progress=False):
            if digest in set().union(*(referenced(m) for m in scan(root)[0])):
                continue
            with contextlib.suppress(OSError):
                if now - p.stat().st_mtime >= grace_s:
                    unlink(p)
                    removed.append(p)
    return removed


def _dead_blob_partials(root: Path, grace_s: float) -> list[Path]:
    """`.partial-<hex>` whose digest lock is free (its pull died); partials of another
    name (older llamay versions) once older than `grace_s`."""
    removed = []
    now = time.time()
    for p in sorted(blobs_dir(root).glob(f"{PARTIAL_PREFIX}*")):
        legacy = partial_hex(p) is None
        with contextlib.suppress(OSError):
            if legacy and now - p.stat().st_mtime <= grace_s:
                continue
            if not partial_in_use(root, p):
                unlink(p)
                removed.append(p)
    return removed


def _dead_snapshot_partials(kv: Path) -> list[Path]:
    """KV snapshot saves that died before their rename (`llamay.kv.snapshot` writes them
    locked; the `tmp*.partial` of older versions never are)."""
    if not kv.is_dir():
        return []
    return [
        p
        for p in sorted(kv.iterdir())
        if PARTIAL_MARK in p.name and p.is_file() and remove_if_unlocked(p)
    ]
