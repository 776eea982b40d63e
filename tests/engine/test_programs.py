"""Step programs kept on disk (`llamay.engine.programs`, issue 18.1): a second start on
the same model loads every step program `prime` makes ready instead of tracing,
lowering or compiling it, and the engine's requests then compile nothing and give the
tokens plain `jax.jit` gives; a corrupted, truncated or foreign entry is ignored with
one log line and rebuilt; the key follows the model and the numerics."""

from __future__ import annotations

import dataclasses
import logging

import jax
import pytest
from fixture_data import tiny_model_file

import llamay
from llamay.engine import programs
from llamay.engine.api import Request
from llamay.engine.paged_steps import _set_rows, paged_decode, paged_sample, paged_step
from llamay.engine.warmup import _step_args, prime, step_shapes
from llamay.sample import GREEDY
from llamay.serve.models import make_engine

pytestmark = pytest.mark.slow

TRACE = "/jax/core/compile/jaxpr_trace_duration"
COMPILE = "/jax/core/compile/backend_compile_duration"
CTX = 256  # page tables of 16 pages only: few programs
ROWS = (1, 2)


class Events:
    def __init__(self):
        self.traced: list[str] = []
        self.compiles = 0

    def __call__(self, event: str, duration: float, fun_name: str = "", **_) -> None:
        if event == TRACE:
            self.traced.append(fun_name)
        elif event == COMPILE:
            self.compiles += 1

    def __enter__(self):
        jax.monitoring.register_event_duration_secs_listener(self)
        return self

    def __exit__(self, *exc):
        jax.monitoring.unregister_event_duration_listener(self)


def forget() -> None:
    """What a new process would not have: the programs in memory."""
    for p in (paged_step, paged_sample, paged_decode, _set_rows):
        p.clear_cache()


def requests(e) -> list[list[int]]:
    long = [(7 * i) % 200 + 20 for i in range(150)]
    out = [list(e.submit(Request([1, 2, 3, 4], 4, GREEDY)))]
    out.append(list(e.submit(Request(long, 4, GREEDY))))
    out.append(list(e.submit(Request(long + [42], 3, GREEDY))))  # a prefix hit
    probs = dataclasses.replace(GREEDY, n_probs=3)
    out.append(list(e.submit(Request([9, 10, 11], 3, probs))))
    hs = [e.submit(Request([50 + k, 60 + k], 5, GREEDY)) for k in range(2)]
    out += [list(h) for h in hs]
    return [[ev.token_id for ev in evs] for evs in out]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMAY_CACHE", str(tmp_path))
    monkeypatch.delenv("LLAMAY_NO_PROGRAM_CACHE", raising=False)
    monkeypatch.delenv("LLAMAY_NO_COMPILE_CACHE", raising=False)
    forget()
    yield tmp_path / "programs"
    forget()


@pytest.fixture(scope="module")
def tiny():
    return llamay.load(tiny_model_file("llama"), n_ctx=CTX)


def test_second_start_loads_every_program_and_compiles_nothing(cache, tiny, monkeypatch):
    e = make_engine(tiny, parallel=2)
    try:
        before = programs.STATS.copy()
        prime(e, length=CTX)
        built = programs.STATS["compiled"] - before["compiled"]
        n_steps = len(step_shapes(e, ROWS, CTX))
        assert built >= n_steps and programs.STATS["disk"] == before["disk"]
        assert len(list(cache.glob("*.prog"))) == built
    finally:
        e.close()

    forget()  # the second start
    e = make_engine(tiny, parallel=2)
    try:
        before = programs.STATS.copy()
        with Events() as ev:
            prime(e, length=CTX)
        assert programs.STATS["disk"] - before["disk"] == built
        assert programs.STATS["compiled"] == before["compiled"]
        ours = {"paged_step", "paged_sample", "paged_decode", "_set_rows"}
        assert not ours & set(ev.traced), ev.traced
        with Events() as ev:
            got = requests(e)
        assert (ev.compiles, ev.traced) == (0, [])
        # donation survives a program read from disk: the pool passed in is consumed
        old = e.kv
        e.on_worker(lambda e: e.__setattr__("kv", paged_step(*_step_args(e, step_shapes(e)[0]))[1]))
        assert all(x.is_deleted() for x in jax.tree_util.tree_leaves(old))
    finally:
        e.close()

    # the oracle: plain jax.jit programs, traced here
    monkeypatch.setenv("LLAMAY_NO_PROGRAM_CACHE", "1")
    e = make_engine(tiny, parallel=2)
    try:
        assert requests(e) == got
    finally:
        e.close()


def test_bad_entries_are_logged_once_and_rebuilt(cache, tiny, caplog):
    e = make_engine(tiny, parallel=1)
    try:
        args = e.on_worker(lambda e: programs.abstract(_step_args(e, step_shapes(e)[0])))
        assert paged_step.prepare(*args) == "compiled"
        (entry,) = cache.glob("*.prog")
        good = entry.read_bytes()
        bad = {
            "corrupted": good[:-100] + bytes(b ^ 0xFF for b in good[-100:]),
            "truncated": good[: len(good) // 2],
            "not ours": b"\x00garbage" * 10,
            "another format": good.replace(b'"format": 1', b'"format": 9', 1),
        }
        for what, data in bad.items():
            forget()
            entry.write_bytes(data)
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="llamay.engine.programs"):
                assert paged_step.prepare(*args) == "compiled", what
            lines = [r for r in caplog.records if r.name == "llamay.engine.programs"]
            assert len(lines) == 1 and entry.name in lines[0].getMessage(), what
            assert entry.read_bytes() != data  # rebuilt in place
        forget()
        assert paged_step.prepare(*args) == "disk"  # and the rebuilt one loads
        logits, e.kv = e.on_worker(lambda e: paged_step(*_step_args(e, step_shapes(e)[0])))
        assert logits.shape[0] == 1
    finally:
        e.close()


def test_key_follows_model_and_numerics(cache):
    keys = {}
    for name, numerics in (("llama", "exact"), ("llama", "llamacpp"), ("qwen2", "exact")):
        m = llamay.load(tiny_model_file(name), n_ctx=CTX, numerics=numerics)
        for again in (0, 1):
            e = make_engine(m, parallel=1)
            try:
                args = e.on_worker(lambda e: programs.abstract(_step_args(e, step_shapes(e)[0])))
                keys[name, numerics, again] = paged_step.disk_key(*args)
            finally:
                e.close()
    assert keys["llama", "exact", 0] == keys["llama", "exact", 1]  # stable
    assert len({keys[k] for k in keys if k[2] == 0}) == 3
