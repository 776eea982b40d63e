"""Durable files: where llamay keeps them, atomic writes, fsync, advisory locks.

The store, the KV snapshots and the server's saved contexts all write through these, so a
crash leaves either the old file or the whole new one. Imports nothing of llamay but its
errors: every room may use it.

    home() -> Path                          `$LLAMAY_HOME`, default `~/.llamay`
    atomic_write_bytes(path, data)          temp file, fsync, rename, fsync of the directory
    atomic_write_json(path, obj)
    fsync_dir(directory)
    unlink(path)                            missing is fine; read-only (Windows) is made writable
    file_lock(path, on_wait=None)           exclusive, blocking; `on_wait()` once if busy
    try_file_lock(path) -> bool             exclusive if free (context manager), never blocks
    write_via_partial(partial, final, write)   a large file, locked while written
    remove_if_unlocked(partial) -> bool     a partial whose writer died
    sha256_file(path) -> str
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO


def home() -> Path:
    """llamay's data directory: `$LLAMAY_HOME`, default `~/.llamay` (not created here)."""
    env = os.environ.get("LLAMAY_HOME")
    return Path(env).expanduser() if env else Path.home() / ".llamay"


def fsync_dir(directory: Path) -> None:
    """Make a rename inside `directory` durable (a no-op where directories cannot be opened)."""
    with contextlib.suppress(OSError, AttributeError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def unlink(path: Path) -> None:
    """Remove `path` if it is there (read-only files too: Windows refuses those)."""
    with contextlib.suppress(FileNotFoundError):
        try:
            path.unlink()
        except PermissionError:
            os.chmod(path, 0o644)
            path.unlink()


def atomic_write_bytes(path: Path, data: bytes) -> None:
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
        unlink(tmp)
        raise
    fsync_dir(path.parent)


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_bytes(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())


def sha256_file(path: Path) -> str:
    """The hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _open_lock(path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)


@contextlib.contextmanager
def file_lock(path: Path, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold an exclusive advisory lock on `path` (created if missing), waiting for it if
    another process has it (`on_wait()` is called once, before waiting). The lock dies with
    its process, so a killed holder never leaves it taken."""
    fd = _open_lock(path)
    try:
        if not _acquire(fd, blocking=False):
            if on_wait is not None:
                on_wait()
            _acquire(fd, blocking=True)
        try:
            yield
        finally:
            _release(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def try_file_lock(path: Path) -> Iterator[bool]:
    """The lock of `file_lock` if nobody holds it (yields True, held until the block ends),
    else yields False at once."""
    fd = _open_lock(path)
    try:
        got = _acquire(fd, blocking=False)
        try:
            yield got
        finally:
            if got:
                _release(fd)
    finally:
        os.close(fd)


def _acquire(fd: int, *, blocking: bool) -> bool:
    try:
        import fcntl
    except ImportError:  # Windows
        import msvcrt

        while True:
            try:
                msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
                return True
            except OSError:
                if not blocking:
                    return False
                time.sleep(0.2)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    return True


def _release(fd: int) -> None:
    try:
        import fcntl
    except ImportError:  # Windows
        import msvcrt

        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
        return
    fcntl.flock(fd, fcntl.LOCK_UN)


#: What a partial file's name carries (`blobs/.partial-<hex>`, `kv/.<name>.partial-<random>`).
PARTIAL_MARK = ".partial"


def write_via_partial(partial: Path, final: Path, write: Callable[[BinaryIO], None]) -> None:
    """Write `final` through `partial`: created exclusively, locked while `write(f)` fills
    it (so `remove_if_unlocked` leaves it alone), fsync'd, renamed to `final` and the rename
    fsync'd. On any exception the partial is removed and `final` is untouched."""
    try:
        import fcntl  # noqa: F401 (POSIX: flock; Windows cannot rename an open file)
    except ImportError:
        with open(partial, "xb") as f:
            _fill(partial, f, write)
        os.replace(partial, final)
        fsync_dir(final.parent)
        return
    while True:
        f = open(partial, "xb")  # noqa: SIM115 (closed below, after the rename)
        if _acquire(f.fileno(), blocking=True) and os.fstat(f.fileno()).st_nlink > 0:
            break
        f.close()  # gc removed it between the create and the lock: make another
    try:
        _fill(partial, f, write)
        os.replace(partial, final)  # still locked: gc cannot take it before the rename
    finally:
        with contextlib.suppress(OSError):
            _release(f.fileno())
        f.close()
    fsync_dir(final.parent)


def _fill(partial: Path, f: BinaryIO, write: Callable[[BinaryIO], None]) -> None:
    try:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    except BaseException:
        unlink(partial)
        raise


def remove_if_unlocked(path: Path) -> bool:
    """Remove a partial file no live process holds (see `write_via_partial`); True if
    removed."""
    try:
        import fcntl  # noqa: F401
    except ImportError:  # Windows: a file another process has open cannot be deleted
        try:
            os.unlink(path)
        except OSError:
            return False
        return True
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return False
    try:
        if not _acquire(fd, blocking=False):
            return False
        _release(fd)
    finally:
        os.close(fd)
    # nobody reopens a partial (they are created once, with O_EXCL), so none can take it now
    unlink(path)
    return True
