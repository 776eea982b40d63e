"""KV snapshots: a token prefix and its K/V, saved to disk and restored into a pool
later or in another process. Content-addressed: the file is named by the SHA-256 of
(model digest, KV dtype, token ids), so saving the same prefix twice writes one file.

Restoring then generating gives the same tokens as never having saved: the K/V come
back bit for bit and the continuation runs the same steps.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llamay.errors import SnapshotError

FORMAT = 1


@dataclass
class Snapshot:
    model: str  # the model's digest ("sha256:...")
    kv_dtype: str  # numpy dtype name of the cache ("float32", "float16", "bfloat16")
    tokens: list[int]  # every token of the sequence; the first n_cached have K/V
    k: np.ndarray  # [L, n_cached, K, D]
    v: np.ndarray  # [L, n_cached, K, D]

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
        path = directory / (self.digest.split(":", 1)[1] + ".kv.npz")
        meta = {"format": FORMAT, "model": self.model, "kv_dtype": self.kv_dtype}
        fd, tmp = tempfile.mkstemp(dir=directory, suffix=".partial")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(
                    f,
                    meta=np.frombuffer(json.dumps(meta).encode(), np.uint8),
                    tokens=np.asarray(self.tokens, np.int64),
                    k=_raw(self.k),
                    v=_raw(self.v),
                )
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    @staticmethod
    def load(path: str | os.PathLike) -> Snapshot:
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
        snap = Snapshot(meta["model"], dt, tokens, _cooked(k, dt), _cooked(v, dt))
        if not Path(path).name.startswith(snap.digest.split(":", 1)[1]):
            raise SnapshotError(f"{path}: its contents do not match its name (corrupt?)")
        return snap


def _raw(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint16) if a.dtype.name == "bfloat16" else a


def _cooked(a: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        import ml_dtypes

        return a.view(ml_dtypes.bfloat16)
    return a
