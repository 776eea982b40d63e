"""The engine interface the edges (HTTP server, CLI chat, Python API) drive.

    engine = BatchEngine(model)                  # llamay.engine.scheduler
    h = engine.submit(Request(prompt_ids, max_tokens=64, sampler=Sampler(temperature=0)))
    for ev in h: ...                             # TokenEvent(token_id, ...), blocking
    async for ev in h: ...                       # the same from asyncio
    engine.cancel(h)                             # frees its state at once
    h.finish_reason, h.usage

`llamay.engine.scheduler.BatchEngine` implements it with continuous batching over a
paged KV pool and prefix sharing, and adds `fork`, `snapshot`, `restore` and `release`
(for requests submitted with `keep=True`); its `stats()` adds pages
total/free/used/cached/held and computed / cache-hit token counts. The tests hold it to
a one-request-at-a-time reference over `Model.generation` (tests/engine/serial_engine.py).
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from llamay.sample import Sampler

_ids = itertools.count(1)


@dataclass(frozen=True)
class ImageSpan:
    """An image's embeddings in a request's prompt (`llamay.multimodal.layout` makes them):
    prompt positions `start` .. `start + len(embeddings) - 1` hold its placeholder id (a
    negative id derived from the image's content hash: the prefix tree keys those positions
    by it, so a later request with the same image reuses them and another image does not),
    and the model sees `embeddings` [n, E] there in place of token embeddings.
    `bidirectional`: its positions attend to one another non-causally, fed as a step of
    their own (Gemma 3: mtmd_decode_use_non_causal)."""

    start: int
    embeddings: Any  # [n, E] float32
    bidirectional: bool = False

    @property
    def end(self) -> int:
        return self.start + len(self.embeddings)


@dataclass
class Request:
    prompt_ids: list[int]
    max_tokens: int = 128
    sampler: Sampler = field(default_factory=Sampler)
    stop_ids: frozenset[int] | None = None  # None: the tokenizer's end-of-generation ids
    constraint: Any = None  # a llamay.sample constraint, or None
    # BatchEngine: keep the KV after finishing (fork/snapshot/release); with max_tokens=0
    # the request only computes its prompt's KV (prefill-only) and ends "length"
    keep: bool = False
    # Log-probabilities on each TokenEvent (the model's own, before the sampler): None
    # for none, 0 for the token's own, N (<= 64) for its top N alternatives too.
    # Default: the sampler's n_probs when set.
    logprobs: int | None = None
    # LoRA adapters (BatchEngine over a model loaded with some): {adapter id: scale}, the
    # others off (llama-server's per-request `lora`), or one scale per adapter; None: the
    # engine's global scales (`BatchEngine.set_lora_scales`)
    lora: Any = None
    # Speculative decoding (BatchEngine with `speculative=`): the most draft tokens per
    # step (0: none for this request), the fewest worth verifying, and the draft model's
    # confidence floor (llama.cpp's --draft-max/--draft-min/--draft-p-min); None: the
    # engine's
    draft_max: int | None = None
    draft_min: int | None = None
    draft_p_min: float | None = None
    # Images (`ImageSpan`s, in prompt order): their positions in prompt_ids hold their
    # placeholder ids; the engine feeds their embeddings there
    images: tuple[ImageSpan, ...] = ()
    # BatchEngine: start from the longest cached prefix of the prompt (llama-server's
    # cache_prompt); False computes the whole prompt (its pages are still offered after)
    cache_prompt: bool = True
    id: str = field(default_factory=lambda: f"req-{next(_ids)}")


@dataclass(frozen=True)
class TokenEvent:
    token_id: int
    index: int  # 0-based position in the completion
    logprob: float | None = None  # when the request asked for logprobs
    top_logprobs: tuple[tuple[int, float], ...] = ()  # (id, logprob), best first


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    draft_n: int = 0  # speculative decoding: draft tokens proposed, and accepted
    draft_n_accepted: int = 0


_DONE = object()


class Handle:
    """One submitted request: iterate it (sync or async) for its tokens.

    After iteration ends, `finish_reason` is "stop", "length", "cancelled" or "error"
    (then `error` holds the exception, re-raised by the iterator).
    """

    def __init__(self, request: Request):
        self.request = request
        self.id = request.id
        self.finish_reason: str | None = None
        self.error: BaseException | None = None
        # the end-of-generation token that ended it, never emitted: (id, logprob, top)
        # (llama-server counts and lists it)
        self.stop_token: tuple[int, float | None, tuple] | None = None
        self.usage = Usage(prompt_tokens=len(request.prompt_ids))
        # when it was submitted, and when an engine slot took it (the queue wait between)
        self.t_submitted = time.perf_counter()
        self.t_admitted: float | None = None
        self._slot: int | None = None
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._cancelled = threading.Event()
        # an asyncio consumer waiting for the next event: (its loop, a future to resolve)
        self._waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future] | None = None
        self._waiter_lock = threading.Lock()

    @property
    def slot(self) -> int | None:
        """The engine slot it ran in (BatchEngine); setting it marks the admission."""
        return self._slot

    @slot.setter
    def slot(self, value: int | None) -> None:
        if value is not None and self.t_admitted is None:
            self.t_admitted = time.perf_counter()
        self._slot = value

    # -- producer side (the engine) -------------------------------------------------

    def _emit(self, token_id: int, logprob: float | None = None, top=()) -> None:
        ev = TokenEvent(token_id, self.usage.completion_tokens, logprob, tuple(top))
        self.usage.completion_tokens += 1
        self._put(ev)

    def _finish(self, reason: str, error: BaseException | None = None) -> None:
        self.finish_reason, self.error = reason, error
        self._put(_DONE)

    def _put(self, item) -> None:
        """Queue an event and wake an asyncio consumer waiting for one, on its loop."""
        self._events.put(item)
        with self._waiter_lock:
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            loop, fut = waiter
            try:
                loop.call_soon_threadsafe(_resolve, fut)
            except RuntimeError:  # its loop closed: nobody is waiting any more
                pass

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    # -- consumer side ------------------------------------------------------------------

    def _next(self, ev) -> TokenEvent:
        if ev is _DONE:
            self._events.put(_DONE)  # later iterations end at once too
            if self.error is not None:
                raise self.error
            raise StopIteration
        return ev

    def __iter__(self) -> Iterator[TokenEvent]:
        while True:
            try:
                yield self._next(self._events.get())
            except StopIteration:
                return

    async def __aiter__(self) -> AsyncIterator[TokenEvent]:
        """The events on the running loop, woken by the engine's thread (`_put`): no
        executor thread blocked per stream (the default executor has cpu_count + 4, so
        16 streams on 2 cores queued behind each other and behind tokenisation)."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                ev = self._events.get_nowait()
            except queue.Empty:
                fut = loop.create_future()
                with self._waiter_lock:  # checked again under the lock: no lost wake-up
                    if self._events.empty():
                        self._waiter = (loop, fut)
                    else:
                        fut.set_result(None)
                try:
                    await fut
                finally:
                    with self._waiter_lock:
                        if self._waiter is not None and self._waiter[1] is fut:
                            self._waiter = None
                continue
            try:
                yield self._next(ev)
            except StopIteration:
                return


def _resolve(fut: asyncio.Future) -> None:
    if not fut.done():  # a consumer cancelled while waiting leaves its future behind
        fut.set_result(None)


class Engine(Protocol):
    def submit(self, request: Request) -> Handle: ...
    def cancel(self, handle: Handle) -> None: ...
    def stats(self) -> dict[str, Any]: ...
    def close(self) -> None: ...
