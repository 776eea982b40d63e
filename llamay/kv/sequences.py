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

With `window` (a sliding-window model: its local layers have their own pool, see
`llamay.kv.pages`) each sequence also has `local`, its local-pool page per entry of
`pages` (the null page once outside the window). A step that feeds positions
[start, end) needs the local pages of [start − window + 1, end); a sequence keeps
those of [f − window + 1, …), f the last page boundary below its last cached position,
so that its last two page boundaries can end a prefix hit or a fork, and releases the
rest as it advances (`slide`). It holds at most `local_bound` local pages at once:
ceil(window/page_size) + 2 while decoding (window a multiple of page_size), a few
more during a prefill chunk. Admission reserves that bound in the local pool, less the
pages it holds alone (a page shared with the prefix tree may stay when it moves on).
Fork copies the local window (local pages are never shared between sequences except
through the prefix tree, and a full page is never written again), restore writes it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from llamay.errors import KVCacheFullError
from llamay.kv.pages import NULL_PAGE, PageAllocator
from llamay.kv.radix import PrefixTree

_ids = itertools.count(1)


def local_bound(window: int, page_size: int, max_feed: int, total: int) -> int:
    """The most local pages a sequence of `total` positions holds at once: those of the
    positions from the window before its kept page boundary (< page_size before its
    next position) to the end of a step feeding up to `max_feed` positions, however
    they are aligned; never more than its whole length's pages."""
    held = window + page_size + max_feed - 1
    span = (held + page_size - 2) // page_size + 1
    return min(-(-total // page_size), span)


def _room(alloc: PageAllocator, limit: int, need: int, available) -> bool:
    """Whether `need` more pages of `alloc` can be reserved now (`available()` of them
    are), first growing it, doubling up to `limit` pages, if that is short."""
    short = need - available()
    if short > 0 and alloc.n_pages < limit:
        n = alloc.n_pages
        alloc.grow(min(limit, max(2 * n - 1, n + short)))
    return need <= available()


@dataclass(eq=False)
class SeqKV:
    tokens: list[int]
    pages: list[int] = field(default_factory=list)
    n_cached: int = 0  # positions whose K/V are in `pages`
    reserve: int = 0  # pages it may still allocate
    cached_hit: int = 0  # tokens served from the prefix tree at open
    id: int = field(default_factory=lambda: next(_ids))
    local: list[int] = field(default_factory=list)  # local-pool page per entry of pages
    local_bound: int = 0  # the most local pages it may hold at once
    salt: Any = None  # its prefixes' key in the tree (the LoRA setting its K/V were made with)

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
        window: int = 0,
        local_pages: int = 0,
        max_local_pages: int | None = None,
        max_feed: int = 128,
    ):
        """`window` > 0: the model's local layers keep `local_pages` pages of their own
        (growing up to `max_local_pages`); `max_feed` is the most positions one step
        feeds a sequence (the engine's prefill chunk), which bounds its local pages."""
        self.page_size = page_size
        self.alloc = PageAllocator(n_pages)
        self.max_pages = max(n_pages, max_pages or n_pages)
        self.window = window
        self.local = PageAllocator(local_pages) if window > 0 else None
        self.max_local_pages = max(local_pages, max_local_pages or local_pages)
        self.max_feed = max(2, max_feed)  # 2: a decode step planned ahead of the last
        self.tree = PrefixTree(self.alloc, page_size, self.local)
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
        return self.pages_for(n_positions) <= self.max_capacity and (
            self.local is None or self.local_bound(n_positions) < self.max_local_pages
        )

    def never_fits(self, what: str, total: int) -> KVCacheFullError:
        """The error for `what` (of `total` positions) that `fits_ever` refused."""
        local = ""
        if self.local is not None:
            local = (
                f" and {self.local_bound(total)} local pages (the local pool has "
                f"{self.max_local_pages - 1})"
            )
        return KVCacheFullError(
            f"{what} needs {self.pages_for(total)} KV pages; the pool has {self.max_capacity} "
            f"(of {self.page_size} tokens){local}: lower max_tokens or make the pool larger"
        )

    def _room(self, need: int) -> bool:
        """Whether `need` more pages can be reserved now, growing the pool if it may."""
        return _room(self.alloc, self.max_pages, need, self.available)

    # -- the local pool (sliding-window layers) -----------------------------------------

    def local_bound(self, total: int) -> int:
        """The most local pages a sequence of `total` positions holds at once."""
        return local_bound(self.window, self.page_size, self.max_feed, total)

    def needed_from(self, n_positions: int) -> int:
        """The first page whose local K/V a query at position n_positions attends to."""
        return max(0, n_positions - self.window + 1) // self.page_size

    def _kept_from(self, seq: SeqKV) -> int:
        """The first local page `seq` keeps: the window before its last page boundary
        below its last cached position (so that boundary can end a hit or a fork)."""
        last = max(seq.n_cached - 1, 0)
        return self.needed_from(last // self.page_size * self.page_size)

    def _local_reserve(self, seq: SeqKV) -> int:
        held_alone = sum(1 for p in seq.local if p and self.local.refcount[p] == 1)
        return seq.local_bound - held_alone

    def available_local(self) -> int:
        """Local pages a new sequence may reserve: free + evictable − reserved."""
        reserved = sum(self._local_reserve(s) for s in self.live.values())
        return self.local.n_free + self.tree.n_evictable_local() - reserved

    def _room_local(self, need: int) -> bool:
        if self.local is None:
            return True
        return _room(self.local, self.max_local_pages, need, self.available_local)

    def slide(self, seq: SeqKV) -> None:
        """Release `seq`'s local pages wholly before the window it keeps."""
        if self.local is None:
            return
        i = min(self._kept_from(seq), len(seq.local)) - 1
        while i >= 0 and seq.local[i]:  # the released pages are a prefix
            self.local.decref([seq.local[i]])
            seq.local[i] = NULL_PAGE
            i -= 1

    def _ensure_local(self, seq: SeqKV, n_positions: int) -> None:
        seq.local += [NULL_PAGE] * (len(seq.pages) - len(seq.local))
        self.slide(seq)
        want = [
            i
            for i in range(self.needed_from(seq.n_cached), self.pages_for(n_positions))
            if not seq.local[i]
        ]
        held = sum(1 for p in seq.local if p)
        if held + len(want) > seq.local_bound:
            raise KVCacheFullError(
                f"sequence {seq.id} would hold {held + len(want)} local pages, more than "
                f"its bound {seq.local_bound} (a step fed more than max_feed positions?)"
            )
        if len(want) > self.local.n_free:
            self.tree.evict_local(len(want) - self.local.n_free)
        for i, p in zip(want, self.local.alloc(len(want)), strict=True):
            seq.local[i] = p

    # -- sequences ------------------------------------------------------------------------

    def _usable_hit(self, nodes: list) -> int:
        """How many of the matched nodes a hit may use: all without a local pool, else
        the longest run whose last window's nodes all keep their local page."""
        if self.local is None:
            return len(nodes)
        run = [0]  # run[d]: nodes ending at d (exclusive) that have a local page
        for n in nodes:
            run.append(run[-1] + 1 if n.local else 0)
        for d in range(len(nodes), 0, -1):
            if run[d] >= d - self.needed_from(d * self.page_size):
                return d
        return 0

    def open(
        self, tokens: list[int], budget: int, salt: Any = None, reuse: bool = True
    ) -> SeqKV | None:
        """A sequence for `tokens` that may grow by `budget` tokens, sharing the longest
        cached prefix (at least one token is left to compute, for its logits; with a
        local pool, ending where the window before it is cached too). None when the
        pool cannot reserve its pages now; KVCacheFullError when it never could. `salt`:
        the prefixes it shares and offers are those cached under that key only; `reuse`
        False: none shared (the whole prompt computed)."""
        total = len(tokens) + budget
        if not self.fits_ever(total):
            raise self.never_fits(f"a request of {len(tokens)} prompt + {budget} new tokens", total)
        nodes = []
        if self.prefix_cache and reuse:
            nodes = self.tree.match_nodes(tokens, salt)[: (len(tokens) - 1) // self.page_size]
            nodes = nodes[: self._usable_hit(nodes)]
        shared = [n.page for n in nodes]
        lo = self.needed_from(len(nodes) * self.page_size)
        local = [n.local if i >= lo else NULL_PAGE for i, n in enumerate(nodes)]
        self.alloc.incref(shared)
        if self.local is not None:
            self.local.incref([p for p in local if p])
        need = self.pages_for(total) - len(shared)
        bound = self.local_bound(total) if self.local is not None else 0
        if not (self._room(need) and self._room_local(bound)):
            self.alloc.decref(shared)
            if self.local is not None:
                self.local.decref([p for p in local if p])
            return None
        n = len(shared) * self.page_size
        seq = SeqKV(list(tokens), list(shared), n, need, cached_hit=n, local=local, salt=salt)
        seq.local_bound = bound
        self.live[seq.id] = seq
        return seq

    def ensure(self, seq: SeqKV, n_positions: int) -> None:
        """Give `seq` pages for its first n_positions positions (from its reservation),
        and local pages for the window of the positions it feeds next."""
        need = self.pages_for(n_positions) - len(seq.pages)
        if need > seq.reserve:
            raise KVCacheFullError(
                f"sequence {seq.id} needs {need} more pages but reserved {seq.reserve}"
            )
        if need > 0:
            if need > self.alloc.n_free:
                self.tree.evict(need - self.alloc.n_free)
            seq.pages += self.alloc.alloc(need)
            seq.reserve -= need
        if self.local is not None:
            self._ensure_local(seq, n_positions)

    def commit(self, seq: SeqKV, n: int) -> None:
        seq.n_cached += n
        self.slide(seq)

    def cache(self, seq: SeqKV, ending: bool = False) -> None:
        """Offer `seq`'s full computed pages to the prefix tree, with their local pages
        if it is `ending` or the local pool has room to leave them shared."""
        if not self.prefix_cache:
            return
        full = seq.n_cached // self.page_size
        local = []
        if self.local is not None:
            local = seq.local[:full]
            alone = sum(1 for p in local if p and self.local.refcount[p] == 1)
            if not ending and alone > self.available_local():
                local = []  # sharing them would eat into live sequences' reservations
        self.tree.insert(seq.tokens[: full * self.page_size], seq.pages[:full], local, seq.salt)

    def fork(
        self, seq: SeqKV, budget: int, at: int | None = None
    ) -> tuple[SeqKV, list[tuple[int, int]], list[tuple[int, int]]] | None:
        """A child sharing every full page of `seq`'s first `at` (default: all computed)
        positions; its partial last page (if any) is a copy, and so is the local window
        before `at`. Returns (child, [(src, dst)] page copies, [(src, dst)] local-pool
        copies) for the device, or None if the pool cannot reserve its pages now."""
        at = seq.n_cached if at is None else min(at, seq.n_cached)
        full = at // self.page_size
        partial = at % self.page_size != 0
        total = len(seq.tokens) + budget
        need = self.pages_for(total) - full
        if not self.fits_ever(total):
            raise self.never_fits(f"a fork of {total} tokens", total)
        window = range(self.needed_from(at), self.pages_for(at)) if self.local else range(0)
        if any(not seq.local[i] for i in window):
            raise ValueError(
                f"cannot fork sequence {seq.id} at {at}: its local window there is released"
            )
        bound = self.local_bound(total) if self.local is not None else 0
        if not (self._room(need) and self._room_local(bound)):
            return None
        shared = seq.pages[:full]
        self.alloc.incref(shared)
        child = SeqKV(list(seq.tokens), list(shared), at, need, local_bound=bound, salt=seq.salt)
        self.live[child.id] = child
        local_copies = []
        if self.local is not None:
            child.local = [NULL_PAGE] * self.pages_for(at)
            if len(window) > self.local.n_free:
                self.tree.evict_local(len(window) - self.local.n_free)
            for i, p in zip(window, self.local.alloc(len(window)), strict=True):
                child.local[i] = p
                local_copies.append((seq.local[i], p))
        copies = []
        if partial:
            self.ensure(child, at)
            copies.append((seq.pages[full], child.pages[full]))
        return child, copies, local_copies

    def adopt(
        self, tokens: list[int], n_cached: int, budget: int, salt: Any = None
    ) -> SeqKV | None:
        """A sequence whose first n_cached positions' K/V the caller writes into its
        (fresh) pages, e.g. a restored snapshot (the local layers': into its local pages,
        those of the window before n_cached); None if the pool cannot reserve now."""
        total = len(tokens) + budget
        if not self.fits_ever(total):
            raise self.never_fits(f"a sequence of {total} tokens", total)
        need = self.pages_for(total)
        bound = self.local_bound(total) if self.local is not None else 0
        if not (self._room(need) and self._room_local(bound)):
            return None
        seq = SeqKV(list(tokens), [], n_cached, need, local_bound=bound, salt=salt)
        self.live[seq.id] = seq
        self.ensure(seq, n_cached)
        return seq

    def release(self, seq: SeqKV, cache: bool = True) -> None:
        """The sequence ends: its full pages go to the prefix tree (if `cache`), then it
        drops its references; pages nobody else holds are free at once."""
        if seq.id not in self.live:
            return
        if cache:
            self.cache(seq, ending=True)
        self.alloc.decref(seq.pages)
        if self.local is not None:
            self.local.decref([p for p in seq.local if p])
        seq.pages, seq.local, seq.reserve = [], [], 0
        del self.live[seq.id]

    def stats(self) -> dict[str, int]:
        out = {
            "pages_total": self.alloc.capacity,
            "pages_free": self.alloc.n_free,
            "pages_used": self.alloc.n_used,
            "pages_cached": self.tree.n_nodes,
            "page_size": self.page_size,
        }
        if self.local is not None:
            out |= {
                "local_pages_total": self.local.capacity,
                "local_pages_free": self.local.n_free,
                "local_pages_used": self.local.n_used,
            }
        return out

    def check(self) -> None:
        """Invariants: each page's count equals its holders; free xor used; the tree's
        pages are full and spell their sequences' prefixes. Local pool: the same, and
        each sequence holds its next query's window and no more than its bound."""
        self.alloc.check()
        holders = [0] * self.alloc.n_pages
        for s in self.live.values():
            assert s.n_cached <= len(s.pages) * self.page_size
            for p in s.pages:
                holders[p] += 1
        for p in self.tree.owned_pages():
            holders[p] += 1
        _check_holders(self.alloc, holders, "page")
        assert holders[0] == 0, "the null page is in a page table"
        if self.local is None:
            return
        self.local.check()
        holders = [0] * self.local.n_pages
        for s in self.live.values():
            held = [p for p in s.local if p]
            assert len(held) <= s.local_bound, f"sequence {s.id} holds {len(held)} local pages"
            for i in range(self.needed_from(s.n_cached), self.pages_for(s.n_cached)):
                assert s.local[i], f"sequence {s.id} lost local page {i} of its window"
            for p in held:
                holders[p] += 1
        for p in self.tree.owned_local_pages():
            holders[p] += 1
        _check_holders(self.local, holders, "local page")
        assert self.available_local() >= 0, "local reservations exceed the pool"


def _check_holders(alloc, holders: list[int], what: str) -> None:
    """Every page's reference count equals the number of its holders (page 0 excluded)."""
    for p in range(1, alloc.n_pages):
        assert holders[p] == alloc.refcount[p], (
            f"{what} {p}: count {alloc.refcount[p]}, holders {holders[p]}"
        )
