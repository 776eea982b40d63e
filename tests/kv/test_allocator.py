"""The page allocator, prefix tree and sequence bookkeeping under random workloads.

A hypothesis state machine submits, steps, forks, cancels, finishes and evicts (in a
pool that grows on demand), and a host model of every page's contents checks what the
device would hold: a sequence reads back its own tokens, and a page with another
holder is never written. The same machine runs with a sliding window (a second, local
pool whose pages a sequence releases behind its window): there a sequence reads back
its window's tokens through its local pages, and both pools' counts return to the
start.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from llamay.errors import KVCacheFullError
from llamay.kv.pages import PageAllocator
from llamay.kv.sequences import KVManager

PS = 4
N_PAGES = 24
MAX_FEED = 5  # positions one step feeds at most (the engine's prefill chunk)


def test_allocator_basics():
    a = PageAllocator(4)
    assert a.capacity == 3 and a.n_free == 3
    p = a.alloc(2)
    assert 0 not in p and a.n_used == 2
    a.incref(p[:1])
    assert a.decref(p) == [p[1]]
    assert a.decref(p[:1]) == [p[0]]
    with pytest.raises(KVCacheFullError, match="free pages"):
        a.alloc(4)
    with pytest.raises(ValueError):
        a.decref([0])
    a.check()


def test_prefix_hit_leaves_one_token_to_compute():
    m = KVManager(16, PS)
    s = m.open(list(range(8)), 4)
    m.ensure(s, 8)
    m.commit(s, 8)
    m.release(s)
    again = m.open(list(range(8)), 4)  # all cached, but the last token is recomputed
    assert again.n_cached == 4 and again.cached_hit == 4
    longer = m.open(list(range(9)), 4)
    assert longer.n_cached == 8
    m.check()


def test_never_fits_is_an_error_and_busy_is_none():
    m = KVManager(5, PS)  # capacity 4 pages = 16 tokens
    with pytest.raises(KVCacheFullError, match="pool"):
        m.open([1] * 10, 10)
    a = m.open([1] * 4, 8)  # reserves 3
    assert a is not None and m.open([2] * 4, 4) is None
    m.release(a, cache=False)
    assert m.open([2] * 4, 4) is not None


tokens = st.lists(st.integers(0, 2), min_size=1, max_size=16)  # tiny alphabet: shared prefixes


class PoolMachine(RuleBasedStateMachine):
    WINDOW = 0

    @initialize()
    def setup(self):
        # grows as reservations need
        self.m = KVManager(
            N_PAGES // 3, PS, max_pages=N_PAGES, window=self.WINDOW, local_pages=6,
            max_local_pages=N_PAGES, max_feed=MAX_FEED,
        )  # fmt: skip
        self.seqs = []
        self.content = {}  # page -> {offset: token}: what the device holds
        self.local_content = {}  # the same for the local pool

    def _write(self, seq, start, end):
        for pos in range(start, end):
            page = seq.pages[pos // PS]
            assert self.m.alloc.refcount[page] == 1, "wrote into a shared page"
            self.content.setdefault(page, {})[pos % PS] = seq.tokens[pos]
            if self.WINDOW:
                page = seq.local[pos // PS]
                assert page and self.m.local.refcount[page] == 1, "wrote into a shared local page"
                self.local_content.setdefault(page, {})[pos % PS] = seq.tokens[pos]

    @rule(prompt=tokens, budget=st.integers(0, 8))
    def submit(self, prompt, budget):
        seq = self.m.open(prompt, budget + 1)
        if seq is not None:
            seq.budget = budget
            self.seqs.append(seq)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), more=tokens, budget=st.integers(0, 4))
    def resubmit(self, data, more, budget):
        """A prompt continuing (part of) a live sequence's: a likely prefix hit."""
        seq = data.draw(st.sampled_from(self.seqs))
        cut = data.draw(st.integers(0, len(seq.tokens)))
        self.submit(seq.tokens[:cut] + more, budget)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def cache(self, data):
        """Offer a running sequence's pages to the tree (as at the end of its prompt)."""
        self.m.cache(data.draw(st.sampled_from(self.seqs)))

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def step(self, data):
        self._advance(data.draw(st.sampled_from(self.seqs)), data)

    def _advance(self, seq, data):
        pending = len(seq.pending)
        if pending == 0:
            if seq.budget == 0:
                return
            seq.tokens.append(data.draw(st.integers(0, 2)))
            seq.budget -= 1
            pending = 1
        n = data.draw(st.integers(1, min(pending, MAX_FEED)))
        self.m.ensure(seq, seq.n_cached + n)
        self._write(seq, seq.n_cached, seq.n_cached + n)
        self.m.commit(seq, n)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def run(self, data):
        """Steps one sequence to the end of its budget (well past a small window)."""
        seq = data.draw(st.sampled_from(self.seqs))
        while seq.pending or seq.budget:
            self._advance(seq, data)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), budget=st.integers(0, 6))
    def fork(self, data, budget):
        seq = data.draw(st.sampled_from(self.seqs))
        out = self.m.fork(seq, budget + 1)
        if out is None:
            return
        child, copies, local_copies = out
        assert bool(local_copies) == (self.WINDOW > 0 and child.n_cached > 0)
        for src, dst in copies:
            self.content[dst] = dict(self.content.get(src, {}))
        for src, dst in local_copies:
            self.local_content[dst] = dict(self.local_content.get(src, {}))
        child.budget = budget
        self.seqs.append(child)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), cache=st.booleans())
    def end(self, data, cache):
        seq = data.draw(st.sampled_from(self.seqs))
        self.seqs.remove(seq)
        self.m.release(seq, cache=cache)

    @rule(n=st.integers(1, 8))
    def evict(self, n):
        self.m.tree.evict(n)

    @precondition(lambda self: self.WINDOW)
    @rule(n=st.integers(1, 8))
    def evict_local(self, n):
        self.m.tree.evict_local(n)

    @invariant()
    def consistent(self):
        self.m.check()
        for seq in self.seqs:  # every computed position reads back its token
            for pos in range(seq.n_cached):
                page = seq.pages[pos // PS]
                assert self.content[page][pos % PS] == seq.tokens[pos]
        for node in self.m.tree.nodes():  # the tree's pages hold their keys
            assert [self.content[node.page][i] for i in range(PS)] == list(node.key)
        if not self.WINDOW:
            return
        for seq in self.seqs:  # the window of the next position reads back its tokens
            lo = max(0, seq.n_cached - self.WINDOW + 1)
            assert self.m.needed_from(seq.n_cached) == lo // PS
            for pos in range(lo, seq.n_cached):
                page = seq.local[pos // PS]
                assert self.local_content[page][pos % PS] == seq.tokens[pos]
            held = sum(1 for p in seq.local if p)
            assert held <= seq.local_bound
        for node in self.m.tree.nodes():
            if node.local:
                assert [self.local_content[node.local][i] for i in range(PS)] == list(node.key)

    def teardown(self):
        for seq in self.seqs:
            self.m.release(seq)
        self.m.tree.clear()
        self.m.check()
        assert self.m.alloc.n_free == self.m.alloc.capacity
        if self.WINDOW:
            assert self.m.local.n_free == self.m.local.capacity


PoolMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_pool_machine = PoolMachine.TestCase


class WindowPoolMachine(PoolMachine):
    WINDOW = 5  # not a multiple of PS: windows start mid-page


WindowPoolMachine.TestCase.settings = settings(PoolMachine.TestCase.settings, max_examples=80)
test_window_pool_machine = WindowPoolMachine.TestCase


def test_growth_stops_at_max_pages():
    m = KVManager(3, PS, max_pages=9)  # 2 pages now, 8 at most
    a = m.open([1] * 12, 8)  # 5 pages: grows
    assert a is not None and m.alloc.n_pages >= 6
    assert m.open([2] * 12, 8) is None  # 5 more would pass max_pages: wait
    assert m.alloc.n_pages == 9
    with pytest.raises(KVCacheFullError, match="pool has 8"):
        m.open([3] * 30, 8)
    m.release(a, cache=False)
    assert m.open([2] * 12, 8) is not None
    m.check()


def test_local_pool_admission_and_never_fits():
    # window 6, steps of up to 4 positions: a sequence holds at most 4 local pages
    m = KVManager(64, PS, window=6, local_pages=4, max_local_pages=4, max_feed=4)
    assert m.local_bound(100) == 4 and m.local_bound(8) == 2
    with pytest.raises(KVCacheFullError, match="4 local pages"):
        m.open([1] * 30, 8)  # the local pool has 3 pages, and may not grow
    a = m.open([1] * 4, 4)
    assert a is not None and m.open([2] * 4, 4) is None  # 2 + 2 local pages > 3
    m.release(a, cache=False)
    assert m.open([2] * 4, 4) is not None
    m.check()


def test_local_pages_slide_behind_the_window():
    m = KVManager(64, PS, window=6, local_pages=8, max_feed=4)
    s = m.open(list(range(30)), 2)
    while s.pending:
        n = min(4, len(s.pending))
        m.ensure(s, s.n_cached + n)
        assert sum(1 for p in s.local if p) <= s.local_bound
        m.commit(s, n)
        m.check()
    # positions 23.. are in the window of position 29 and of the boundary at 28
    assert s.local[: (28 - 6 + 1) // PS] == [0] * 5 and all(s.local[5:])
    assert len(s.pages) == 8 and m.local.n_used == 3
    m.release(s)  # the tree keeps the window's full pages: pages 5 and 6
    assert sorted(n.local != 0 for n in m.tree.nodes()) == [False] * 5 + [True] * 2
    hit = m.open(list(range(28)) + [99], 2)  # ends at 28, whose window is cached
    assert hit.n_cached == 28 and hit.local[:5] == [0] * 5 and all(hit.local[5:7])
    m.release(hit, cache=False)
    assert m.open(list(range(20)) + [99], 2).n_cached == 0  # 20's window was released
    m.tree.clear()
    for seq in list(m.live.values()):
        m.release(seq, cache=False)
    assert m.local.n_free == m.local.capacity and m.alloc.n_free == m.alloc.capacity
