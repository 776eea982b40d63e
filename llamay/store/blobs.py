"""Blob files: where they live, the digest locks, and writing one safely.

Every blob is written under the lock of its digest (`locks/sha256-<hex>.lock`) into
`blobs/.partial-<hex>`, hashed as it is written, verified (size and sha256), made
read-only and renamed into `blobs/sha256-<hex>`. A *resumable* source (a registry blob)
continues a partial left by an interrupted pull with a ranged request; any other source
starts it again. Either way the partial of a digest is only ever touched by the process
holding that digest's lock, so one without a live lock is debris `gc()` may remove.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from llamay.errors import FetchError, GGUFMagicError
from llamay.files import (
    atomic_write_bytes,
    file_lock,
    fsync_dir,
    home,
    sha256_file,
    try_file_lock,
    unlink,
)
from llamay.store.manifest import Layer
from llamay.store.names import ModelRef, contained_path
from llamay.store.oci import TransientFetchError
from llamay.store.source import Source, status

_HEX64 = re.compile(r"[0-9a-f]{64}")
PARTIAL_PREFIX = ".partial-"
#: A pull sweeps partials older than this; `gc()` removes every partial nobody holds.
STALE_PARTIAL_S = 24 * 3600
#: How often one pull retries a broken-off resumable download before giving up.
RESUME_ATTEMPTS = 3
GGUF_MAGIC = b"GGUF"


def store_dir() -> Path:
    """The store's root: `$LLAMAY_HOME`, default `~/.llamay` (not created here)."""
    return home()


def blobs_dir(root: Path) -> Path:
    return root / "blobs"


def manifests_dir(root: Path) -> Path:
    return root / "manifests"


def blob_hex(digest: str) -> str:
    """The 64 hex digits of `sha256:<hex>` (or bare `<hex>`), checked."""
    hexdigest = digest.removeprefix("sha256:")
    if not _HEX64.fullmatch(hexdigest):
        raise FetchError(f"malformed digest {digest!r}: expected sha256:<64 lowercase hex digits>")
    return hexdigest


def blob_path(digest: str, root: Path | None = None) -> Path:
    """The blob file for `sha256:<hex>` (or bare `<hex>`); it need not exist."""
    root = store_dir() if root is None else root
    return contained_path(blobs_dir(root), f"sha256-{blob_hex(digest)}")


def partial_path(root: Path, hexdigest: str) -> Path:
    return blobs_dir(root) / f"{PARTIAL_PREFIX}{hexdigest}"


def lock_path(root: Path, key: str) -> Path:
    return root / "locks" / f"{key}.lock"


@contextlib.contextmanager
def lock(root: Path, key: str, what: str, *, progress: bool) -> Iterator[None]:
    """The exclusive lock `locks/<key>.lock` (blocking; says so when another process has it)."""
    wait = lambda: status(f"waiting for another process {what}", progress=progress)  # noqa: E731
    with file_lock(lock_path(root, key), on_wait=wait):
        yield


# --- progress events -----------------------------------------------------------------------

#: Where `pull(..., events=...)` sends its progress events (see `llamay.store.pull`).
events_sink: contextvars.ContextVar[Callable[[dict[str, Any]], None] | None] = (
    contextvars.ContextVar("llamay_store_events", default=None)
)
_EVENT_INTERVAL_S = 0.1


def emit(**event: Any) -> None:
    callback = events_sink.get()
    if callback is not None:
        callback(event)


def blob_event(digest: str, total: int | None, completed: int) -> None:
    hexdigest = digest.removeprefix("sha256:")
    emit(
        status=f"pulling {hexdigest[:12]}",
        digest=f"sha256:{hexdigest}",
        total=total,
        completed=completed,
    )


class HashingWriter:
    """Writes to a file, hashing as it goes; refuses to grow past `limit` bytes. Reports
    progress events (at most every 0.1 s) when a pull asked for them."""

    def __init__(self, f: Any, limit: int | None, what: str, digest: str = ""):
        self._f = f
        self._limit = limit
        self._what = what
        self._digest = digest
        self._report = bool(digest) and events_sink.get() is not None
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
                blob_event(self._digest, self._limit, self.size)
        return n


def sweep_stale_partials(root: Path) -> None:
    """Remove partials untouched for a day whose pull is not running (its digest's lock is
    free): an interrupted registry pull keeps its partial that long for a resume."""
    now = time.time()
    with contextlib.suppress(OSError):
        for p in blobs_dir(root).iterdir():
            if not p.name.startswith(PARTIAL_PREFIX):
                continue
            with contextlib.suppress(OSError):
                if now - p.stat().st_mtime > STALE_PARTIAL_S and not partial_in_use(root, p):
                    p.unlink()


def partial_hex(partial: Path) -> str | None:
    """The digest a `.partial-<hex>` is named after; None for other names (older llamays)."""
    hexdigest = partial.name.removeprefix(PARTIAL_PREFIX)
    return hexdigest if _HEX64.fullmatch(hexdigest) else None


