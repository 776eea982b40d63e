"""Step planning for `BatchEngine`: which slots a step feeds, with which tokens,
positions and page tables, as host arrays of bucketed shapes (rows R, tokens T,
page-table width M), so steps of nearby sizes share one compiled program.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

from llamay.engine.api import Handle
from llamay.engine.paged_steps import PAD_POSITION
from llamay.kv import bucket
from llamay.kv.sequences import SeqKV
from llamay.sample import Sampler, SamplerState

MIN_VIEW = 256  # the smallest attention view (positions), as the dense cache's MIN_SLOTS


def table_widths(lo: int, hi: int) -> list[int]:
    """The page-table widths from `lo` up to the first at or past `hi`: powers of two
    times `lo` and the halfway steps between them (lo, 1.5 lo, 2 lo, 3 lo, 4 lo, ...).
    Every step gathers and attends over its width, so a table at most a third wider
    than its longest row (not twice: a power-of-two ladder), for two programs per
    doubling instead of one."""
    out, w = [], lo
    while True:
        for x in (w, w + w // 2):
            if not out or x > out[-1]:
                out.append(x)
            if x >= hi:
                return out
        w *= 2


def table_width(pages: int, lo: int) -> int:
    """The width a step's page tables get for rows of up to `pages` pages."""
    return table_widths(lo, pages)[-1]


def native_tables(cfg, kv) -> bool:
    """Whether steps over the pool `kv` (any tokens per row) read it through the native
    CPU kernel (`llamay.kernels_cpu.paged_attention`: exact
    numerics, causal, a pool of a KV type it reads, built). That kernel's work is bounded by the
    rows' positions, not by the table's width, so such steps get one width, the whole
    context's (`Planner._table_width`): one program per (rows, tokens) instead of one
    per width, the same cost."""
    from llamay import kernels_cpu
    from llamay.kernels.backend import backend
    from llamay.kernels_cpu.attention import pool_type

    pools = [a for a in (kv.k, kv.v, kv.local_k, kv.local_v) if a is not None]
    return (
        backend().native
        and getattr(cfg, "numerics", "exact") == "exact"
        and getattr(cfg, "causal", True)
        and all(isinstance(a, jax.Array) and pool_type(a, cfg.head_dim) for a in pools)
        and kernels_cpu.available()
    )


@dataclass(eq=False)
class Active:
    """A request in the engine: waiting, in a slot, or kept after it finished."""

    handle: Handle
    sampler: Sampler  # n_probs 0: the batch sets the width (`BatchEngine._width`)
    stop_ids: frozenset[int]
    budget: int  # tokens it may still generate
    logprobs: int | None = None  # None: none; 0: the token's own; N: with its top N
    seq: SeqKV | None = None
    fresh: bool = True  # sampler state not yet seeded in its slot
    prompt_cached: bool = False
    lora: tuple[float, ...] = ()  # its scale per loaded adapter (`llamay.engine.adapters`)
    extra: dict = field(default_factory=dict)


@dataclass(eq=False)
class Plan:
    """One step's inputs (host arrays, R packed rows) and the slots they were built for."""

    idx: list[int]  # the engine slot of each real row
    rows: list  # the slot occupants when planned
    feed: list[int]  # tokens each real row feeds
    tokens: np.ndarray  # [R, T]
    positions: np.ndarray  # [R, T]
    table: np.ndarray  # [R, M]
    last: np.ndarray  # [R]
    sampling: np.ndarray  # [R] bool
    slots: np.ndarray  # [R] engine slot per row (padding: out of range)
    # sliding windows: the local pool's page tables [R, W] and the position each one's
    # slot 0 holds [R] (`BatchEngine._local_width`)
    local: tuple[np.ndarray, np.ndarray] | None = None
    state: SamplerState | None = None  # the sampler state the step returned
    mask: Any = None  # packed allowed-token masks [R, W] on device (constraints) or None
    lora: np.ndarray | None = None  # [R, N] each row's adapter scales (None: no adapters)
    # image embeddings fed in place of tokens: (values [R, T, E], mask [R, T]) or None
    embeds: tuple[np.ndarray, np.ndarray] | None = None
    causal: bool = True  # False: a step over bidirectional images' positions (`_in_image`)
    steps: int = 1  # decode steps in one dispatch (`paged_decode`): each row feeds 1 per step
    carry: Any = None  # with steps > 1: its last sampled tokens [R, 1] on device


