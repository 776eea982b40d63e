"""KV snapshots: a token prefix and its K/V, saved to disk and restored into a pool
later or in another process. Content-addressed: the file is named by the SHA-256 of
(model digest, KV dtype, token ids), so saving the same prefix twice writes one file.

Restoring then generating gives the same tokens as never having saved: the K/V come
back bit for bit and the continuation runs the same steps. A sliding-window model's
local layers had released their positions before the window (`llamay.kv.pages`): in
its snapshot those are zeros, and a restore writes back only the window.

In the model store (`llamay.files.home()`, under `kv/`, apart from the model
blobs so that the store's gc leaves them alone):

    digest = store_snapshot(engine.snapshot(handle))     # "sha256:..."
    stored_snapshots(model=digest_of_model)               # [StoredSnapshot ...]
    engine.restore(load_snapshot(digest), Request(more_ids, 32))   # any process
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llamay.errors import SnapshotError
from llamay.files import PARTIAL_MARK, home, write_via_partial

FORMAT = 1
_HEX64 = re.compile(r"[0-9a-f]{64}")


@dataclass
class Snapshot:
    model: str  # the model's digest ("sha256:...")
    # the cache's type (`llamay.kv.types.kv_label`): a float cache's numpy dtype name
    # ("float32", "float16", "bfloat16"), a block type's name ("q8_0", "q4_0", ...: k, v
    # hold the rows' GGUF blocks, uint8 [L, n_cached, K, row bytes]), "K/V" if they differ
    kv_dtype: str
    tokens: list[int]  # every token of the sequence; the first n_cached have K/V
    k: np.ndarray  # [L, n_cached, K, D] (or row bytes)
    v: np.ndarray  # [L, n_cached, K, D] (or row bytes)

    @property
    def n_cached(self) -> int:
        return self.k.shape[1]

    @property
    def digest(self) -> str:
        h = hashlib.sha256()
        h.update(f"{self.model}\0{self.kv_dtype}\0".encode())
        h.update(np.asarray(self.tokens, np.int64).tobytes())
        h.update(str(self.n_cached).encode())
        return "sha256:" + h.hexdigest()

    def save(self, directory: str | os.PathLike) -> Path:
        """Write `<directory>/<digest hex>.npz` atomically; returns its path."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        return self.write(directory / (self.digest.split(":", 1)[1] + ".kv.npz"))

    def write(self, path: str | os.PathLike) -> Path:
        """Write the snapshot to `path` (any name; atomically); returns it."""
        path = Path(path)
        directory = path.parent
        meta = {"format": FORMAT, "model": self.model, "kv_dtype": self.kv_dtype}
        # locked while written: `llamay gc` removes a partial only once its writer is dead
        tmp = directory / f".{path.name}{PARTIAL_MARK}-{secrets.token_hex(6)}"
        write_via_partial(
            tmp,
            path,
            lambda f: np.savez(
                f,
                meta=np.frombuffer(json.dumps(meta).encode(), np.uint8),
                tokens=np.asarray(self.tokens, np.int64),
                k=_raw(self.k),
                v=_raw(self.v),
            ),
        )
        return path

    @staticmethod
    def load(path: str | os.PathLike, named: bool = True) -> Snapshot:
        """The snapshot in `path`; `named`: its file name must start with its digest (as
        `save` names it), else any name (one given to `write`)."""
        try:
            with np.load(path) as z:
                meta = json.loads(z["meta"].tobytes())
                tokens = z["tokens"].tolist()
                k, v = z["k"], z["v"]
        except (OSError, ValueError, KeyError) as e:
            raise SnapshotError(f"{path}: not a llamay KV snapshot ({e})") from None
        if meta.get("format") != FORMAT:
            raise SnapshotError(f"{path}: snapshot format {meta.get('format')}, expected {FORMAT}")
        dt = meta["kv_dtype"]
        kd, _, vd = dt.partition("/")  # "K/V" when the two types differ
        snap = Snapshot(meta["model"], dt, tokens, _cooked(k, kd), _cooked(v, vd or kd))
        if named and not Path(path).name.startswith(snap.digest.split(":", 1)[1]):
            raise SnapshotError(f"{path}: its contents do not match its name (corrupt?)")
        return snap


@dataclass(frozen=True)
class StoredSnapshot:
    digest: str
    model: str
    kv_dtype: str
    n_tokens: int
    n_cached: int
    size: int  # bytes on disk
    path: Path


def snapshot_dir(root: str | os.PathLike | None = None) -> Path:
    """Where the store keeps snapshots: `<root or store_dir()>/kv`."""
    if root is None:
        root = home()
    return Path(root) / "kv"


def store_snapshot(snap: Snapshot, root: str | os.PathLike | None = None) -> str:
    """Save `snap` into the store (once per content); returns its digest."""
    snap.save(snapshot_dir(root))
    return snap.digest


def load_snapshot(digest: str, root: str | os.PathLike | None = None) -> Snapshot:
    """The stored snapshot of `digest` ("sha256:<hex>" or the hex)."""
    hexdigest = digest.removeprefix("sha256:")
    if not _HEX64.fullmatch(hexdigest):  # a plain name: no "\n", no path, 64 hex digits
        raise SnapshotError(f"{digest!r} is not a snapshot digest (sha256:<hex>)")
    path = snapshot_dir(root) / f"{hexdigest}.kv.npz"
    if not path.is_file():
        raise SnapshotError(f"no stored snapshot {digest} in {path.parent}")
    return Snapshot.load(path)


def stored_snapshots(
    model: str | None = None, root: str | os.PathLike | None = None
) -> list[StoredSnapshot]:
    """The store's snapshots (of `model`, a model digest, if given), newest first."""
    out = []
    directory = snapshot_dir(root)
    paths = sorted(directory.glob("*.kv.npz"), key=lambda p: p.stat().st_mtime, reverse=True)
    for path in paths:
        try:
            with np.load(path) as z:
                meta = json.loads(z["meta"].tobytes())
                n_tokens, n_cached = len(z["tokens"]), z["k"].shape[1]
        except (OSError, ValueError, KeyError):
            continue  # not a snapshot (or being replaced): not listed
        if model is None or meta.get("model") == model:
            digest = "sha256:" + path.name.removesuffix(".kv.npz")
            size = path.stat().st_size
            out.append(
                StoredSnapshot(
                    digest, meta["model"], meta["kv_dtype"], n_tokens, n_cached, size, path
                )
            )
    return out


def _raw(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint16) if a.dtype.name == "bfloat16" else a


def _cooked(a: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        import ml_dtypes

        return a.view(ml_dtypes.bfloat16)
    return a
