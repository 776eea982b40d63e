"""The paged KV pool: device pages plus the host allocator that hands them out.

The device side is one pytree, `PagedKV` (K and V `[layers, pages, page_size,
kv_heads, head_dim]`), passed into and returned from the jitted steps (donated). The
host side is `PageAllocator`: reference counts and a free list, plain numpy. Page 0
is the null page: never allocated, never written, it fills unused page-table entries.

A page's reference count is the number of holders: each sequence whose page table
lists it, plus the prefix tree when one of its nodes owns it. A page is free iff its
count is 0.

Sliding-window layers (gemma2/3) keep their pages: nothing is released or reused once
it falls outside the window. A page holds one run of positions for every layer at once
(`[layers, pages, ...]`), and the global layers interleaved with the local ones (one in
two for gemma2, one in six for gemma3) read every position of the sequence, so a page
outside the window is still live. Freeing only the local layers' share would need a
second pool with its own page tables (a ring of window/page_size + 1 pages per
sequence), a second allocator, and prefix sharing, fork and snapshots that know a
local page may already be gone; it would save at most the local layers' part of the KV
beyond the window. The local layers' attention masks positions older than the window
(`llamay.arch.layers.attention`), so correctness does not depend on it
(tests/engine/test_batch_gemma3.py decodes gemma3 past its window).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from llamay.errors import KVCacheFullError

NULL_PAGE = 0


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class PagedKV:
    k: jax.Array  # [L, P, page_size, K, D]
    v: jax.Array  # [L, P, page_size, K, D]

    @property
    def n_pages(self) -> int:
        return self.k.shape[1]

    @property
    def page_size(self) -> int:
        return self.k.shape[2]


def new_paged_kv(n_layers, n_pages, page_size, n_kv_heads, head_dim, dtype=jnp.float32) -> PagedKV:
    shape = (n_layers, n_pages, page_size, n_kv_heads, head_dim)
    return PagedKV(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))


def grow_paged_kv(kv: PagedKV, n_pages: int) -> PagedKV:
    """The pool with zero pages appended up to `n_pages` (existing pages keep their ids)."""
    extra = n_pages - kv.n_pages
    if extra <= 0:
        return kv

    def pad(a):
        return jnp.concatenate([a, jnp.zeros((a.shape[0], extra, *a.shape[2:]), a.dtype)], 1)

    return PagedKV(pad(kv.k), pad(kv.v))


@partial(jax.jit, donate_argnames=("kv",))
def copy_pages(kv: PagedKV, src: jax.Array, dst: jax.Array) -> PagedKV:
    """Copy pages src[i] -> dst[i] in every layer (copy-on-write of a partial page)."""
    return PagedKV(kv.k.at[:, dst].set(kv.k[:, src]), kv.v.at[:, dst].set(kv.v[:, src]))


def read_pages(kv: PagedKV, pages: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """K and V of `pages` on the host: each [L, len(pages), page_size, K, D]."""
    idx = jnp.asarray(pages, jnp.int32)
    return np.asarray(kv.k[:, idx]), np.asarray(kv.v[:, idx])


@partial(jax.jit, donate_argnames=("kv",))
def write_pages(kv: PagedKV, pages: jax.Array, k: jax.Array, v: jax.Array) -> PagedKV:
    """Store k, v [L, n, page_size, K, D] into `pages` [n] (restoring a snapshot)."""
    return PagedKV(
        kv.k.at[:, pages].set(k.astype(kv.k.dtype)), kv.v.at[:, pages].set(v.astype(kv.v.dtype))
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
