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
    resolve(name_or_path) -> Path           a GGUF file path, or a store name (pulled if needed;
                                            a local Ollama store's blob for unknown names)
    list_models() -> list[ModelEntry]
    remove(name)
    copy(src, dst)                          another name for the same blobs
    create(name, modelfile, directory)      a model from a Modelfile (FROM + TEMPLATE/...)
    gc() -> list[Path]                      remove blobs no manifest references
    store_dir() -> Path
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import os
import re
import secrets
import shutil
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

from llamay.errors import FetchError, InvalidModelNameError, LlamayError, ModelNotFoundError
from llamay.store import manifest as media
from llamay.store.catalog import CATALOG, DEFAULT_MODEL, CatalogEntry, known_names, lookup, suggest
from llamay.store.manifest import Layer, Manifest
from llamay.store.names import ModelRef, contained_path, manifest_path, parse_name
from llamay.store.oci import OciBlobSource, Registry, TransientFetchError, default_scheme
from llamay.store.source import SOURCE_KINDS, Source, register_source, source_from_json, status
from llamay.store.wheel import WheelPart, WheelSource, wheel_cache_dir

__all__ = [
    "CATALOG",
    "DEFAULT_MODEL",
    "SOURCE_KINDS",
    "CatalogEntry",
    "Layer",
    "Manifest",
    "ModelEntry",
    "ModelRef",
    "OciBlobSource",
    "Source",
    "WheelPart",
    "WheelSource",
    "blob_path",
    "copy",
    "create",
    "gc",
    "known_names",
    "list_models",
    "parse_name",
    "pull",
    "register_source",
    "remove",
    "resolve",
    "source_from_json",
    "store_dir",
    "wheel_cache_dir",
]

MANIFEST_SCHEMA = 1
_HEX64 = re.compile(r"[0-9a-f]{64}")
_PARTIAL_PREFIX = ".partial-"
_STALE_PARTIAL_S = 24 * 3600
#: How often one pull retries a broken-off resumable download before giving up.
RESUME_ATTEMPTS = 3
#: `gc()` leaves unreferenced blobs younger than this alone (a pull may be about to use them).
GC_GRACE_S = 3600


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


# --- layout ---------------------------------------------------------------------------


def store_dir() -> Path:
    """The store's root: `$LLAMAY_HOME`, default `~/.llamay` (not created here)."""
    env = os.environ.get("LLAMAY_HOME")
    return Path(env).expanduser() if env else Path.home() / ".llamay"


def _blobs(root: Path) -> Path:
    return root / "blobs"


def _manifests(root: Path) -> Path:
    return root / "manifests"


def blob_path(digest: str, root: Path | None = None) -> Path:
    """The blob file for `sha256:<hex>` (or bare `<hex>`); it need not exist."""
    hexdigest = digest.removeprefix("sha256:")
    if not _HEX64.fullmatch(hexdigest):
        raise FetchError(f"malformed digest {digest!r}: expected sha256:<64 lowercase hex digits>")
    root = store_dir() if root is None else root
    return contained_path(_blobs(root), f"sha256-{hexdigest}")


# --- small filesystem helpers ----------------------------------------------------------


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError, AttributeError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        try:
            path.unlink()
        except PermissionError:  # read-only blobs on Windows
            os.chmod(path, 0o644)
            path.unlink()


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `path` so that readers see the old file or the whole new one (temp, fsync,
    rename, fsync of the directory)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(6)}")
    try:
        with open(tmp, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _atomic_write_json(path: Path, data: dict[str, Any]) -> None:
    _atomic_write_bytes(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())


@contextlib.contextmanager
def _lock(root: Path, key: str, what: str, *, progress: bool) -> Iterator[None]:
    """An exclusive advisory lock on `locks/<key>.lock` (blocking, with a message if busy)."""
    locks = root / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    fd = os.open(locks / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            import fcntl
        except ImportError:  # Windows
            import msvcrt

            while True:
                try:
                    msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
                    break
                except OSError:
                    time.sleep(0.2)
            try:
                yield
            finally:
                os.lseek(fd, 0, os.SEEK_SET)
                msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            status(f"waiting for another process {what}", progress=progress)
            fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


#: Where `pull(..., events=...)` sends its progress events (see `pull`).
_events: contextvars.ContextVar[Callable[[dict[str, Any]], None] | None] = contextvars.ContextVar(
    "llamay_store_events", default=None
)
_EVENT_INTERVAL_S = 0.1


def _emit(**event: Any) -> None:
    callback = _events.get()
    if callback is not None:
        callback(event)


def _blob_event(digest: str, total: int | None, completed: int) -> None:
    hexdigest = digest.removeprefix("sha256:")
    _emit(
        status=f"pulling {hexdigest[:12]}",
        digest=f"sha256:{hexdigest}",
        total=total,
        completed=completed,
    )


class _HashingWriter:
    """Writes to a file, hashing as it goes; refuses to grow past `limit` bytes. Reports
    progress events (at most every 0.1 s) when a pull asked for them."""

    def __init__(self, f: Any, limit: int | None, what: str, digest: str = ""):
        self._f = f
        self._limit = limit
        self._what = what
        self._digest = digest
        self._report = bool(digest) and _events.get() is not None
        self._last = 0.0
        self.sha256 = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes, /) -> int:
        n = len(data)
        if self._limit is not None and self.size + n > self._limit:
            raise FetchError(f"{self._what} produced more than the expected {self._limit} bytes")
        self._f.write(data)
        self.sha256.update(data)
        self.size += n
        if self._report:
            now = time.monotonic()
            if now - self._last >= _EVENT_INTERVAL_S or self.size == self._limit:
                self._last = now
                _blob_event(self._digest, self._limit, self.size)
        return n


def _sweep_stale_partials(blobs: Path) -> None:
    now = time.time()
    with contextlib.suppress(OSError):
        for p in blobs.iterdir():
            if p.name.startswith(_PARTIAL_PREFIX):
                with contextlib.suppress(OSError):
                    if now - p.stat().st_mtime > _STALE_PARTIAL_S:
                        p.unlink()


# --- manifests ----------------------------------------------------------------------------


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


def _read_entry(root: Path, ref: ModelRef) -> ModelEntry | None:
    """The manifest's entry for `ref`, or None if there is no (readable) manifest."""
    path = manifest_path(_manifests(root), ref)
    if not path.is_file():
        return None
    try:
        return _parse_manifest(path, ref, root)
    except (OSError, ValueError, LlamayError) as e:
        warnings.warn(f"ignoring malformed manifest {path}: {e}", stacklevel=3)
        return None


def _blob_ok(entry: ModelEntry) -> bool:
    """The model blob (and, for a registry manifest, every layer) is there at its size."""
    blobs = [(entry.path, entry.size)]
    if entry.manifest is not None and entry.source and entry.source.get("kind") == "registry":
        blobs += [(entry.path.parent / f"sha256-{x.hex}", x.size) for x in entry.manifest.blobs()]
    try:
        return all(p.is_file() and p.stat().st_size == n for p, n in blobs)
    except OSError:
        return False


# --- pulling --------------------------------------------------------------------------------


def _fetch_blob(
    root: Path, ref: ModelRef, sha256: str, size: int | None, source: Source, progress: bool
) -> tuple[Path, int, bool]:
    """Make sure `blobs/sha256-<sha256>` exists; returns (path, size, created_now).

    Caller holds the digest lock. A resumable source writes into `.partial-<sha256>`, which
    survives an interruption and is continued from where it stopped.
    """
    blobs = _blobs(root)
    blobs.mkdir(parents=True, exist_ok=True)
    blob = blob_path(sha256, root)
    if blob.is_file():
        actual = blob.stat().st_size
        if size is None or actual == size:
            _blob_event(sha256, actual, actual)
            return blob, actual, False
        if _sha256_file(blob) == sha256:
            # the blob is intact (its bytes hash to its name): the size claim is wrong, and
            # deleting the blob would break every model that uses it
            raise FetchError(
                f"{source.describe()} says {ref}'s blob sha256:{sha256} has {size} bytes, but "
                f"the verified blob {blob} has {actual}; refusing the inconsistent description"
            )
        status(
            f"{blob} is damaged ({actual} bytes, expected {size}); fetching again",
            progress=progress,
        )
        _unlink(blob)
    _sweep_stale_partials(blobs)
    resumable = bool(getattr(source, "resumable", False))
    if resumable:
        tmp = blobs / f"{_PARTIAL_PREFIX}{sha256}"
        have = tmp.stat().st_size if tmp.is_file() else 0
        if size is not None and have > size:
            _unlink(tmp)
            have = 0
    else:
        tmp = blobs / f"{_PARTIAL_PREFIX}{sha256[:12]}-{secrets.token_hex(6)}"
        have = 0
    if size is not None:
        free = shutil.disk_usage(blobs).free
        if free < size - have:
            raise FetchError(
                f"not enough disk space for {ref} in {blobs}: need {size - have} bytes, {free} free"
            )
    verb = f"resuming at byte {have}" if have else "pulling"
    status(f"{verb} {ref} from {source.describe()}", progress=progress)
    keep = False
    try:
        try:
            with open(tmp, "ab" if resumable else "xb") as f:
                writer = _HashingWriter(f, size, f"{source.describe()}", sha256)
                if have:
                    _rehash(tmp, have, writer)
                _blob_event(sha256, size, writer.size)
                if resumable:
                    _fetch_resuming(source, writer, f, progress)
                else:
                    source.fetch(writer, progress=progress)
                f.flush()
                os.fsync(f.fileno())
        except TransientFetchError as e:
            keep = resumable
            raise FetchError(
                f"pulling {ref}: {e}; gave up after {RESUME_ATTEMPTS} attempts"
                + ("; run the pull again to resume" if keep else "")
            ) from e
        except FetchError:
            raise
        except (KeyboardInterrupt, SystemExit):
            keep = resumable
            raise
        except Exception as e:
            raise FetchError(
                f"pulling {ref} from {source.describe()} failed: {type(e).__name__}: {e}"
            ) from e
        if size is not None and writer.size != size:
            raise FetchError(
                f"{ref} from {source.describe()}: got {writer.size} bytes, expected {size}"
            )
        _blob_event(sha256, size, writer.size)
        got = writer.sha256.hexdigest()
        if got != sha256:
            dropped = source.invalidate_cache()
            raise FetchError(
                f"checksum mismatch for {ref} from {source.describe()}: expected sha256 "
                f"{sha256}, got {got}"
                + ("; the cached download was removed, a retry fetches it again" if dropped else "")
            )
        try:
            os.chmod(tmp, 0o444)
            os.replace(tmp, blob)
        except OSError as e:
            raise FetchError(f"could not move the verified blob into {blob}: {e}") from e
        _fsync_dir(blobs)
        return blob, writer.size, True
    finally:
        if not keep:
            _unlink(tmp)


def _rehash(path: Path, n: int, writer: _HashingWriter) -> None:
    """Account for the first `n` bytes already in a partial file (hash them, count them)."""
    with open(path, "rb") as f:
        left = n
        while left:
            chunk = f.read(min(left, 1 << 20))
            if not chunk:
                raise FetchError(f"{path} shrank while being resumed")
            writer.sha256.update(chunk)
            writer.size += len(chunk)
            left -= len(chunk)


def _fetch_resuming(source: Source, writer: _HashingWriter, f: Any, progress: bool) -> None:
    """`source.fetch` from `writer.size`, retrying a broken-off download from where it stopped."""
    for attempt in range(RESUME_ATTEMPTS):
        try:
            source.fetch(writer, progress=progress, offset=writer.size)  # type: ignore[call-arg]
            return
        except TransientFetchError as e:
            f.flush()
            if attempt + 1 == RESUME_ATTEMPTS:
                raise
            status(f"{e}; resuming at byte {writer.size}", progress=progress)
            time.sleep(0.2 * (attempt + 1))


def _pull(
    root: Path, ref: ModelRef, sha256: str, size: int | None, source: Source, progress: bool
) -> Path:
    mpath = manifest_path(_manifests(root), ref)
    with _lock(root, f"sha256-{sha256}", f"pulling {ref}", progress=progress):
        entry = _read_entry(root, ref)
        if entry is not None and entry.digest == f"sha256:{sha256}" and _blob_ok(entry):
            return entry.path  # another process finished it while we waited
        blob, actual, created = _fetch_blob(root, ref, sha256, size, source, progress)
        _emit(status="writing manifest")
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
            _atomic_write_json(mpath, manifest)
        except Exception as e:
            if created:
                _unlink(blob)
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
    token = _events.set(events)
    try:
        path = _pull_name(name, progress, insecure, update)
    finally:
        _events.reset(token)
    if events is not None:
        events({"status": "success"})
    return path


def _pull_name(name: str, progress: bool, insecure: bool, update: bool) -> Path:
    ref = parse_name(name)
    root = store_dir()
    entry = _read_entry(root, ref)
    if entry is not None and _blob_ok(entry) and not (update and ref.host):
        return entry.path
    if ref.host:
        path = _pull_registry(root, ref, progress, default_scheme(ref.host, insecure))
        if entry is not None:
            _drop_unreferenced(root, _referenced(entry))
        return path
    cat = lookup(ref)
    if cat is not None:
        return _pull(root, ref, cat.sha256, cat.size, cat.source, progress)
    if entry is not None and entry.source is not None:
        source = source_from_json(entry.source)
        return _pull(root, ref, entry.digest.removeprefix("sha256:"), entry.size, source, progress)
    raise ModelNotFoundError(_unknown_message(ref, root))


def _pull_registry(root: Path, ref: ModelRef, progress: bool, scheme: str) -> Path:
    """Pull `host/ns/name:tag`: the manifest, every blob (verified, resumable), then the
    manifest into `manifests/<host>/<ns>/<name>/<tag>`, Ollama's shape and place."""
    assert ref.host is not None
    registry = Registry.shared(ref.host, scheme)
    status(f"pulling manifest of {ref} from {registry.base}", progress=progress)
    _emit(status="pulling manifest")
    man, _ = registry.manifest(ref.remote_repository, ref.tag)
    model = man.model()
    for layer in man.blobs():
        hexdigest = blob_path(layer.digest, root).name.removeprefix("sha256-")
        source = OciBlobSource(ref.host, ref.remote_repository, layer.digest, layer.size, scheme)
        with _lock(root, f"sha256-{hexdigest}", f"pulling {layer.digest}", progress=progress):
            _fetch_blob(root, ref, hexdigest, layer.size, source, progress and layer.size > 1 << 20)
    _emit(status="verifying sha256 digest")
    for layer in man.blobs():  # still all there (a concurrent gc() or rm of another name?)
        got = blob_path(layer.digest, root)
        if not got.is_file() or got.stat().st_size != layer.size:
            raise FetchError(f"{got} disappeared or changed while {ref} was pulled; pull again")
    _emit(status="writing manifest")
    mpath = manifest_path(_manifests(root), ref)
    try:
        _atomic_write_bytes(mpath, man.dumps())
    except Exception as e:
        raise FetchError(f"could not write the manifest {mpath} for {ref}: {e}") from e
    blob = blob_path(model.digest, root)
    status(f"{ref}: {blob}", progress=progress)
    return blob


def _unknown_message(ref: ModelRef, root: Path) -> str:
    local = [m.name for m in list_models(root)]
    names = sorted(set(known_names()) | set(local))
    hint = suggest(ref, names)
    msg = f"unknown model {str(ref)!r}"
    if hint:
        msg += f" (did you mean {', '.join(hint)}?)"
    return (
        msg + f"; known models: {', '.join(names) or '(none)'}. A path to a .gguf file works too."
    )


# --- resolving ------------------------------------------------------------------------------


def _looks_like_path(text: str) -> bool:
    return (
        text.lower().endswith(".gguf")
        or text.startswith(("/", "./", "../", "~", ".\\", "..\\"))
        or "\\" in text
        or text in (".", "..")
    )


def resolve(name_or_path: str | os.PathLike[str], progress: bool = True) -> Path:
    """A model file for a path or a store name.

    An existing file → that path. A path-like string (ends in `.gguf`, starts with `/`,
    `./`, `~`, ...) that is not a file → `ModelNotFoundError`. Otherwise a store name:
    the stored blob, pulled first if it is in the catalogue and missing; a name that is
    neither in the store nor in the catalogue is looked up in a local Ollama store
    (`llamay.ollama`: its blob is used in place, read-only) before a registry name is pulled;
    an unknown name → `ModelNotFoundError` listing the known names.
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
            if is_pathlike or _looks_like_path(text):
                what = "is not a file" if path.exists() else "does not exist"
                raise ModelNotFoundError(f"model file {text} {what}")
        except OSError:  # a name too long for the OS, etc.: try it as a name below
            pass
    ref = parse_name(text)
    entry = _read_entry(store_dir(), ref)
    if (entry is None or not _blob_ok(entry)) and lookup(ref) is None:
        found = _in_ollama_store(text)
        if found is not None:
            status(f"{text}: using the Ollama store's blob {found}", progress=progress)
            return found
    return pull(text, progress=progress)


def _in_ollama_store(name: str) -> Path | None:
    """The model blob of `name` in a local Ollama store, if there is one and it has it."""
    from llamay import ollama

    if ollama.find_store() is None:
        return None
    try:
        return ollama.resolve(name).model_path
    except LlamayError:
        return None


# --- listing and removing ------------------------------------------------------------------


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
    entries, bad = _scan(store_dir() if root is None else root)
    for path, e in bad:
        warnings.warn(f"ignoring malformed manifest {path}: {e}", stacklevel=2)
    return entries


def _scan(root: Path) -> tuple[list[ModelEntry], list[tuple[Path, Exception]]]:
    """(the readable models sorted by name, the malformed manifests with their errors)."""
    manifests = _manifests(root)
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


def _referenced(entry: ModelEntry) -> set[str]:
    """Every digest (`sha256:<hex>`) a model's manifest references."""
    refs = {entry.digest}
    if entry.manifest is not None:
        refs |= {x.digest for x in entry.manifest.blobs()}
    return refs


def remove(name: str) -> None:
    """Delete a model's manifest, and each of its blobs that no other manifest uses."""
    ref = parse_name(name)
    root = store_dir()
    manifests = _manifests(root)
    mpath = manifest_path(manifests, ref)
    if not mpath.is_file():
        raise ModelNotFoundError(f"model {ref} is not in the store {root}")
    entry = _read_entry(root, ref)
    if entry is None:  # malformed: the manifest goes, blobs stay (gc() collects them)
        _unlink(mpath)
    else:
        _drop_unreferenced(root, _referenced(entry), before=lambda: _unlink(mpath))
    _prune_dirs(mpath.parent, manifests)


def _drop_unreferenced(
    root: Path, digests: set[str], before: Callable[[], None] | None = None
) -> None:
    """Under their locks (after `before()`), delete those of `digests` no manifest uses."""
    with contextlib.ExitStack() as stack:
        for d in sorted(digests):
            key = f"sha256-{d.removeprefix('sha256:')}"
            stack.enter_context(_lock(root, key, f"using {d}", progress=False))
        if before is not None:
            before()
        in_use = set().union(*(_referenced(m) for m in list_models(root)))
        for d in sorted(digests - in_use):
            _unlink(blob_path(d, root))


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
    entry = _read_entry(root, sref)
    if entry is None or not _blob_ok(entry):
        raise ModelNotFoundError(f"model {sref} is not (completely) in the store {root}")
    dpath = manifest_path(_manifests(root), dref)
    if dref.host:
        man = entry.manifest
        if man is None:
            config = json.dumps(
                {"model_format": "gguf", "os": "linux", "architecture": "amd64"},
                separators=(",", ":"),
            ).encode()
            man = Manifest(
                config=_put_blob(root, config, media.CONFIG),
                layers=(Layer(media.MODEL, entry.digest, entry.size),),
            )
        _atomic_write_bytes(dpath, man.dumps())
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
        _atomic_write_json(dpath, data)
    result = _read_entry(root, dref)
    assert result is not None
    return result


def _put_blob(root: Path, data: bytes, media_type: str) -> Layer:
    """Store a small blob (from memory) under its digest; returns its layer."""
    hexdigest = hashlib.sha256(data).hexdigest()
    blob = blob_path(hexdigest, root)
    with _lock(root, f"sha256-{hexdigest}", "writing a blob", progress=False):
        if not blob.is_file():
            _atomic_write_bytes(blob, data)
            os.chmod(blob, 0o444)
    return Layer(media_type, f"sha256:{hexdigest}", len(data))


def gc(root: Path | None = None, grace_s: float = GC_GRACE_S) -> list[Path]:
    """Remove blobs no manifest references (and stale partial downloads); returns them.

    Blobs modified less than `grace_s` seconds ago are kept: a pull in progress writes its
    blobs before its manifest. While any manifest is malformed nothing is removed (what it
    references is unknown): `FetchError` names it, to be fixed or removed first.
    """
    root = store_dir() if root is None else root
    blobs = _blobs(root)
    if not blobs.is_dir():
        return []
    entries, bad = _scan(root)
    if bad:
        raise FetchError(
            "not collecting garbage while manifests are malformed (the blobs they name are "
            "unknown): " + "; ".join(f"{p}: {e}" for p, e in bad)
        )
    in_use = set().union(*(_referenced(m) for m in entries))
    now = time.time()
    removed = []
    for p in sorted(blobs.iterdir()):
        if p.name.startswith(_PARTIAL_PREFIX):
            with contextlib.suppress(OSError):
                if now - p.stat().st_mtime > max(grace_s, _STALE_PARTIAL_S):
                    _unlink(p)
                    removed.append(p)
            continue
        if not p.name.startswith("sha256-"):
            continue
        digest = "sha256:" + p.name.removeprefix("sha256-")
        if digest in in_use:
            continue
        with _lock(root, p.name, f"using {digest}", progress=False):
            if digest in set().union(*(_referenced(m) for m in _scan(root)[0])):
                continue
            with contextlib.suppress(OSError):
                if now - p.stat().st_mtime >= grace_s:
                    _unlink(p)
                    removed.append(p)
    return removed


# --- create ------------------------------------------------------------------------------------


@register_source
@dataclass(frozen=True)
class FileSource(Source):
    """A local file (what `create` imports from `FROM ./model.gguf`)."""

    kind: ClassVar[str] = "file"
    path: str

    def describe(self) -> str:
        return f"file {self.path}"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": self.path}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FileSource:
        if not isinstance(data.get("path"), str):
            raise FetchError(f"malformed file source {data!r}")
        return cls(data["path"])

    def fetch(self, sink: Any, *, progress: bool = True) -> None:
        try:
            with open(self.path, "rb") as f:
                while chunk := f.read(1 << 20):
                    sink.write(chunk)
        except OSError as e:
            raise FetchError(f"cannot read {self.path}: {e}") from e


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _import_file(root: Path, ref: ModelRef, path: Path, progress: bool) -> Layer:
    """Copy a file into the store's blobs (verified); returns its model layer."""
    try:
        hexdigest, size = _sha256_file(path), path.stat().st_size
    except OSError as e:
        raise ModelNotFoundError(f"cannot read the model file {path}: {e}") from e
    with _lock(root, f"sha256-{hexdigest}", f"importing {path}", progress=progress):
        _fetch_blob(root, ref, hexdigest, size, FileSource(str(path)), progress)
    return Layer(media.MODEL, f"sha256:{hexdigest}", size)


def _base_layers(
    root: Path, ref: ModelRef, base: str, directory: Path, progress: bool
) -> tuple[Layer, tuple[Layer, ...]]:
    """The model layer and inherited layers for `FROM base`: a GGUF path, a model of this
    store (or the catalogue), or a model of the local Ollama store."""
    candidate = Path(base).expanduser()
    if not candidate.is_absolute():
        candidate = directory / candidate
    if candidate.is_file() or _looks_like_path(base):
        if not candidate.is_file():
            raise ModelNotFoundError(f"FROM {base}: {candidate} is not a file")
        return _import_file(root, ref, candidate, progress), ()
    try:
        base_ref: ModelRef | None = parse_name(base)
    except InvalidModelNameError:
        base_ref = None  # perhaps an Ollama name (they allow upper case)
    if base_ref is not None:
        entry = _read_entry(root, base_ref)
        if (entry is None or not _blob_ok(entry)) and lookup(base_ref) is not None:
            pull(base, progress=progress)
            entry = _read_entry(root, base_ref)
        if entry is not None and _blob_ok(entry):
            model = Layer(media.MODEL, entry.digest, entry.size)
            layers = entry.manifest.layers if entry.manifest is not None else ()
            return model, tuple(x for x in layers if x.media_type != media.MODEL)
    from llamay import ollama

    if ollama.find_store() is None:
        if base_ref is None:
            parse_name(base)  # raises the name error
        raise ModelNotFoundError(_unknown_message(base_ref, root))  # type: ignore[arg-type]
    om = ollama.resolve(base)
    inherited = [
        _put_blob(root, text.encode(), mt)
        for text, mt in ((om.template, media.TEMPLATE), (om.system, media.SYSTEM))
        if text is not None
    ]
    if om.params:
        params = json.dumps(om.params, separators=(",", ":"), sort_keys=True) + "\n"
        inherited.append(_put_blob(root, params.encode(), media.PARAMS))
    inherited += [_put_blob(root, text.encode(), media.LICENSE) for text in om.license]
    return _import_file(root, ref, om.model_path, progress), tuple(inherited)


def create(
    name: str,
    modelfile: str,
    directory: str | os.PathLike[str] | None = None,
    progress: bool = True,
) -> ModelEntry:
    """Create `name` from a Modelfile's text (`llamay.store.modelfile`), like `ollama create`.

    `FROM` is a GGUF path (relative to `directory`, default the current directory; the file
    is copied into the store), a model of this store or the catalogue, or a model of the
    local Ollama store; its template/system/params/license layers are inherited, and the
    Modelfile's own replace them (parameters merge, the Modelfile's winning). A registry
    name gets an Ollama manifest; another name a llamay manifest carrying the layers.
    Raises `ModelfileError`, `ModelNotFoundError`, `InvalidModelNameError` or `FetchError`.
    """
    from llamay.store.modelfile import parse as parse_modelfile

    mf = parse_modelfile(modelfile)
    ref = parse_name(name)
    root = store_dir()
    base_dir = Path(directory) if directory is not None else Path.cwd()
    model, inherited = _base_layers(root, ref, mf.base, base_dir, progress)
    by_type = {x.media_type: x for x in inherited if x.media_type != media.LICENSE}
    licenses = [x for x in inherited if x.media_type == media.LICENSE]
    if mf.template is not None:
        by_type[media.TEMPLATE] = _put_blob(root, mf.template.encode(), media.TEMPLATE)
    if mf.system is not None:
        by_type[media.SYSTEM] = _put_blob(root, mf.system.encode(), media.SYSTEM)
    if mf.params:
        params = {}
        old = by_type.get(media.PARAMS)
        if old is not None:
            with contextlib.suppress(OSError, ValueError):
                params = json.loads(blob_path(old.digest, root).read_bytes())
        params.update(mf.params)
        mf.params = params
        by_type[media.PARAMS] = _put_blob(root, mf.params_json(), media.PARAMS)
    licenses += [_put_blob(root, text.encode(), media.LICENSE) for text in mf.licenses]
    order = (media.TEMPLATE, media.SYSTEM, media.PARAMS)
    layers = (model, *(by_type[t] for t in order if t in by_type), *licenses)
    arch = None
    with contextlib.suppress(Exception):
        from llamay.gguf import GGUFFile

        arch = GGUFFile(blob_path(model.digest, root)).metadata.get("general.architecture")
    config = {
        "model_format": "gguf",
        "model_family": arch or "",
        "model_families": [arch] if arch else None,
        "model_type": "",
        "file_type": "",
        "architecture": "amd64",
        "os": "linux",
    }
    cfg = _put_blob(root, json.dumps(config, separators=(",", ":")).encode() + b"\n", media.CONFIG)
    man = Manifest(config=cfg, layers=layers)
    dpath = manifest_path(_manifests(root), ref)
    if ref.host:
        _atomic_write_bytes(dpath, man.dumps())
    else:
        _atomic_write_json(
            dpath,
            {
                "schema_version": MANIFEST_SCHEMA,
                "name": ref.repository,
                "tag": ref.tag,
                "digest": model.digest,
                "size": model.size,
                "created": datetime.now(UTC).isoformat(timespec="seconds"),
                "manifest": man.to_json(),
            },
        )
    status(f"created {ref}", progress=progress)
    entry = _read_entry(root, ref)
    assert entry is not None
    return entry
