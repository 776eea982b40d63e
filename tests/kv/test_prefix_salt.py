"""Salted prefixes (`PrefixTree`/`KVManager` salt: the K/V's LoRA setting): a prefix cached
under one salt is found under that salt only, forks keep their parent's, and the pool's
invariants (`KVManager.check`) hold throughout."""

from __future__ import annotations

from llamay.kv.sequences import KVManager

PS = 4
TOKENS = list(range(100, 117))  # four full pages and one token


def _cached(m: KVManager, salt) -> int:
    s = m.open(TOKENS, 4, salt)
    hit = s.cached_hit
    m.release(s)
    m.check()
    return hit


def test_a_prefix_is_shared_under_its_salt_only():
    m = KVManager(32, PS)
    a = m.open(TOKENS, 4, ("lora", (0.5,)))
    m.ensure(a, len(TOKENS))
    m.commit(a, len(TOKENS))
    m.release(a)  # its four full pages go to the tree under its salt
    m.check()
    assert _cached(m, None) == 0
    assert _cached(m, ("lora", (0.7,))) == 0
    assert _cached(m, ("lora", (0.5,))) == 16
    b = m.open(TOKENS, 4)  # the unsalted prefixes are their own
    m.ensure(b, len(TOKENS))
    m.commit(b, len(TOKENS))
    m.release(b)
    assert _cached(m, None) == 16
    assert _cached(m, ("lora", (0.5,))) == 16
    assert m.tree.n_nodes == 8
    m.check()


def test_a_fork_keeps_its_parents_salt():
    m = KVManager(32, PS)
    salt = ("lora", (1.0, 0.0))
    p = m.open(TOKENS, 8, salt)
    m.ensure(p, len(TOKENS))
    m.commit(p, len(TOKENS))
    child, _, _ = m.fork(p, 8)
    assert child.salt == salt
    m.release(p)
    m.release(child)
    assert _cached(m, salt) == 16 and _cached(m, None) == 0