class RequestFailed(Exception):
    """Host work for some requests failed (their sampler parameters, a constraint's
    mask): they fail with their own errors, the batch goes on (`StepWorker._run`)."""

    def __init__(self, requests: dict[Active, BaseException]):
        super().__init__(f"{len(requests)} request(s) failed")
        self.requests = requests


class Planner:
    """`BatchEngine`'s planning methods (a mixin over its slots, pools and lock)."""

    def _plan(self, idx: list[int], after: Plan | None = None, steps: int = 1) -> Plan:
        """Inputs of a step over slots `idx`. With `after` (a step over the same slots
        in flight, whose sampled tokens feed this one on device): one token per slot,
        past what `after` fed, in each of `steps` decode steps (pages for all of them)."""
        ps = self.page_size
        rows = [self.slots[i] for i in idx]
        R = bucket(len(rows), 1)
        done = [0] * len(rows) if after is None else [f * after.steps for f in after.feed]
        if after is not None:
            feed = [1] * len(rows)
        else:
            feed = [self._feed(a) for a in rows]
        T = 1 if max(feed) <= 1 else bucket(max(feed), 16)
        with self._lock:
            for j, a in enumerate(rows):
                self.mgr.ensure(a.seq, a.seq.n_cached + done[j] + feed[j] * steps)
        M = self._table_width(T, max(len(a.seq.pages) for a in rows))
        p = self._blank_plan(R, T, M)
        p.idx, p.rows, p.feed, p.steps = list(idx), rows, feed, steps
        p.slots[: len(idx)] = idx
        for j, a in enumerate(rows):
            s, n, start = a.seq, feed[j], a.seq.n_cached + done[j]
            if after is None:
                p.tokens[j, :n] = s.pending[:n]
                if a.handle.request.images:
                    self._place_images(p, j, a, start, n)
            p.positions[j, :n] = np.arange(start, start + n)
            p.table[j, : len(s.pages)] = s.pages
            if p.local is not None:  # from the first page the step's queries can see
                first = self.mgr.needed_from(start)
                pages = s.local[first : first + p.local[0].shape[1]]
                p.local[0][j, : len(pages)] = pages
                p.local[1][j] = first * ps
            p.last[j] = n - 1
            if p.lora is not None:
                p.lora[j] = a.lora
            p.sampling[j] = after is not None or n == len(s.pending)
        p.mask = self._masks(p)
        if after is None and any(a.handle.request.images for a in rows):
            p.causal = not self._in_image(rows[0])
            if any(self._in_image(a) == p.causal for a in rows):
                raise ValueError("a step mixes bidirectional image rows with others")
        return p

    def _feed(self, a: Active) -> int:
        """Positions a row feeds next: its pending tokens up to the chunk, ending before a
        bidirectional image; at one, the rest of that image, in a step of its own (every
        position of the image sees all of it, as mtmd decodes it: one batch)."""
        s = a.seq
        n, p = min(len(s.pending), self.chunk), s.n_cached
        for im in a.handle.request.images:
            if not im.bidirectional or im.end <= p:
                continue
            if im.start <= p:
                return im.end - p
            return min(n, im.start - p)
        return n

    @staticmethod
    def _in_image(a: Active) -> bool:
        """Whether a row's next position is inside a bidirectional image."""
        p = a.seq.n_cached
        return any(im.bidirectional and im.start <= p < im.end for im in a.handle.request.images)

    def _place_images(self, p: Plan, j: int, a: Active, start: int, n: int) -> None:
        """Row j's image embeddings over the positions [start, start + n) it feeds (their
        placeholder ids fed as token 0: never looked up)."""
        for im in a.handle.request.images:
            lo, hi = max(start, im.start), min(start + n, im.end)
            if lo >= hi:
                continue
            if p.embeds is None:
                R, T = p.tokens.shape
                width = im.embeddings.shape[-1]
                p.embeds = (np.zeros((R, T, width), np.float32), np.zeros((R, T), bool))
            p.embeds[0][j, lo - start : hi - start] = im.embeddings[lo - im.start : hi - im.start]
            p.embeds[1][j, lo - start : hi - start] = True
            p.tokens[j, lo - start : hi - start] = 0

    def _table_width(self, T: int, pages: int) -> int:
        """The page-table width of a step of T tokens per row whose longest row holds
        `pages` pages: on the ladder (`table_widths`), or, where the native kernel reads
        the pool (`native_tables`), the whole context's width for every such step."""
        lo = max(1, MIN_VIEW // self.page_size)
        if self._native_tables():
            pages = max(pages, -(-self.n_ctx // self.page_size))
        return table_width(pages, lo)

    def _native_tables(self) -> bool:
        got = getattr(self, "_native", None)
        if got is None:
            got = self._native = native_tables(self.cfg, self.kv)
        return got

    def _blank_plan(self, R: int, T: int, M: int) -> Plan:
        """The inputs of a step over R rows of T tokens with M-page tables, every row
        padding: what `_plan` fills in, and the shapes `llamay.engine.warmup` compiles."""
        local = None
        if self.mgr.local is not None:
            local = (np.zeros((R, self._local_width(T, M)), np.int32), np.zeros(R, np.int32))
        n_lora = getattr(self, "n_adapters", 0)
        return Plan(
            [],
            [],
            [],
            lora=np.zeros((R, n_lora), np.float32) if n_lora else None,
            tokens=np.zeros((R, T), np.int32),
            positions=np.full((R, T), PAD_POSITION, np.int32),
            table=np.zeros((R, M), np.int32),
            last=np.zeros(R, np.int32),
            sampling=np.zeros(R, bool),
            slots=np.full(R, self.n_slots, np.int32),  # padding rows: out of range
            local=local,
        )

    def _local_width(self, T: int, M: int) -> int:
        """The local page tables' width for steps of T tokens and M-page tables: the
        pages from the window of a row's first fed position to its last, bucketed; a
        function of the window, not of the sequence's length."""
        ps, span = self.page_size, self.mgr.window - 1 + T
        return min(M, bucket((span + ps - 2) // ps + 1, max(1, MIN_VIEW // ps)))

    @staticmethod
    def _constraints(plan: Plan) -> dict:
        """{row: constraint} of the plan's sampling rows that have one."""
        return {
            j: a.handle.request.constraint
            for j, a in enumerate(plan.rows)
            if plan.sampling[j] and a.handle.request.constraint is not None
        }

    def _masks(self, plan: Plan):
        """Packed allowed-token masks [R, W] when a sampling row has a constraint (the
        others allow everything), else None. Computed while planning, before any step
        is dispatched, so a constraint that fails fails its request alone."""
        cons = self._constraints(plan)
        if not cons:
            return None
        got, failed = {}, {}
        for j, c in cons.items():
            try:
                got[j] = np.asarray(c.mask(), np.uint32)
            except Exception as exc:  # that request's constraint: it fails alone
                failed[plan.rows[j]] = exc
        if failed:
            raise RequestFailed(failed)
        W = max(r.shape[-1] for r in got.values())
        mask = np.full((len(plan.slots), W), 0xFFFFFFFF, np.uint32)
        for j, r in got.items():
            mask[j] = 0
            mask[j, : r.shape[-1]] = r
        return jax.device_put(mask)
