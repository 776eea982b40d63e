"""Fork, snapshot, restore and release for `BatchEngine`: operations on a sequence's
KV that run on the worker thread between steps (`BatchEngine._call`), and the model
digest a snapshot is tied to.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from llamay.engine.adapters import RESTORED
from llamay.engine.api import Handle, Request
from llamay.engine.planning import Active
from llamay.errors import KVCacheFullError, RequestError, SnapshotError
from llamay.kv.pages import copy_pages, read_pages, write_pages
from llamay.kv.sequences import SeqKV
from llamay.kv.snapshot import Snapshot
from llamay.kv.types import kv_label, kv_pair


def model_digest(path: Path) -> str:
    """An id of the model file: its store digest when named like one, else a hash of
    its size and first MiB."""
    name = Path(path).name
    if name.startswith("sha256-") and len(name) == 71:
        return name.replace("-", ":", 1)
    h = hashlib.sha256(str(Path(path).stat().st_size).encode())
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
    return "sha256:" + h.hexdigest()


class Persistence:
    """`BatchEngine`'s fork / snapshot / restore / release (a mixin over its state)."""

    def _find(self, handle: Handle) -> Active:
        for a in self.slots:
            if a is not None and a.handle is handle:
                return a
        if handle.id in self.kept:
            return self.kept[handle.id]
        raise RequestError(
            f"request {handle.id} has no KV to use: it is not running and was not kept "
            "(submit it with keep=True)"
        )

    def _fork(self, handle: Handle, requests: list[Request]) -> list[Handle]:
        parent = self._find(handle).seq
        out: list[Handle] = []
        out_active: list[Active] = []
        for r in requests:
            tokens = parent.tokens + list(r.prompt_ids)
            at = min(parent.n_cached, len(tokens) - 1)
            with self._lock:
                made = self.mgr.fork(parent, len(r.prompt_ids) + r.max_tokens + 1, at)
            if made is None:
                raise KVCacheFullError(
                    f"the KV pool cannot hold a fork of {handle.id} now "
                    f"({self.mgr.alloc.n_free} pages free); retry after requests finish"
                )
            child, copies, local_copies = made
            child.tokens = tokens
            for pairs, local in ((copies, False), (local_copies, True)):
                if pairs:
                    self._sync_pool()
                    src, dst = (jnp.asarray(x) for x in zip(*pairs, strict=True))
                    self.kv = copy_pages(self.kv, src, dst, local=local)
            h = Handle(r)
            try:
                made_active = self._enqueue(h, child)
            except BaseException:
                # no handle reaches the caller: free this child and undo the earlier ones
                self._drop(child)
                for a in out_active:
                    self.waiting.remove(a)
                    self._drop(a.seq)
                raise
            out_active.append(made_active)
            h.usage.prompt_tokens = len(tokens)
            h.usage.cached_tokens = at
            out.append(h)
        return out

    def _drop(self, seq: SeqKV) -> None:
        """Free a sequence no request was started on (nothing of it is worth caching)."""
        with self._lock:
            self.mgr.release(seq, cache=False)

    def _digest_of_model(self) -> str:
        if self._digest is None:
            self._digest = model_digest(self.model.path)
        return self._digest

    def _snapshot(self, handle: Handle) -> Snapshot:
        """The sequence's K/V [L, n_cached, K, D]; the local layers' positions before
        the window it keeps are zeros (released: a restore never reads them)."""
        seq = self._find(handle).seq
        n = seq.n_cached
        P = self.mgr.pages_for(n)
        k, v = read_pages(self.kv, seq.pages[:P])
        if self.mgr.local is not None:
            kept = [i for i in range(P) if seq.local[i]]
            lk, lv = read_pages(self.kv, [seq.local[i] for i in kept], local=True)
            k, v = (self._interleave(g, loc, kept, P) for g, loc in ((k, lk), (v, lv)))
        L, P, ps, K, _ = k.shape
        k = k.reshape(L, P * ps, K, -1)[:, :n]
        v = v.reshape(L, P * ps, K, -1)[:, :n]
        return Snapshot(self._digest_of_model(), kv_label(self.kv_dtype), list(seq.tokens), k, v)

    def _interleave(self, glob: np.ndarray, loc: np.ndarray, kept: list[int], P: int):
        """Every layer's pages [L, P, ps, K, D] from the global layers' [Lg, P, ...] and
        the local layers' pages `kept` [Ll, len(kept), ...] (zeros elsewhere)."""
        out = np.zeros((len(self.local_layers), P, *glob.shape[2:]), glob.dtype)
        out[~self.local_layers] = glob
        local = np.zeros((loc.shape[0], P, *loc.shape[2:]), loc.dtype)
        local[:, kept] = loc
        out[self.local_layers] = local
        return out

    def _restore(self, snap: Snapshot, request: Request) -> Handle:
        cfg = self.cfg
        if snap.kv_dtype != kv_label(self.kv_dtype):
            raise SnapshotError(
                f"the snapshot's KV cache type is {snap.kv_dtype}; this engine's is "
                f"{kv_label(self.kv_dtype)} (load the model with the same numerics and "
                "cache types, e.g. --cache-type-k/--cache-type-v)"
            )
        width = kv_pair(self.kv_dtype)[0].row_width(cfg.head_dim)
        want = (cfg.n_layers, cfg.n_kv_heads, width)
        got = (snap.k.shape[0], snap.k.shape[2], snap.k.shape[3])
        if snap.model != self._digest_of_model() or got != want:
            raise SnapshotError(
                f"the snapshot is of model {snap.model} (KV {got}); this engine runs "
                f"{self._digest_of_model()} (KV {want})"
            )
        tokens = list(snap.tokens) + list(request.prompt_ids)
        n = min(snap.n_cached, len(tokens) - 1)
        with self._lock:
            budget = len(request.prompt_ids) + request.max_tokens + 1
            seq = self.mgr.adopt(tokens, n, budget, salt=RESTORED)
        if seq is None:
            raise KVCacheFullError("the KV pool cannot hold the snapshot now; retry later")
        if n:
            ps, P = self.page_size, self.mgr.pages_for(n)
            pad = ((0, 0), (0, P * ps - n), (0, 0), (0, 0))
            L, _, K, _ = snap.k.shape  # K and V rows may differ (e.g. q8_0 K, f16 V)
            k = np.pad(snap.k[:, :n], pad).reshape(L, P, ps, K, -1)
            v = np.pad(snap.v[:, :n], pad).reshape(L, P, ps, K, -1)
            self._sync_pool()
            glob = ~self.local_layers
            self.kv = write_pages(
                self.kv, jnp.asarray(seq.pages[:P]), jnp.asarray(k[glob]), jnp.asarray(v[glob])
            )
            if self.mgr.local is not None:  # the local layers: only the window's pages
                kept = [i for i in range(P) if seq.local[i]]
                loc = np.ix_(self.local_layers, kept)
                self.kv = write_pages(
                    self.kv,
                    jnp.asarray([seq.local[i] for i in kept]),
                    jnp.asarray(k[loc]),
                    jnp.asarray(v[loc]),
                    local=True,
                )
        h = Handle(request)
        try:
            self._enqueue(h, seq)
        except BaseException:
            self._drop(seq)
            raise
        h.usage.prompt_tokens = len(tokens)
        h.usage.cached_tokens = n
        return h

    def _release(self, handle: Handle) -> None:
        a = self.kept.pop(handle.id, None)
        if a is not None and a.seq is not None:
            with self._lock:
                self.mgr.release(a.seq)
            a.seq = None
