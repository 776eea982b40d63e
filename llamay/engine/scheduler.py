"""Continuous batching over a paged KV pool: `BatchEngine`, a drop-in `Engine`.

    engine = BatchEngine(model, slots=8, page_size=16)
    h = engine.submit(Request(ids, max_tokens=64, sampler=GREEDY, keep=True))
    for ev in h: ...
    kids = engine.fork(h, [Request([], 16), Request(more_ids, 16)])   # share h's pages
    snap = engine.snapshot(h); path = snap.save(directory)             # KV to disk
    h2 = engine.restore(Snapshot.load(path), Request([], 16))          # any process
    engine.release(h)                                                  # drop kept KV

One worker thread owns the device state (`llamay.engine.worker`). Each step, every
occupied slot feeds its pending tokens through the model (a prefill chunk of up to
`chunk` tokens, or the one token it sampled last; `llamay.engine.planning`), so
prompts are prefilled alongside other slots' decoding; slots that reach the end of
their pending tokens sample. Requests wait in FIFO order until a slot is free and the
pool can reserve their worst-case pages (prompt + max_tokens, less a cached prefix);
one that could never fit fails at once with KVCacheFullError. Cancelling frees the
request's pages before the next step. A request's full pages go to the prefix tree
when its prompt is computed and when it ends, so a later request with the same prefix
skips that compute (`usage.cached_tokens`). Fork, snapshot and restore live in
`llamay.engine.persist`.

This module: the engine's state, its public interface, admission and the per-slot
sampler parameters.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import dataclasses
import queue
import threading
import weakref
from collections import deque
from typing import Any

import jax
import numpy as np

from llamay.arch.decoder import local_layers
from llamay.engine import adapters, programs
from llamay.engine.api import Handle, Request
from llamay.engine.generate import check_prompt, default_decode_steps, prefill_chunk, token_ids
from llamay.engine.paged_steps import set_rows
from llamay.engine.persist import Persistence, model_digest
from llamay.engine.planning import MIN_VIEW, Active, Plan, Planner, RequestFailed
from llamay.engine.speculative import Speculating, Speculation
from llamay.engine.worker import GATHER_MAX_S, StepWorker
from llamay.errors import LlamayError, RequestError
from llamay.kv import bucket
from llamay.kv.pages import new_paged_kv
from llamay.kv.sequences import KVManager, SeqKV, local_bound
from llamay.kv.snapshot import Snapshot
from llamay.sample import Sampler, SamplerState, SamplingParams

#: Engines not yet closed. At exit they are closed before jax tears its backends down: a
#: worker thread still holding device buffers then crashed the interpreter (a segfault
#: after a script's last line, when it never called `Model.close()`). atexit runs
#: handlers last-registered first, and jax registers its own when imported, before this.
_LIVE: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _close_live_engines() -> None:
    for engine in list(_LIVE):
        engine.close()


__all__ = [
    "GATHER_MAX_S",
    "MIN_VIEW",
    "BatchEngine",
    "Plan",
    "default_decode_steps",
    "model_digest",
]

# Top-N log-probabilities computed per step while any row asks for some: one fixed width
# (OpenAI's top_logprobs maximum), so requests asking different N share a batch and its
# compiled step; a request asking more than that widens the batch to the Sampler's limit.
LOGPROB_WIDTH, LOGPROB_WIDTH_MAX = 20, 64

#: Prompt tokens a step prefills in exact numerics unless the caller says (`chunk`):
#: small enough that decoding rows beside a long prompt keep their pace.
EXACT_CHUNK = 128


class BatchEngine(StepWorker, Planner, Persistence, Speculating):
    """The continuous-batching scheduler (see the module docstring)."""

    def __init__(
        self,
        model,
        slots: int = 8,
        page_size: int = 16,
        n_pages: int | None = None,
        chunk: int | None = None,
        prefix_cache: bool = True,
        max_pages: int | None = None,
        local_pages: int | None = None,
        gather_s: float = 0.0,
        speculative: Speculation | None = None,
        decode_steps: int = 1,
    ):
        """`chunk`: the most prompt tokens a row prefills in one step (default
        `prefill_chunk`'s: llama.cpp's ubatch in llamacpp numerics, else EXACT_CHUNK).
        `n_pages` pages in the pool (default: `slots` sequences of up to 1024
        tokens); with `max_pages` above it the pool grows on demand up to that, so a
        small pool can still take a long request (each new size compiles the step
        once more). A model with sliding-window layers keeps theirs in a local pool of
        `local_pages` (default: two windows per slot, at most `n_pages`), which grows
        up to `max_pages` (or `n_pages`) as well. `gather_s` > 0: an idle engine woken
        by a request waits for more while they keep arriving within `gather_s` of each
        other (at most `GATHER_MAX_S`), so a burst reaching it one by one (a server's
        clients) starts as one batch: one prefill step and one row count, not a step
        per straggler, each a program of its own to compile (5-7 s each on a CPU).
        `speculative`: draft and verify several tokens per decode step
        (`llamay.engine.speculative`). `decode_steps` > 1: while every slot decodes and
        nothing arrives, that many decode steps per dispatch (`paged_decode`;
        `StepWorker._decode_steps` says when)."""
        self.model = model
        cfg = model.config
        self.cfg, self.weights = cfg, model.weights
        if len(_devices(self.weights)) > 1:
            programs.disable("a model sharded over several devices")
        # LoRA adapters loaded with the model: each request picks its scales
        # (`Request.lora`, `llamay.engine.adapters`); these apply when it names none
        self.n_adapters = adapters.adapter_count(self.weights)
        self.lora_scales = adapters.load_scales(self.weights)
        self.n_ctx = model.n_ctx
        chunk = prefill_chunk(model, EXACT_CHUNK) if chunk is None else chunk
        self.n_slots, self.page_size, self.chunk = slots, page_size, chunk
        self.gather_s = gather_s
        self.decode_steps = max(1, int(decode_steps))
        if n_pages is None:
            n_pages = slots * -(-min(self.n_ctx, 1024) // page_size) + 1
        self.kv_dtype = model.runtime.kv_dtype
        self.local_layers = local_layers(cfg)
        n_local = int(self.local_layers.sum())
        window = cfg.window if n_local else 0
        # the most positions one step feeds a row: a chunk, or a whole image chunk
        # (bidirectional images go in one step: `Planner._feed`)
        proj = getattr(model, "projector", None)
        feed = max(chunk, proj.cfg.tokens_per_image if proj is not None else 0)
        if n_local and local_pages is None:
            bound = local_bound(window, page_size, max(2, feed), self.n_ctx)
            local_pages = min(n_pages, 2 * slots * bound + 1)
        local_pages = local_pages if n_local else 0
        max_local = max(max_pages or n_pages, local_pages)
        self.mgr = KVManager(
            n_pages, page_size, prefix_cache, max_pages, window, local_pages, max_local, feed
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
        self.slots: list[Active | None] = [None] * slots
        self.waiting: deque[Active] = deque()
        self.kept: dict[str, Active] = {}
        self.counters = {"computed_tokens": 0, "cache_hit_tokens": 0, "steps": 0, "served": 0}
        self._spec_init(speculative)
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
        _LIVE.add(self)

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

    def set_lora_scales(self, scales) -> None:
        """The scales of the loaded adapters for requests that name none (llama-server's
        POST /lora-adapters): {adapter id: scale} (the others 0) or one per adapter.
        Requests already admitted keep theirs."""
        new = adapters.request_scales(scales, self.n_adapters, self.lora_scales)
        self.lora_scales = np.asarray(new, np.float32)

    def on_worker(self, fn):
        """`fn(engine)` run on the worker thread between steps (it may use the device
        state); its result, or its exception, comes back here."""
        return self._call("on_worker", fn)

    def _on_worker(self, fn):
        return fn(self)

    def _call(self, op: str, *args):
        if self._closed:
            raise LlamayError("the engine is closed")
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._inbox.put((op, (fut, args)))
        return fut.result()

    def _enqueue(self, handle: Handle, seq: SeqKV | None = None) -> Active:
        r = handle.request
        n = len(r.prompt_ids) if seq is None else len(seq.tokens)
        check_prompt(n, self.n_ctx)
        budget = max(0, min(r.max_tokens, self.n_ctx - n))
        stop = frozenset(self.model.tokenizer.stop_ids if r.stop_ids is None else r.stop_ids)
        logprobs = r.logprobs if r.logprobs is not None else (r.sampler.n_probs or None)
        if logprobs is not None and not 0 <= logprobs <= LOGPROB_WIDTH_MAX:
            raise RequestError(f"logprobs must be in [0, {LOGPROB_WIDTH_MAX}], not {logprobs}")
        self._check_ids(_text_ids(r) if r.images else r.prompt_ids)
        if r.images:
            self._check_images(r, seq)
        sampler = dataclasses.replace(r.sampler, n_probs=0)
        try:  # what the batch will build from it, once, here: it fails alone if it must
            self._stack([sampler])
        except LlamayError:
            raise
        except Exception as exc:
            raise RequestError(f"the request's sampling parameters cannot be used: {exc}") from exc
        a = Active(handle, sampler, stop, budget, seq=seq, logprobs=logprobs)
        a.lora = self._lora_of(r, seq)
        if seq is None and not self.mgr.fits_ever(n + budget + 1):
            raise self.mgr.never_fits(
                f"a request of {n} prompt + {budget} new tokens", n + budget + 1
            )
        self.waiting.append(a)
        return a

    def _lora_of(self, r: Request, seq: SeqKV | None) -> tuple[float, ...]:
        """The request's scale per adapter (a fork naming none: its parent's). A fork keeps
        its parent's prefix key when the scales agree; K/V made under two settings get a
        key of their own, shared with nothing. A restored snapshot's K/V count as made
        under the restoring request's setting (a snapshot does not record adapters)."""
        default = self.lora_scales
        if r.lora is None and seq is not None and seq.salt != adapters.RESTORED:
            if seq.salt is None:
                default = np.zeros(self.n_adapters, np.float32)
            elif seq.salt[0] == "lora":
                default = np.asarray(seq.salt[1], np.float32)
        scales = adapters.request_scales(r.lora, self.n_adapters, default)
        if seq is not None and seq.salt == adapters.RESTORED:
            seq.salt = adapters.salt(scales)
        if seq is not None and seq.salt != adapters.salt(scales):
            seq.salt = ("lora-mixed", seq.id)
        return scales

    def _check_ids(self, ids: list[int]) -> None:
        """Prompt token ids must be integers in the vocabulary: a bad one would break the
        int32 arrays of the whole batch's step, or index past the embedding table."""
        try:
            token_ids(ids, self._vocab)
        except TypeError as e:
            raise RequestError(str(e)) from None

    def _check_images(self, r: Request, seq: SeqKV | None) -> None:
        """A request's `ImageSpan`s: in order, inside the prompt, over placeholder ids,
        of the model's embedding width; a bidirectional one within one step's feed."""
        if seq is not None:
            raise RequestError(
                "images in a continued (forked or restored) sequence are not supported"
            )
        end, width = 0, getattr(self.cfg, "d_model", None)
        for im in r.images:
            shape = getattr(im.embeddings, "shape", ())
            if len(shape) != 2 or not shape[0] or (width is not None and shape[1] != width):
                raise RequestError(
                    f"an image's embeddings must be [tokens, {width}], not {list(shape)}"
                )
            if not end <= im.start < im.end <= len(r.prompt_ids):
                raise RequestError(
                    f"image positions {im.start}..{im.end - 1} are not in order inside the "
                    f"prompt of {len(r.prompt_ids)} tokens"
                )
            if any(t >= 0 for t in r.prompt_ids[im.start : im.end]):
                raise RequestError("an image's prompt positions must hold its placeholder ids")
            if im.bidirectional and shape[0] > self.mgr.max_feed:
                raise RequestError(
                    f"an image of {shape[0]} tokens is longer than a step feeds "
                    f"({self.mgr.max_feed}): the engine was made before the model's projector"
                )
            end = im.end

    def _reap_cancelled(self) -> None:
        for i, a in enumerate(self.slots):
            if a is not None and a.handle.cancelled:
                self.slots[i] = None
                self._end(a, "cancelled")
        for a in [a for a in self.waiting if a.handle.cancelled]:
            self.waiting.remove(a)
            self._end(a, "cancelled")

    def _end(self, a: Active, reason: str, error: BaseException | None = None) -> None:
        with self._lock:
            if a.seq is not None:
                if a.handle.request.keep and reason in ("stop", "length"):
                    self.kept[a.handle.id] = a
                else:
                    self.mgr.release(a.seq)
                    a.seq = None
            self.counters["served"] += 1
        a.handle._finish(reason, error)

    def _fail(self, failed: dict[Active, BaseException]) -> None:
        """End the requests in `failed`, each with its own error; the others go on."""
        for a, exc in failed.items():
            if a in self.slots:
                self.slots[self.slots.index(a)] = None
            self._end(a, "error", exc)

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
                    salt = adapters.salt(a.lora)  # K/V of other adapter settings: not shared
                    req = a.handle.request
                    seq = self.mgr.open(list(req.prompt_ids), a.budget + 1, salt, req.cache_prompt)
                if seq is None:
                    return  # the pool is full for now; FIFO: later requests wait too
                a.seq = seq
                a.handle.usage.cached_tokens = seq.cached_hit
                self.counters["cache_hit_tokens"] += seq.cached_hit
            self.waiting.popleft()
            slot = self.slots.index(None)
            self.slots[slot] = a
            a.handle.slot = slot
            self._sampler_plan = plan
            a.fresh = True

    def _width(self) -> int:
        """The top-N width the batch computes: 0 unless some slot asks for top logprobs."""
        most = max((a.logprobs or 0 for a in self.slots if a is not None), default=0)
        if most == 0:
            return 0
        return LOGPROB_WIDTH if most <= LOGPROB_WIDTH else LOGPROB_WIDTH_MAX

    def _stack(self, samplers: list[Sampler]) -> SamplingParams:
        dry = any(s.uses_dry for s in samplers)
        pieces = self.model.token_pieces() if dry else None
        encode = getattr(self.model, "_encode_plain", None) if dry else None
        vocab = self._vocab or (len(pieces) if pieces else None)
        return SamplingParams.stack(samplers, vocab, pieces, encode)

    def _refresh_params(self) -> None:
        """The slots' sampler parameters, and fresh slots' state seeded. When that
        fails, the slots whose own sampler fails to build fail alone (RequestFailed);
        a failure no single slot explains fails the batch."""
        try:
            self._build_params()
        except Exception as exc:
            failed = {}
            for a in self.slots:
                if a is None:
                    continue
                s = dataclasses.replace(a.sampler, n_probs=self._width())
                try:
                    self._stack([s])
                    SamplerState.init([s], [_history(a.seq.tokens)], history=self.n_ctx)
                except Exception as own:
                    failed[a] = own
            if not failed:
                raise
            raise RequestFailed(failed) from exc

    def _build_params(self) -> None:
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
            self._params = self._stack(samplers)
            self._params_key = key
            if self._state is None:
                self._state = SamplerState.init(samplers, history=self.n_ctx)
            elif self._state.top_ids.shape[1] != width:  # only the per-step outputs change
                self._state = dataclasses.replace(  # device_put: no program compiled
                    self._state,
                    top_logprobs=jax.device_put(np.zeros((self.n_slots, width), np.float32)),
                    top_ids=jax.device_put(np.zeros((self.n_slots, width), np.int32)),
                )
        fresh = [i for i, a in enumerate(self.slots) if a is not None and a.fresh]
        if fresh:
            # rows bucketed, the padding repeating the last (`set_rows` drops it): one
            # program per power of two, not one per count of requests starting at once
            pad = [fresh[-1]] * (bucket(len(fresh), 1) - len(fresh))
            rows = SamplerState.init(
                [samplers[i] for i in fresh + pad],
                [_history(self.slots[i].seq.tokens) for i in fresh + pad],
                history=self.n_ctx,  # the whole context: llama.cpp's repeat_last_n=-1
            )
            self._state = set_rows(self._state, fresh, rows)
            for i in fresh:
                self.slots[i].fresh = False


def _text_ids(r: Request) -> list[int]:
    """A request's prompt ids outside its images' positions."""
    keep = np.ones(len(r.prompt_ids), bool)
    for im in r.images:
        keep[max(0, im.start) : max(0, im.end)] = False
    return [t for t, k in zip(r.prompt_ids, keep, strict=True) if k]


def _history(tokens: list[int]) -> list[int]:
    """The penalty history a sequence seeds its sampler with: its token ids, without
    images' placeholders (negative)."""
    return [t for t in tokens if t >= 0] if tokens and min(tokens) < 0 else tokens


def _devices(tree) -> set:
    """The devices a pytree's arrays live on."""
    return {
        d
        for leaf in jax.tree_util.tree_leaves(tree)
        if hasattr(leaf, "sharding")
        for d in leaf.sharding.device_set
    }
