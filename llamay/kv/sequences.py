"""Host bookkeeping of the sequences in a page pool: page tables, prefix sharing,
fork, admission reservations. Plain Python; the device only ever sees page tables.

A sequence's `tokens` are everything it has seen or produced; the first `n_cached`
have their K/V in `pages` (page i holds positions i·ps .. i·ps+ps-1). A step feeds
tokens[n_cached:] (its pending tokens) and commits them.

Admission reserves the worst case: a sequence that is let in can always get the pages
its token budget needs, so no running sequence ever stalls on the pool. With
`max_pages` above `n_pages` the pool may grow (the allocator here; the owner of the
device pool pads it to `alloc.n_pages`, see `grow_paged_kv`) when a reservation does
not fit, doubling up to `max_pages`: a pool sized for the usual request that can
still take one as long as the context.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from llamay.errors import KVCacheFullError
from llamay.kv.pages import PageAllocator
from llamay.kv.radix import PrefixTree

_ids = itertools.count(1)


@dataclass(eq=False)
class SeqKV:
    tokens: list[int]
    pages: list[int] = field(default_factory=list)
    n_cached: int = 0  # positions whose K/V are in `pages`
    reserve: int = 0  # pages it may still allocate
    cached_hit: int = 0  # tokens served from the prefix tree at open
    id: int = field(default_factory=lambda: next(_ids))

    @property
    def pending(self) -> list[int]:
        return self.tokens[self.n_cached :]


class KVManager:
    def __init__(
        self,
        n_pages: int,
        page_size: int,
        prefix_cache: bool = True,
        max_pages: int | None = None,
    ):
        self.page_size = page_size
        self.alloc = PageAllocator(n_pages)
        self.max_pages = max(n_pages, max_pages or n_pages)
        self.tree = PrefixTree(self.alloc, page_size)
        self.prefix_cache = prefix_cache
        self.live: dict[int, SeqKV] = {}

    def pages_for(self, n_positions: int) -> int:
        return -(-n_positions // self.page_size)

    def available(self) -> int:
        """Pages a new sequence may reserve: free + evictable − reserved by live ones."""
        reserved = sum(s.reserve for s in self.live.values())
        return self.alloc.n_free + self.tree.n_evictable() - reserved

    @property
    def max_capacity(self) -> int:
        """Pages a sequence could ever use, once the pool has grown to max_pages."""
        return self.max_pages - 1

    def fits_ever(self, n_positions: int) -> bool:
        return self.pages_for(n_positions) <= self.max_capacity

    def _room(self, need: int) -> bool:
        """Whether `need` more pages can be reserved now, growing the pool if it may."""
        short = need - self.available()
        if short > 0 and self.alloc.n_pages < self.max_pages:
            n = self.alloc.n_pages
            self.alloc.grow(min(self.max_pages, max(2 * n - 1, n + short)))
        return need <= self.available()

    def open(self, tokens: list[int], budget: int) -> SeqKV | None:
        """A sequence for `tokens` that may grow by `budget` tokens, sharing the longest
        cached prefix (at least one token is left to compute, for its logits). None when
        the pool cannot reserve its pages now; KVCacheFullError when it never could."""
        total = len(tokens) + budget
        if not self.fits_ever(total):
            raise KVCacheFullError(
                f"a request of {len(tokens)} prompt + {budget} new tokens needs "
                f"{self.pages_for(total)} KV pages; the pool has {self.max_capacity} "
                f"(of {self.page_size} tokens): lower max_tokens or make the pool larger"
            )
        shared = []
        if self.prefix_cache:
            shared = self.tree.match(tokens)[: (len(tokens) - 1) // self.page_size]
        self.alloc.incref(shared)
        need = self.pages_for(total) - len(shared)
        if not self._room(need):
            self.alloc.decref(shared)
            return None
        n = len(shared) * self.page_size
        seq = SeqKV(list(tokens), list(shared), n, need, cached_hit=n)
        self.live[seq.id] = seq
        return seq

    def ensure(self, seq: SeqKV, n_positions: int) -> None:
        """Give `seq` pages for its first n_positions positions (from its reservation)."""
        need = self.pages_for(n_positions) - len(seq.pages)
        if need <= 0:
            return
        if need > seq.reserve:
            raise KVCacheFullError(
                f"sequence {seq.id} needs {need} more pages but reserved {seq.reserve}"
            )
        if need > self.alloc.n_free:
            self.tree.evict(need - self.alloc.n_free)
        seq.pages += self.alloc.alloc(need)
        seq.reserve -= need

    def commit(self, seq: SeqKV, n: int) -> None:
        seq.n_cached += n

    def cache(self, seq: SeqKV) -> None:
        """Offer `seq`'s full computed pages to the prefix tree."""
        if self.prefix_cache:
            full = seq.n_cached // self.page_size
            self.tree.insert(seq.tokens[: full * self.page_size], seq.pages[:full])

    def fork(
        self, seq: SeqKV, budget: int, at: int | None = None
    ) -> tuple[SeqKV, list[tuple[int, int]]] | None:
        """A child sharing every full page of `seq`'s first `at` (default: all computed)
        positions; its partial last page (if any) is a copy. Returns (child, [(src, dst)]
        page copies for the device), or None if the pool cannot reserve its pages now."""
        at = seq.n_cached if at is None else min(at, seq.n_cached)
        full = at // self.page_size
        partial = at % self.page_size != 0
        total = len(seq.tokens) + budget
        need = self.pages_for(total) - full
        if not self.fits_ever(total):
            raise KVCacheFullError(f"a fork of {total} tokens can never fit the pool")
        if not self._room(need):
            return None
        shared = seq.pages[:full]
        self.alloc.incref(shared)
        child = SeqKV(list(seq.tokens), list(shared), at, need)
        self.live[child.id] = child
        copies = []
        if partial:
            self.ensure(child, at)
            copies.append((seq.pages[full], child.pages[full]))
        return child, copies

    def adopt(self, tokens: list[int], n_cached: int, budget: int) -> SeqKV | None:
        """A sequence whose first n_cached positions' K/V the caller writes into its
        (fresh) pages, e.g. a restored snapshot; None if the pool cannot reserve now."""
        total = len(tokens) + budget
        if not self.fits_ever(total):
            raise KVCacheFullError(f"a sequence of {total} tokens can never fit the pool")
        need = self.pages_for(total)
        if not self._room(need):
            return None
        seq = SeqKV(list(tokens), [], 0, need)
        self.live[seq.id] = seq
        self.ensure(seq, n_cached)
        seq.n_cached = n_cached
        return seq

    def release(self, seq: SeqKV, cache: bool = True) -> None:
        """The sequence ends: its full pages go to the prefix tree (if `cache`), then it
        drops its references; pages nobody else holds are free at once."""
        if seq.id not in self.live:
            return
        if cache:
            self.cache(seq)
        self.alloc.decref(seq.pages)
        seq.pages, seq.reserve = [], 0
        del self.live[seq.id]

    def stats(self) -> dict[str, int]:
        return {
            "pages_total": self.alloc.capacity,
            "pages_free": self.alloc.n_free,
            "pages_used": self.alloc.n_used,
            "pages_cached": self.tree.n_nodes,
            "page_size": self.page_size,
        }

    def check(self) -> None:
        """Invariants: each page's count equals its holders; free xor used; the tree's
        pages are full and spell their sequences' prefixes."""
        self.alloc.check()
        holders = [0] * self.alloc.n_pages
        for s in self.live.values():
            assert s.n_cached <= len(s.pages) * self.page_size
            for p in s.pages:
                holders[p] += 1
        for p in self.tree.owned_pages():
            holders[p] += 1
        for p in range(1, self.alloc.n_pages):
            assert holders[p] == self.alloc.refcount[p], (
                f"page {p}: count {self.alloc.refcount[p]}, holders {holders[p]}"
            )
        assert holders[0] == 0, "the null page is in a page table"
