"""The prefix tree: token-id prefixes whose KV is already in the page pool.

A radix tree at page granularity: each edge is one page's worth of token ids
(`page_size` of them) and the node below it owns the page holding their K/V, so a
path from the root spells a prefix and lists its pages in order. Only full pages
enter the tree, so a shared page is never written again (a sequence writes only past
its last full page; a partial page is copied on fork).

The tree holds one reference (in the `PageAllocator`) on each page it owns. A node
whose page has no other holder and that has no children is evictable; `evict` drops
such leaves least recently used first, which may expose their parents in turn.

With a local pool (sliding-window models, see `llamay.kv.pages`) a node may also own
the local layers' page of the same positions (`Node.local`, a reference in the local
allocator; 0 when the sequences that computed it had already released it). A prefix
ending at a node is reusable only where the nodes of the window before it all have
their local page (`KVManager.open`). `evict_local` drops unshared local pages alone,
least recently used first; the node keeps its global page.

A `salt` (any hashable, e.g. the LoRA adapter setting the K/V were computed with) keys
a separate set of prefixes: it joins the first page's key, so prefixes computed under
different salts never match one another (None: the unsalted prefixes).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from llamay.kv.pages import PageAllocator

_clock = itertools.count(1)


@dataclass(eq=False)
class Node:
    key: tuple[int, ...]  # the page's token ids (empty at the root)
    page: int
    parent: Node | None
    local: int = 0  # its page in the local pool (0: none)
    children: dict[tuple[int, ...], Node] = field(default_factory=dict)
    last_used: int = 0


class PrefixTree:
    def __init__(
        self, allocator: PageAllocator, page_size: int, local: PageAllocator | None = None
    ):
        self.alloc = allocator
        self.local = local
        self.page_size = page_size
        self.root = Node((), 0, None)
        self.n_nodes = 0

    def _chunks(self, tokens: Sequence[int], limit: int | None = None, salt=None):
        ps = self.page_size
        n = len(tokens) // ps if limit is None else min(limit, len(tokens) // ps)
        out = [tuple(tokens[i * ps : (i + 1) * ps]) for i in range(n)]
        if salt is not None and out:  # a tuple in the key: never equal to a token id
            out[0] = ((salt,), *out[0])
        return out

    def match_nodes(self, tokens: Sequence[int], salt=None) -> list[Node]:
        """The nodes of the longest cached page-aligned prefix of `tokens` (marked used)
        under `salt`."""
        node, nodes, now = self.root, [], next(_clock)
        for key in self._chunks(tokens, salt=salt):
            child = node.children.get(key)
            if child is None:
                break
            child.last_used = now
            nodes.append(child)
            node = child
        return nodes

    def match(self, tokens: Sequence[int], salt=None) -> list[int]:
        """Pages of the longest cached page-aligned prefix of `tokens` (marked used).
        The caller takes its own references (`alloc.incref`) if it keeps them."""
        return [n.page for n in self.match_nodes(tokens, salt)]

    def insert(
        self, tokens: Sequence[int], pages: Sequence[int], local: Sequence[int] = (), salt=None
    ) -> int:
        """Cache the full pages of a sequence: `pages[i]` holds tokens[i·ps : (i+1)·ps],
        `local[i]` (if given and not 0) the local layers' K/V of the same positions.
        Prefixes already cached keep their pages (a node without a local page takes the
        one offered). Returns how many pages were added."""
        node, added, now = self.root, 0, next(_clock)
        chunks = self._chunks(tokens, len(pages), salt)
        for i, (key, page) in enumerate(zip(chunks, pages, strict=False)):
            child = node.children.get(key)
            if child is None:
                self.alloc.incref([page])
                child = node.children[key] = Node(key, page, node)
                self.n_nodes += 1
                added += 1
            if i < len(local) and local[i] and not child.local:
                self.local.incref([local[i]])
                child.local = local[i]
            child.last_used = now
            node = child
        return added

    def nodes(self):
        stack = list(self.root.children.values())
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    def _evictable(self, n: Node) -> bool:
        return not n.children and self.alloc.refcount[n.page] == 1

    def n_evictable(self) -> int:
        """Pages `evict` could free now (leaves, and parents they would expose)."""

        def count(n: Node) -> tuple[int, bool]:
            total, all_free = 0, True
            for c in n.children.values():
                t, f = count(c)
                total += t
                all_free &= f
            free = all_free and (n is self.root or self.alloc.refcount[n.page] == 1)
            return total + (free and n is not self.root), free

        return count(self.root)[0]

    def evict(self, n: int) -> int:
        """Free up to n pages by dropping unreferenced leaves, least recently used first.
        Returns the number of pages freed."""
        freed = 0
        while freed < n:
            leaves = [x for x in self.nodes() if self._evictable(x)]
            if not leaves:
                break
            leaves.sort(key=lambda x: x.last_used)
            for leaf in leaves[: n - freed]:
                del leaf.parent.children[leaf.key]
                self.n_nodes -= 1
                freed += len(self.alloc.decref([leaf.page]))
                self._drop_local(leaf)
        return freed

    def _drop_local(self, node: Node) -> int:
        """Drop the node's local page; returns 1 if that freed it."""
        page, node.local = node.local, 0
        return len(self.local.decref([page])) if page else 0

    def _local_evictable(self) -> list[Node]:
        if self.local is None:
            return []
        return [n for n in self.nodes() if n.local and self.local.refcount[n.local] == 1]

    def n_evictable_local(self) -> int:
        """Local pages `evict_local` could free now (those no sequence holds)."""
        return len(self._local_evictable())

    def evict_local(self, n: int) -> int:
        """Free up to n local pages no sequence holds, least recently used first (their
        nodes stay, no longer usable as the end of a prefix hit). Returns pages freed."""
        nodes = sorted(self._local_evictable(), key=lambda x: x.last_used)
        return sum(self._drop_local(x) for x in nodes[:n])

    def clear(self) -> None:
        """Drop every node (pages still held by sequences stay allocated)."""
        for n in list(self.nodes()):
            self.alloc.decref([n.page])
            self._drop_local(n)
        self.root.children.clear()
        self.n_nodes = 0

    def owned_pages(self) -> list[int]:
        return [n.page for n in self.nodes()]

    def owned_local_pages(self) -> list[int]:
        return [n.local for n in self.nodes() if n.local]
