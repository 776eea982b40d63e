"""The page allocator, prefix tree and sequence bookkeeping under random workloads.

A hypothesis state machine submits, steps, forks, cancels, finishes and evicts (in a
pool that grows on demand), and a host model of every page's contents checks what the
device would hold: a sequence reads back its own tokens, and a page with another
holder is never written.
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


tokens = st.lists(st.integers(0, 2), min_size=1, max_size=14)  # tiny alphabet: shared prefixes


class PoolMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self):
        self.m = KVManager(N_PAGES // 3, PS, max_pages=N_PAGES)  # grows as reservations need
        self.seqs = []
        self.content = {}  # page -> {offset: token}: what the device holds

    def _write(self, seq, start, end):
        for pos in range(start, end):
            page = seq.pages[pos // PS]
            assert self.m.alloc.refcount[page] == 1, "wrote into a shared page"
            self.content.setdefault(page, {})[pos % PS] = seq.tokens[pos]

    @rule(prompt=tokens, budget=st.integers(0, 8))
    def submit(self, prompt, budget):
        seq = self.m.open(prompt, budget + 1)
        if seq is not None:
            seq.budget = budget
            self.seqs.append(seq)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def step(self, data):
        seq = data.draw(st.sampled_from(self.seqs))
        pending = len(seq.pending)
        if pending == 0:
            if seq.budget == 0:
                return
            seq.tokens.append(data.draw(st.integers(0, 2)))
            seq.budget -= 1
            pending = 1
        n = data.draw(st.integers(1, pending))
        self.m.ensure(seq, seq.n_cached + n)
        self._write(seq, seq.n_cached, seq.n_cached + n)
        self.m.commit(seq, n)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), budget=st.integers(0, 6))
    def fork(self, data, budget):
        seq = data.draw(st.sampled_from(self.seqs))
        out = self.m.fork(seq, budget + 1)
        if out is None:
            return
        child, copies = out
        for src, dst in copies:
            self.content[dst] = dict(self.content.get(src, {}))
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

    @invariant()
    def consistent(self):
        self.m.check()
        for seq in self.seqs:  # every computed position reads back its token
            for pos in range(seq.n_cached):
                page = seq.pages[pos // PS]
                assert self.content[page][pos % PS] == seq.tokens[pos]
        for node in self.m.tree.nodes():  # the tree's pages hold their keys
            assert [self.content[node.page][i] for i in range(PS)] == list(node.key)

    def teardown(self):
        for seq in self.seqs:
            self.m.release(seq)
        self.m.tree.clear()
        self.m.check()
        assert self.m.alloc.n_free == self.m.alloc.capacity


PoolMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_pool_machine = PoolMachine.TestCase


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
