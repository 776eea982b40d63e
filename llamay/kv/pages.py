"""The paged KV pool: device pages plus the host allocator that hands them out.

The device side is one pytree, `PagedKV`, passed into and returned from the jitted
steps (donated). The host side is `PageAllocator`: reference counts and a free list,
plain numpy. Page 0 is the null page: never allocated, never written, it fills
unused page-table entries.

A page's reference count is the number of holders: each sequence whose page table
lists it, plus the prefix tree when one of its nodes owns it. A page is free iff its
count is 0.

Sliding-window models (gemma2: every other layer local, gemma3: five in six) split
the pool in two, each with its own pages, page tables and allocator (page ids are
per pool):

- the global pool `k, v [L_global, P, page_size, K, D]` holds every position of a
  sequence for the global layers (page i of a sequence: positions i·ps .. i·ps+ps-1);
- the local pool `local_k, local_v [L_local, P_local, page_size, K, D]` holds the
  local layers' K/V of the same positions, but only near the window: a sequence's
  local page table is indexed like its global one, and an entry is the null page once
  every position on it is older than any query still to come can see
  (`KVManager.slide`). Its page goes back to the free list at once.

A sequence holds at most ceil(window/page_size) + 2 local pages while decoding (a
few more during a prefill chunk: `llamay.kv.sequences.local_bound`), however long it
grows, so the local pool is sized by slots and window, not by context: for gemma3
270M (15 of 18 layers local, window 512, pages of 16 tokens, prefill chunks of 128) a
sequence holds at most 34 local pages decoding and 42 prefilling, while its global
pages reach 2,048 at a 32k context.
The forward pass (`llamay.model.forward`) carries both pools through the layer scan;
each layer writes only its kind's pool and attends through it under a `lax.cond`
(`llamay.arch.paged.SplitPagedLayer`). A step's local page tables start at the first
page its queries can see (positions shifted by that page's first position, which the
causal and window masks do not notice), so the local layers attend over about a
window, not the whole context. Models without sliding windows have no local pool and
run as before.

How the rest composes with it (`llamay.kv.sequences`, `llamay.kv.radix`):
- prefix tree: a node may own the local page of its positions too; a cached prefix
  is reusable only up to a page boundary whose preceding `window` positions all still
  have their local pages in the tree (a sequence offers them when its prompt is
  computed and when it ends), so a hit mid-way through a long cached prompt is not
  reused;
- fork: the child shares the full global pages and copies the local window;
- snapshots: every layer's K/V as before, with the local layers' positions before
  the window zeros; restore writes only the window into the local pool;
- admission reserves each sequence's local bound; both pools grow on demand.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from llamay.errors import KVCacheFullError
from llamay.kv.types import kv_pair, kv_zeros

NULL_PAGE = 0


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class PagedKV:
    """The global pool K and V [L, P, page_size, K, D] (every layer of a model without
    sliding windows; only the global layers of one with them) and, for such a model,
    the local layers' pool [L_local, P_local, page_size, K, D] (None otherwise)."""

    k: jax.Array
    v: jax.Array
    local_k: jax.Array | None = None
    local_v: jax.Array | None = None

    @property
    def n_pages(self) -> int:
        return self.k.shape[1]

    @property
    def n_local_pages(self) -> int:
        return 0 if self.local_k is None else self.local_k.shape[1]

    @property
    def page_size(self) -> int:
        return self.k.shape[2]

    def pool(self, local: bool) -> tuple[jax.Array, jax.Array]:
        return (self.local_k, self.local_v) if local else (self.k, self.v)

    def with_pool(self, local: bool, k: jax.Array, v: jax.Array) -> PagedKV:
        if local:
            return replace(self, local_k=k, local_v=v)
        return replace(self, k=k, v=v)


def new_paged_kv(
    n_layers,
    n_pages,
    page_size,
    n_kv_heads,
    head_dim,
    dtype=jnp.float32,
    local_layers: int = 0,
    local_pages: int = 0,
) -> PagedKV:
    """A zeroed pool; with `local_layers` of the `n_layers` sliding-window, those get
    their own pool of `local_pages` pages and the global one keeps the rest. `dtype`: a
    KV cache type or a (K, V) pair of them (`llamay.kv.types`); a block type (q8_0,
    q4_0, ...) stores each row's GGUF blocks, uint8 [L, P, page_size, K, row bytes]."""
    kt, vt = kv_pair(dtype)

    def zeros(layers, pages):
        lead = (layers, pages, page_size, n_kv_heads)
        return kv_zeros(lead, head_dim, kt), kv_zeros(lead, head_dim, vt)

    if not local_layers:
        return PagedKV(*zeros(n_layers, n_pages))
    return PagedKV(*zeros(n_layers - local_layers, n_pages), *zeros(local_layers, local_pages))


