"""The test reference engine: one request at a time, in submission order, over
`Model.generation` (the dense single-sequence path), behind the same `Engine` interface
as `BatchEngine`. Not on any product path: the batching engine's tests compare with it.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import replace
from typing import Any

from llamay.engine.api import Handle, Request
from llamay.errors import LlamayError


class SerialEngine:
    """One request at a time, in submission order, on a worker thread."""

    def __init__(self, model):
        self.model = model
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._active: Handle | None = None
        self._served = 0
        self._closed = False
        self._worker = threading.Thread(target=self._run, name="llamay-engine", daemon=True)
        self._worker.start()

    def submit(self, request: Request) -> Handle:
        if self._closed:
            raise LlamayError("the engine is closed")
        handle = Handle(request)
        self._queue.put(handle)
        return handle

    def cancel(self, handle: Handle) -> None:
        handle._cancelled.set()

    def stats(self) -> dict[str, Any]:
        return {
            "queued": self._queue.qsize(),
            "active": 0 if self._active is None else 1,
            "served": self._served,
        }

    def close(self) -> None:
        self._closed = True
        self._queue.put(None)
        self._worker.join(timeout=30)

    def _run(self) -> None:
        while (handle := self._queue.get()) is not None:
            self._active = handle
            try:
                self._serve(handle)
            except LlamayError as exc:
                handle._finish("error", exc)
            except Exception as exc:  # never let one request kill the worker
                handle._finish("error", exc)
            finally:
                self._active = None
                self._served += 1

    def _serve(self, handle: Handle) -> None:
        if handle.cancelled:
            handle._finish("cancelled")
            return
        r = handle.request
        n = r.logprobs if r.logprobs is not None else (r.sampler.n_probs or None)
        sampler = r.sampler if n is None else replace(r.sampler, n_probs=max(n, 1))
        gen = self.model.generation(r.prompt_ids, r.max_tokens, sampler)
        if r.stop_ids is not None:
            gen.stop_ids = frozenset(r.stop_ids)
        if r.constraint is not None:
            gen.constraint = r.constraint
        for tok in gen:
            if handle.cancelled:
                handle._finish("cancelled")
                return
            if n is None:
                handle._emit(tok)
            else:
                logprob, top = gen.logprobs[-1]
                handle._emit(tok, logprob, top[:n])
        handle._finish(gen.finish_reason or "length")
