"""Continuous batching over a paged KV pool: `BatchEngine`, a drop-in `Engine`.

    engine = BatchEngine(model, slots=8, page_size=16)
    h = engine.submit(Request(ids, max_tokens=64, sampler=GREEDY, keep=True))
    for ev in h: ...
    kids = engine.fork(h, [Request([], 16), Request(more_ids, 16)])   # share h's pages
    snap = engine.snapshot(h); path = snap.save(directory)             # KV to disk
    h2 = engine.restore(Snapshot.load(path), Request([], 16))          # any process
    engine.release(h)                                                  # drop kept KV

One worker thread owns the device state. Each step, every occupied slot feeds its
pending tokens through the model (a prefill chunk of up to `chunk` tokens, or the one
token it sampled last), so prompts are prefilled alongside other slots' decoding;
slots that reach the end of their pending tokens sample. Requests wait in FIFO order
until a slot is free and the pool can reserve their worst-case pages (prompt +
max_tokens, less a cached prefix); one that could never fit fails at once with
KVCacheFullError. Cancelling frees the request's pages before the next step. A
request's full pages go to the prefix tree when its prompt is computed and when it
ends, so a later request with the same prefix skips that compute (`usage.cached_tokens`).

One stream runs somewhat slower than the dense path (`Model.generation`; ~12 % in an
earlier quiet measurement). Not host work: planning, committing and dispatching a
step take ~3 % of a decode step's wall time (SmolLM2 on CPU), and the pool is updated
in place (a step over a 2,049-page, 1.5 GB pool timed within noise of one over 17
pages, where a copy would add a tenth of a second). It is
device work the dense step does not do: each layer gathers the rows' pages into a
contiguous view before attending (the Pallas paged-attention kernel reads them in
place), and the per-slot sampler state is gathered and scattered by slot.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from llamay.arch.decoder import local_layers
from llamay.engine.api import Handle, Request
from llamay.engine.generate import check_prompt
from llamay.engine.paged_steps import PAD_POSITION, paged_step, set_rows
from llamay.errors import KVCacheFullError, LlamayError, RequestError, SnapshotError
from llamay.kv import bucket
from llamay.kv.pages import copy_pages, grow_paged_kv, new_paged_kv, read_pages, write_pages
from llamay.kv.sequences import KVManager, SeqKV, local_bound
from llamay.kv.snapshot import Snapshot
from llamay.sample import Sampler, SamplerState, SamplingParams, read_logprobs

MIN_VIEW = 256  # the smallest attention view (positions), as the dense cache's MIN_SLOTS
# Top-N log-probabilities computed per step while any row asks for some: one fixed width
# (OpenAI's top_logprobs maximum), so requests asking different N share a batch and its
# compiled step; a request asking more than that widens the batch to the Sampler's limit.
LOGPROB_WIDTH, LOGPROB_WIDTH_MAX = 20, 64
GATHER_MAX_S = 0.25  # the longest an idle engine waits to gather a burst (`gather_s`)


@dataclass(eq=False)
class _Active:
    handle: Handle
    sampler: Sampler  # n_probs 0: the batch sets the width (`BatchEngine._width`)
    stop_ids: frozenset[int]
    budget: int  # tokens it may still generate
    logprobs: int | None = None  # None: none; 0: the token's own; N: with its top N
    seq: SeqKV | None = None
    fresh: bool = True  # sampler state not yet seeded in its slot
    prompt_cached: bool = False
    extra: dict = field(default_factory=dict)


@dataclass(eq=False)
class _Plan:
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


def model_digest(path: Path) -> str:
    """An id of the model file: its store digest when named like one, else a hash of
    its size and first MiB."""
    name = Path(path).name
    if name.startswith("sha256-") and len(name) == 71:
        return name.replace("-", ":", 1)
    h = hashlib.sha256(str(Path(path).stat().st_size).encode())
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
    return "sha256:" + h.hexdigest()


class BatchEngine:
    """The continuous-batching scheduler (see the module docstring)."""

    def __init__(
        self,
        model,
        slots: int = 8,
        page_size: int = 16,
        n_pages: int | None = None,
        chunk: int = 128,
        prefix_cache: bool = True,
        max_pages: int | None = None,
        local_pages: int | None = None,
        gather_s: float = 0.0,
    ):
        """`n_pages` pages in the pool (default: `slots` sequences of up to 1024
        tokens); with `max_pages` above it the pool grows on demand up to that, so a
        small pool can still take a long request (each new size compiles the step
        once more). A model with sliding-window layers keeps theirs in a local pool of
        `local_pages` (default: two windows per slot, at most `n_pages`), which grows
        up to `max_pages` (or `n_pages`) as well. `gather_s` > 0: an idle engine woken
        by a request waits for more while they keep arriving within `gather_s` of each
        other (at most `GATHER_MAX_S`), so a burst reaching it one by one (a server's
        clients) starts as one batch: one prefill step and one row count, not a step
        per straggler, each a program of its own to compile (5-7 s each on a CPU)."""
        self.model = model
        cfg = model.config
        self.cfg, self.weights = cfg, model.weights
        self.n_ctx = model.n_ctx
        self.n_slots, self.page_size, self.chunk = slots, page_size, chunk
        self.gather_s = gather_s
        if n_pages is None:
            n_pages = slots * -(-min(self.n_ctx, 1024) // page_size) + 1
        self.kv_dtype = model.runtime.kv_dtype
        self.local_layers = local_layers(cfg)
        n_local = int(self.local_layers.sum())
        window = cfg.window if n_local else 0
        if n_local and local_pages is None:
            bound = local_bound(window, page_size, max(2, chunk), self.n_ctx)
            local_pages = min(n_pages, 2 * slots * bound + 1)
        local_pages = local_pages if n_local else 0
        max_local = max(max_pages or n_pages, local_pages)
        self.mgr = KVManager(
            n_pages, page_size, prefix_cache, max_pages, window, local_pages, max_local, chunk
        )
        self.kv = new_paged_kv(
            cfg.n_layers,
            n_pages,
            page_size,
            cfg.n_kv_heads,
            cfg.head_dim,
            self.kv_dtype,
            n_local,
            local_pages,
        )
        self.slots: list[_Active | None] = [None] * slots
        self.waiting: deque[_Active] = deque()
        self.kept: dict[str, _Active] = {}
        self.counters = {"computed_tokens": 0, "cache_hit_tokens": 0, "steps": 0, "served": 0}
        self._vocab = getattr(cfg, "vocab", None)
        self._params: SamplingParams | None = None
        self._state: SamplerState | None = None
        self._sampler_plan = None
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self._digest: str | None = None
        self._worker = threading.Thread(target=self._run, name="llamay-batch", daemon=True)
        self._worker.start()

    # -- the Engine interface ----------------------------------------------------------

    def submit(self, request: Request) -> Handle:
        if self._closed:
            raise LlamayError("the engine is closed")
        handle = Handle(request)
        self._inbox.put(("submit", handle))
        return handle

    def cancel(self, handle: Handle) -> None:
        handle._cancelled.set()
        self._inbox.put(("wake", None))

    def stats(self) -> dict[str, Any]:
        with self._lock:
            kv = self.mgr.stats()
            held = len({p for s in self.mgr.live.values() for p in s.pages})
            return {
                "queued": len(self.waiting) + self._inbox.qsize(),
                "active": sum(a is not None for a in self.slots),
                "kept": len(self.kept),
                "slots": self.n_slots,
                **kv,
                "pages_held": held,
                **self.counters,
            }

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._inbox.put(("close", None))
            self._worker.join(timeout=60)

    # -- beyond the interface: fork, snapshot, restore, release -------------------------

    def fork(self, handle: Handle, requests: list[Request]) -> list[Handle]:
        """Branch `handle`'s sequence (running, or finished with `keep=True`) into one
        child per request: child i continues from the parent's tokens followed by
        requests[i].prompt_ids, sharing the parent's full pages."""
        return self._call("fork", handle, requests)

    def snapshot(self, handle: Handle) -> Snapshot:
        """The KV of a kept (or running) sequence, on the host."""
        return self._call("snapshot", handle)

    def restore(self, snap: Snapshot, request: Request) -> Handle:
        """Continue a snapshot's sequence with request.prompt_ids appended."""
        return self._call("restore", snap, request)

    def release(self, handle: Handle) -> None:
        """Drop the KV a `keep=True` request kept after it finished."""
        self._call("release", handle)

    def _call(self, op: str, *args):
        if self._closed:
            raise LlamayError("the engine is closed")
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._inbox.put((op, (fut, args)))
        return fut.result()

    # -- the worker ----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            idle = not self.waiting and all(a is None for a in self.slots)
            try:
                cmds = [self._inbox.get()] if idle else []
                while True:
                    cmds.append(self._inbox.get_nowait())
            except queue.Empty:
                pass
            if idle and self.gather_s > 0 and cmds[0][0] == "submit":
                self._gather(cmds)
            for op, arg in cmds:
                if op == "close":
                    self._shutdown()
                    return
                try:
                    self._command(op, arg)
                except Exception as exc:  # a broken command never kills the worker
                    if op == "submit":
                        arg._finish("error", exc)
                    elif op not in ("wake",):
                        arg[0].set_exception(exc)
            try:
                self._reap_cancelled()
                self._admit()
                if any(a is not None for a in self.slots):
                    self._refresh_params()
                    self._step()
            except Exception as exc:  # fail every request rather than hang them
                self._fail_all(exc)

    def _gather(self, cmds: list) -> None:
        """Append the commands that keep arriving within `gather_s` of each other, until
        there are requests for every free slot."""
        end = time.monotonic() + GATHER_MAX_S
        free = self.slots.count(None) - len(self.waiting)
        while sum(op == "submit" for op, _ in cmds) < free:
            if (left := end - time.monotonic()) <= 0:
                return
            try:
                cmds.append(self._inbox.get(timeout=min(self.gather_s, left)))
            except queue.Empty:
                return

    def _command(self, op: str, arg) -> None:
        if op == "submit":
            self._enqueue(arg)
        elif op == "wake":
            pass
        else:
            fut, args = arg
            fut.set_result(getattr(self, "_" + op)(*args))

    def _enqueue(self, handle: Handle, seq: SeqKV | None = None) -> _Active:
        r = handle.request
        n = len(r.prompt_ids) if seq is None else len(seq.tokens)
        check_prompt(n, self.n_ctx)
        budget = max(0, min(r.max_tokens, self.n_ctx - n))
        stop = frozenset(self.model.tokenizer.stop_ids if r.stop_ids is None else r.stop_ids)
        logprobs = r.logprobs if r.logprobs is not None else (r.sampler.n_probs or None)
        if logprobs is not None and not 0 <= logprobs <= LOGPROB_WIDTH_MAX:
            raise RequestError(f"logprobs must be in [0, {LOGPROB_WIDTH_MAX}], not {logprobs}")
        sampler = dataclasses.replace(r.sampler, n_probs=0)
        a = _Active(handle, sampler, stop, budget, seq=seq, logprobs=logprobs)
        if seq is None and not self.mgr.fits_ever(n + budget + 1):
            raise self.mgr.never_fits(
                f"a request of {n} prompt + {budget} new tokens", n + budget + 1
            )
        self.waiting.append(a)
        return a

    def _reap_cancelled(self) -> None:
        for i, a in enumerate(self.slots):
            if a is not None and a.handle.cancelled:
                self.slots[i] = None
                self._end(a, "cancelled")
        for a in [a for a in self.waiting if a.handle.cancelled]:
            self.waiting.remove(a)
            self._end(a, "cancelled")

    def _end(self, a: _Active, reason: str, error: BaseException | None = None) -> None:
        with self._lock:
            if a.seq is not None:
                if a.handle.request.keep and reason in ("stop", "length"):
                    self.kept[a.handle.id] = a
                else:
                    self.mgr.release(a.seq)
                    a.seq = None
            self.counters["served"] += 1
        a.handle._finish(reason, error)

    def _fail_all(self, exc: BaseException) -> None:
        for i, a in enumerate(self.slots):
            if a is not None:
                self.slots[i] = None
                self._end(a, "error", exc)

    def _shutdown(self) -> None:
        for a in list(self.waiting):
            self._end(a, "cancelled")
        self.waiting.clear()
        for i, a in enumerate(self.slots):
            if a is not None:
                self.slots[i] = None
                self._end(a, "cancelled")

    def _admit(self) -> None:
        while self.waiting and None in self.slots:
            a = self.waiting[0]
            plan = a.sampler.plan
            if self._sampler_plan is not None and plan != self._sampler_plan and any(self.slots):
                return  # the batch shares one sampler plan: wait for it to drain
            if a.budget <= 0 and a.seq is None and not a.handle.request.keep:
                self.waiting.popleft()
                self._end(a, "length")
                continue
            if a.seq is None:
                with self._lock:
                    seq = self.mgr.open(list(a.handle.request.prompt_ids), a.budget + 1)
                if seq is None:
                    return  # the pool is full for now; FIFO: later requests wait too
                a.seq = seq
                a.handle.usage.cached_tokens = seq.cached_hit
                self.counters["cache_hit_tokens"] += seq.cached_hit
            self.waiting.popleft()
            slot = self.slots.index(None)
            self.slots[slot] = a
            self._sampler_plan = plan
            a.fresh = True

    def _width(self) -> int:
        """The top-N width the batch computes: 0 unless some slot asks for top logprobs."""
        most = max((a.logprobs or 0 for a in self.slots if a is not None), default=0)
        if most == 0:
            return 0
        return LOGPROB_WIDTH if most <= LOGPROB_WIDTH else LOGPROB_WIDTH_MAX

    def _refresh_params(self) -> None:
        active = [a for a in self.slots if a is not None]
        if not active:
            return
        width = self._width()
        fill = active[0].sampler
        samplers = [
            dataclasses.replace(a.sampler if a is not None else fill, n_probs=width)
            for a in self.slots
        ]
        key = tuple(samplers)  # by value: equal samplers, equal params
        if self._params is None or key != getattr(self, "_params_key", None):
            dry = any(s.uses_dry for s in samplers)
            pieces = self.model.token_pieces() if dry else None
            encode = getattr(self.model, "_encode_plain", None) if dry else None
            vocab = self._vocab or (len(pieces) if pieces else None)
            self._params = SamplingParams.stack(samplers, vocab, pieces, encode)
            self._params_key = key
            if self._state is None:
                self._state = SamplerState.init(samplers, history=self.n_ctx)
            elif self._state.top_ids.shape[1] != width:  # only the per-step outputs change
                self._state = dataclasses.replace(
                    self._state,
                    top_logprobs=jnp.zeros((self.n_slots, width), jnp.float32),
                    top_ids=jnp.zeros((self.n_slots, width), jnp.int32),
                )
        fresh = [i for i, a in enumerate(self.slots) if a is not None and a.fresh]
        if fresh:
            # rows bucketed, the padding repeating the last (`set_rows` drops it): one
            # program per power of two, not one per count of requests starting at once
            pad = [fresh[-1]] * (bucket(len(fresh), 1) - len(fresh))
            rows = SamplerState.init(
                [samplers[i] for i in fresh + pad],
                [self.slots[i].seq.tokens for i in fresh + pad],
                history=self.n_ctx,  # the whole context: llama.cpp's repeat_last_n=-1
            )
            self._state = set_rows(self._state, fresh, rows)
            for i in fresh:
                self.slots[i].fresh = False

    def _step(self) -> None:
        """One iteration: a decode step for the slots decoding and a prefill step for
        those with a prompt chunk to feed, each over just its rows (packed, the row
        count bucketed). While every slot decodes (and nothing waits), the next step is
        dispatched, fed from this one's tokens on device, before this one is read
        back, so the device works while the host does the bookkeeping."""
        busy = [i for i, a in enumerate(self.slots) if a is not None]
        decode = [i for i in busy if len(self.slots[i].seq.pending) == 1]
        prefill = [i for i in busy if len(self.slots[i].seq.pending) > 1]
        plans = [self._plan(g) for g in (decode, prefill) if g]
        outs = [self._dispatch(p) for p in plans]
        if len(plans) == 2 or not decode:
            for p, nxt in zip(plans, outs, strict=True):
                self._complete(p, np.asarray(nxt))
            return
        plan, nxt = plans[0], outs[0]
        while True:
            ahead = None
            if self._steady(plan):
                nxt_plan = self._plan(plan.idx, after=plan)
                ahead = (nxt_plan, self._dispatch(nxt_plan, nxt[:, None]))
            self._complete(plan, np.asarray(nxt))
            if ahead is None:
                return
            plan, nxt = ahead
            if self._inbox.qsize() or self.waiting:  # let the loop admit and take commands
                self._complete(plan, np.asarray(nxt))
                return

    def _steady(self, plan: _Plan) -> bool:
        return (
            plan.tokens.shape[1] == 1
            and not self._inbox.qsize()
            and not self.waiting
            and all(
                self.slots[i] is a
                and a.handle.request.constraint is None
                and a.budget >= 2
                and not a.handle.cancelled
                for i, a in zip(plan.idx, plan.rows, strict=False)
            )
        )

    def _plan(self, idx: list[int], after: _Plan | None = None) -> _Plan:
        """Inputs of a step over slots `idx`. With `after` (a step over the same slots
        in flight, whose sampled tokens feed this one on device): one token per slot,
        past what `after` fed."""
        ps = self.page_size
        rows = [self.slots[i] for i in idx]
        R = bucket(len(rows), 1)
        done = [0] * len(rows) if after is None else after.feed
        if after is not None:
            feed = [1] * len(rows)
        else:
            feed = [min(len(a.seq.pending), self.chunk) for a in rows]
        T = 1 if max(feed) <= 1 else bucket(max(feed), 16)
        with self._lock:
            for j, a in enumerate(rows):
                self.mgr.ensure(a.seq, a.seq.n_cached + done[j] + feed[j])
        M = bucket(max(len(a.seq.pages) for a in rows), max(1, MIN_VIEW // ps))
        p = self._blank_plan(R, T, M)
        p.idx, p.rows, p.feed = list(idx), rows, feed
        p.slots[: len(idx)] = idx
        for j, a in enumerate(rows):
            s, n, start = a.seq, feed[j], a.seq.n_cached + done[j]
            if after is None:
                p.tokens[j, :n] = s.pending[:n]
            p.positions[j, :n] = np.arange(start, start + n)
            p.table[j, : len(s.pages)] = s.pages
            if p.local is not None:  # from the first page the step's queries can see
                first = self.mgr.needed_from(start)
                pages = s.local[first : first + p.local[0].shape[1]]
                p.local[0][j, : len(pages)] = pages
                p.local[1][j] = first * ps
            p.last[j] = n - 1
            p.sampling[j] = after is not None or n == len(s.pending)
        return p

    def _blank_plan(self, R: int, T: int, M: int) -> _Plan:
        """The inputs of a step over R rows of T tokens with M-page tables, every row
        padding: what `_plan` fills in, and the shapes `llamay.engine.warmup` compiles."""
        local = None
        if self.mgr.local is not None:
            local = (np.zeros((R, self._local_width(T, M)), np.int32), np.zeros(R, np.int32))
        return _Plan(
            [],
            [],
            [],
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

    def _sync_pool(self) -> None:
        """Pad the device pools to the allocators' sizes after an allocator grew."""
        n_local = self.mgr.local.n_pages if self.mgr.local is not None else 0
        if self.mgr.alloc.n_pages != self.kv.n_pages or n_local != self.kv.n_local_pages:
            self.kv = grow_paged_kv(self.kv, self.mgr.alloc.n_pages, n_local)

    def _dispatch(self, plan: _Plan, tokens: jax.Array | None = None) -> jax.Array:
        self._sync_pool()
        args = self._step_inputs(plan, tokens, self._params, self._state)
        nxt, self._state, self.kv = paged_step(*args)
        plan.state = self._state
        self.counters["steps"] += 1
        return nxt

    def _step_inputs(self, plan: _Plan, tokens, params, state) -> tuple:
        """`paged_step`'s arguments for `plan` (`tokens`: fed from the device instead of
        the plan's); `llamay.engine.warmup` lowers the step with them."""
        # device_put: jnp.asarray(ndarray) compiles an identity program per shape (jax 0.12)
        fed, *rows, local = jax.device_put(
            (
                plan.tokens,
                plan.positions,
                plan.table,
                plan.last,
                plan.sampling,
                plan.slots,
                plan.local,
            )
        )
        fed = fed if tokens is None else tokens
        return (
            self.cfg,
            self.weights,
            self.kv,
            fed,
            *rows,
            params,
            state,
            self._masks(plan),
            *(local or (None, None)),
        )

    def _logprobs(self, plan: _Plan) -> dict[int, tuple]:
        """{row: (logprob, [(id, logprob)...])} of the plan's sampling rows that asked for
        log-probabilities, read off the step's sampler state in one copy."""
        want = [
            j
            for j, a in enumerate(plan.rows)
            if plan.sampling[j] and a.logprobs is not None and self.slots[plan.idx[j]] is a
        ]
        if not want:
            return {}
        got = read_logprobs(
            plan.state, [plan.idx[j] for j in want], [plan.rows[j].logprobs for j in want]
        )
        return dict(zip(want, got, strict=True))

    def _complete(self, plan: _Plan, nxt: np.ndarray) -> None:
        """Commit a finished step: positions fed, tokens sampled, requests ended."""
        logprobs = self._logprobs(plan)
        for j, (i, a) in enumerate(zip(plan.idx, plan.rows, strict=True)):
            if self.slots[i] is not a:
                continue  # ended while this step was in flight: its result is moot
            self.counters["computed_tokens"] += plan.feed[j]
            with self._lock:
                self.mgr.commit(a.seq, plan.feed[j])
            if not plan.sampling[j]:
                continue
            if not a.prompt_cached:
                a.prompt_cached = True
                with self._lock:
                    self.mgr.cache(a.seq)
            if a.budget <= 0:  # prefill-only (max_tokens=0, keep=True): the KV is the point
                self.slots[i] = None
                self._end(a, "length")
                continue
            tok = int(nxt[j])
            con = a.handle.request.constraint
            if tok in a.stop_ids and (con is None or con.accepting):
                self.slots[i] = None
                self._end(a, "stop")
                continue
            if con is not None:
                try:
                    con.advance(tok)
                except Exception as exc:
                    self.slots[i] = None
                    self._end(a, "error", exc)
                    continue
            a.seq.tokens.append(tok)
            a.budget -= 1
            a.handle._emit(tok, *logprobs.get(j, (None, ())))
            if con is not None and con.done:
                self.slots[i] = None
                self._end(a, "stop")
            elif a.budget <= 0 or len(a.seq.tokens) >= self.n_ctx:
                self.slots[i] = None
                self._end(a, "length")

    def _masks(self, plan: _Plan):
        """Packed allowed-token masks [R, W] when a sampling row has a constraint (the
        others allow everything), else None."""
        cons = {
            j: a.handle.request.constraint
            for j, a in enumerate(plan.rows)
            if plan.sampling[j] and a.handle.request.constraint is not None
        }
        if not cons:
            return None
        got = {j: np.asarray(c.mask(), np.uint32) for j, c in cons.items()}
        W = max(r.shape[-1] for r in got.values())
        mask = np.full((len(plan.slots), W), 0xFFFFFFFF, np.uint32)
        for j, r in got.items():
            mask[j] = 0
            mask[j, : r.shape[-1]] = r
        return jax.device_put(mask)

    # -- fork / snapshot / restore (on the worker, between steps) ------------------------

    def _find(self, handle: Handle) -> _Active:
        for a in self.slots:
            if a is not None and a.handle is handle:
                return a
        if handle.id in self.kept:
            return self.kept[handle.id]
        raise RequestError(
            f"request {handle.id} has no KV to use: it is not running and was not kept "
            "(submit it with keep=True)"
        )

    def _fork(self, handle: Handle, requests: list[Request]) -> list[Handle]:
        parent = self._find(handle).seq
        out: list[Handle] = []
        out_active: list[_Active] = []
        for r in requests:
            tokens = parent.tokens + list(r.prompt_ids)
            at = min(parent.n_cached, len(tokens) - 1)
            with self._lock:
                made = self.mgr.fork(parent, len(r.prompt_ids) + r.max_tokens + 1, at)
            if made is None:
                raise KVCacheFullError(
                    f"the KV pool cannot hold a fork of {handle.id} now "
                    f"({self.mgr.alloc.n_free} pages free); retry after requests finish"
                )
            child, copies, local_copies = made
            child.tokens = tokens
            for pairs, local in ((copies, False), (local_copies, True)):
                if pairs:
                    self._sync_pool()
                    src, dst = (jnp.asarray(x) for x in zip(*pairs, strict=True))
                    self.kv = copy_pages(self.kv, src, dst, local=local)
            h = Handle(r)
            try:
                made_active = self._enqueue(h, child)
            except BaseException:
                # no handle reaches the caller: free this child and undo the earlier ones
                self._drop(child)
                for a in out_active:
                    self.waiting.remove(a)
                    self._drop(a.seq)
                raise
            out_active.append(made_active)
            h.usage.prompt_tokens = len(tokens)
            h.usage.cached_tokens = at
            out.append(h)
        return out

    def _drop(self, seq: SeqKV) -> None:
        """Free a sequence no request was started on (nothing of it is worth caching)."""
        with self._lock:
            self.mgr.release(seq, cache=False)

    def _digest_of_model(self) -> str:
        if self._digest is None:
            self._digest = model_digest(self.model.path)
        return self._digest

    def _snapshot(self, handle: Handle) -> Snapshot:
        """The sequence's K/V [L, n_cached, K, D]; the local layers' positions before
        the window it keeps are zeros (released: a restore never reads them)."""
        seq = self._find(handle).seq
        n = seq.n_cached
        P = self.mgr.pages_for(n)
        k, v = read_pages(self.kv, seq.pages[:P])
        if self.mgr.local is not None:
            kept = [i for i in range(P) if seq.local[i]]
            lk, lv = read_pages(self.kv, [seq.local[i] for i in kept], local=True)
            k, v = (self._interleave(g, loc, kept, P) for g, loc in ((k, lk), (v, lv)))
        L, P, ps, K, D = k.shape
        k = k.reshape(L, P * ps, K, D)[:, :n]
        v = v.reshape(L, P * ps, K, D)[:, :n]
        return Snapshot(
            self._digest_of_model(), str(np.dtype(self.kv_dtype)), list(seq.tokens), k, v
        )

    def _interleave(self, glob: np.ndarray, loc: np.ndarray, kept: list[int], P: int):
        """Every layer's pages [L, P, ps, K, D] from the global layers' [Lg, P, ...] and
        the local layers' pages `kept` [Ll, len(kept), ...] (zeros elsewhere)."""
        out = np.zeros((len(self.local_layers), P, *glob.shape[2:]), glob.dtype)
        out[~self.local_layers] = glob
        local = np.zeros((loc.shape[0], P, *loc.shape[2:]), loc.dtype)
        local[:, kept] = loc
        out[self.local_layers] = local
        return out

    def _restore(self, snap: Snapshot, request: Request) -> Handle:
        cfg = self.cfg
        want = (cfg.n_layers, cfg.n_kv_heads, cfg.head_dim)
        got = (snap.k.shape[0], snap.k.shape[2], snap.k.shape[3])
        if snap.model != self._digest_of_model() or got != want:
            raise SnapshotError(
                f"the snapshot is of model {snap.model} (KV {got}); this engine runs "
                f"{self._digest_of_model()} (KV {want})"
            )
        if snap.kv_dtype != str(np.dtype(self.kv_dtype)):
            raise SnapshotError(
                f"the snapshot's KV is {snap.kv_dtype}; this engine's is "
                f"{np.dtype(self.kv_dtype)} (load the model with the same numerics)"
            )
        tokens = list(snap.tokens) + list(request.prompt_ids)
        n = min(snap.n_cached, len(tokens) - 1)
        with self._lock:
            seq = self.mgr.adopt(tokens, n, len(request.prompt_ids) + request.max_tokens + 1)
        if seq is None:
            raise KVCacheFullError("the KV pool cannot hold the snapshot now; retry later")
        if n:
            ps, P = self.page_size, self.mgr.pages_for(n)
            pad = ((0, 0), (0, P * ps - n), (0, 0), (0, 0))
            L, _, K, D = snap.k.shape
            k = np.pad(snap.k[:, :n], pad).reshape(L, P, ps, K, D)
            v = np.pad(snap.v[:, :n], pad).reshape(L, P, ps, K, D)
            self._sync_pool()
            glob = ~self.local_layers
            self.kv = write_pages(
                self.kv, jnp.asarray(seq.pages[:P]), jnp.asarray(k[glob]), jnp.asarray(v[glob])
            )
            if self.mgr.local is not None:  # the local layers: only the window's pages
                kept = [i for i in range(P) if seq.local[i]]
                loc = np.ix_(self.local_layers, kept)
                self.kv = write_pages(
                    self.kv,
                    jnp.asarray([seq.local[i] for i in kept]),
                    jnp.asarray(k[loc]),
                    jnp.asarray(v[loc]),
                    local=True,
                )
        h = Handle(request)
        try:
            self._enqueue(h, seq)
        except BaseException:
            self._drop(seq)
            raise
        h.usage.prompt_tokens = len(tokens)
        h.usage.cached_tokens = n
        return h

    def _release(self, handle: Handle) -> None:
        a = self.kept.pop(handle.id, None)
        if a is not None and a.seq is not None:
            with self._lock:
                self.mgr.release(a.seq)
            a.seq = None