def grow_paged_kv(kv: PagedKV, n_pages: int, n_local_pages: int = 0) -> PagedKV:
    """The pools with zero pages appended up to `n_pages` (global) and `n_local_pages`
    (local); existing pages keep their ids."""

    def pad(a, n):
        extra = n - a.shape[1]
        if extra <= 0:
            return a
        return jnp.concatenate([a, jnp.zeros((a.shape[0], extra, *a.shape[2:]), a.dtype)], 1)

    kv = replace(kv, k=pad(kv.k, n_pages), v=pad(kv.v, n_pages))
    if kv.local_k is not None:
        kv = replace(
            kv, local_k=pad(kv.local_k, n_local_pages), local_v=pad(kv.local_v, n_local_pages)
        )
    return kv


@partial(jax.jit, static_argnames=("local",), donate_argnames=("kv",))
def copy_pages(kv: PagedKV, src: jax.Array, dst: jax.Array, local: bool = False) -> PagedKV:
    """Copy pages src[i] -> dst[i] in every layer of one pool (copy-on-write of a
    partial page; a fork's copy of the local window)."""
    k, v = kv.pool(local)
    return kv.with_pool(local, k.at[:, dst].set(k[:, src]), v.at[:, dst].set(v[:, src]))


def read_pages(kv: PagedKV, pages: list[int], local: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """K and V of `pages` of one pool on the host: each [L, len(pages), page_size, K, D]."""
    idx = jnp.asarray(pages, jnp.int32)
    k, v = kv.pool(local)
    return np.asarray(k[:, idx]), np.asarray(v[:, idx])


@partial(jax.jit, static_argnames=("local",), donate_argnames=("kv",))
def write_pages(
    kv: PagedKV, pages: jax.Array, k: jax.Array, v: jax.Array, local: bool = False
) -> PagedKV:
    """Store k, v [L, n, page_size, K, D] into `pages` [n] of one pool (a snapshot)."""
    pk, pv = kv.pool(local)
    return kv.with_pool(
        local, pk.at[:, pages].set(k.astype(pk.dtype)), pv.at[:, pages].set(v.astype(pv.dtype))
    )


class PageAllocator:
    """Reference-counted pages 1..n_pages-1 (page 0 is the null page)."""

    def __init__(self, n_pages: int):
        if n_pages < 2:
            raise ValueError(
                f"a page pool needs at least 2 pages (one is the null page), not {n_pages}"
            )
        self.n_pages = n_pages
        self.refcount = np.zeros(n_pages, np.int32)
        # Lowest ids first out: pop() from the end of a descending list.
        self._free = list(range(n_pages - 1, 0, -1))

    @property
    def capacity(self) -> int:
        """Pages a sequence could ever use (all but the null page)."""
        return self.n_pages - 1

    @property
    def n_free(self) -> int:
        return len(self._free)

    @property
    def n_used(self) -> int:
        return self.capacity - len(self._free)

    def grow(self, n_pages: int) -> None:
        """Add pages n_pages..: they are handed out after the lower free ids."""
        old = self.n_pages
        if n_pages <= old:
            return
        self.refcount = np.concatenate([self.refcount, np.zeros(n_pages - old, np.int32)])
        self._free = list(range(n_pages - 1, old - 1, -1)) + self._free
        self.n_pages = n_pages

    def alloc(self, n: int) -> list[int]:
        """n fresh pages, each with count 1; KVCacheFullError (nothing taken) if too few."""
        if n > len(self._free):
            raise KVCacheFullError(
                f"the KV page pool has {len(self._free)} free pages, {n} are needed "
                f"(pool: {self.capacity} pages); finish or cancel requests, or make the pool larger"
            )
        out = [self._free.pop() for _ in range(n)]
        self.refcount[out] = 1
        return out

    def incref(self, pages: Iterable[int]) -> None:
        for p in pages:
            if p == NULL_PAGE or self.refcount[p] <= 0:
                raise ValueError(f"incref of page {p}, which is not allocated")
            self.refcount[p] += 1

    def decref(self, pages: Iterable[int]) -> list[int]:
        """Drop one reference to each page; returns the pages this freed."""
        freed = []
        for p in pages:
            if p == NULL_PAGE or self.refcount[p] <= 0:
                raise ValueError(f"decref of page {p}, which is not allocated")
            self.refcount[p] -= 1
            if self.refcount[p] == 0:
                self._free.append(p)
                freed.append(p)
        return freed

    def check(self) -> None:
        """Internal consistency: free pages have count 0, used ones > 0, no duplicates."""
        free = set(self._free)
        assert len(free) == len(self._free), "a page is on the free list twice"
        assert NULL_PAGE not in free and self.refcount[NULL_PAGE] == 0, (
            "the null page was handed out"
        )
        for p in range(1, self.n_pages):
            if p in free:
                assert self.refcount[p] == 0, f"page {p} is free with count {self.refcount[p]}"
            else:
                assert self.refcount[p] > 0, f"page {p} is neither free nor referenced"