def partial_in_use(root: Path, partial: Path) -> bool:
    """Whether a live process holds the lock of the digest `partial` is named after (a
    partial of another name is never in use: no llamay writes those any more)."""
    hexdigest = partial_hex(partial)
    if hexdigest is None:
        return False
    with try_file_lock(lock_path(root, f"sha256-{hexdigest}")) as free:
        return not free


# --- writing a blob ----------------------------------------------------------------------


def fetch_blob(
    root: Path, ref: ModelRef, sha256: str, size: int | None, source: Source, progress: bool
) -> tuple[Path, int, bool]:
    """Make sure `blobs/sha256-<sha256>` exists; returns (path, size, created_now).

    Caller holds the digest lock. The download goes to `.partial-<sha256>`: a resumable
    source continues what an interrupted pull left there, any other starts it afresh.
    """
    blobs = blobs_dir(root)
    blobs.mkdir(parents=True, exist_ok=True)
    blob = blob_path(sha256, root)
    if blob.is_file():
        actual = blob.stat().st_size
        if size is None or actual == size:
            blob_event(sha256, actual, actual)
            return blob, actual, False
        if sha256_file(blob) == sha256:
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
        unlink(blob)
    sweep_stale_partials(root)
    resumable = bool(getattr(source, "resumable", False))
    tmp = partial_path(root, sha256)
    have = tmp.stat().st_size if tmp.is_file() else 0
    if not resumable or (size is not None and have > size):
        unlink(tmp)  # a dead pull's debris (we hold the digest's lock), not resumable
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
                writer = HashingWriter(f, size, f"{source.describe()}", sha256)
                if have:
                    _rehash(tmp, have, writer)
                blob_event(sha256, size, writer.size)
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
        blob_event(sha256, size, writer.size)
        got = writer.sha256.hexdigest()
        if got != sha256:
            dropped = source.invalidate_cache()
            raise FetchError(
                f"checksum mismatch for {ref} from {source.describe()}: expected sha256 "
                f"{sha256}, got {got}"
                + ("; the cached download was removed, a retry fetches it again" if dropped else "")
            )
        _commit(tmp, blob)
        return blob, writer.size, True
    finally:
        if not keep:
            unlink(tmp)


def _commit(tmp: Path, blob: Path) -> None:
    """The verified partial becomes the blob: read-only, renamed, the rename made durable."""
    try:
        os.chmod(tmp, 0o444)
        os.replace(tmp, blob)
    except OSError as e:
        raise FetchError(f"could not move the verified blob into {blob}: {e}") from e
    fsync_dir(blob.parent)


def _rehash(path: Path, n: int, writer: HashingWriter) -> None:
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


def _fetch_resuming(source: Source, writer: HashingWriter, f: Any, progress: bool) -> None:
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


def put_blob(root: Path, data: bytes, media_type: str) -> Layer:
    """Store a small blob (from memory) under its digest; returns its layer."""
    hexdigest = hashlib.sha256(data).hexdigest()
    blob = blob_path(hexdigest, root)
    with lock(root, f"sha256-{hexdigest}", "writing a blob", progress=False):
        if not blob.is_file():
            atomic_write_bytes(blob, data)
            os.chmod(blob, 0o444)
    return Layer(media_type, f"sha256:{hexdigest}", len(data))


def has_blob(digest: str, root: Path | None = None) -> bool:
    """Whether the store holds the (complete) blob of `digest`."""
    return blob_path(digest, root).is_file()


def receive_blob(digest: str, chunks: Iterator[bytes], root: Path | None = None) -> Path:
    """Write the blob of `digest` from `chunks` (an upload, `/api/blobs/<digest>`), verified
    against the digest before it becomes visible; an existing blob is kept as it is."""
    root = store_dir() if root is None else root
    hexdigest = blob_hex(digest)
    blob = blob_path(hexdigest, root)
    with lock(root, f"sha256-{hexdigest}", f"receiving {digest}", progress=False):
        if blob.is_file():
            for _ in chunks:  # drain the upload; the blob is already here
                pass
            return blob
        blobs_dir(root).mkdir(parents=True, exist_ok=True)
        tmp = partial_path(root, hexdigest)
        unlink(tmp)
        try:
            with open(tmp, "xb") as f:
                writer = HashingWriter(f, None, f"the upload of {digest}")
                for chunk in chunks:
                    writer.write(chunk)
                f.flush()
                os.fsync(f.fileno())
            got = writer.sha256.hexdigest()
            if got != hexdigest:
                raise FetchError(f"the uploaded bytes hash to sha256:{got}, not {digest}")
            _commit(tmp, blob)
        finally:
            unlink(tmp)
    return blob


def check_gguf(path: Path, what: str) -> None:
    """Raise `GGUFMagicError` unless `path` is a regular file starting with GGUF's magic."""
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise GGUFMagicError(f"{what}: cannot read {path}: {e}") from e
    if magic != GGUF_MAGIC:
        raise GGUFMagicError(f"{what}: {path} is not a GGUF file (no GGUF magic)")
