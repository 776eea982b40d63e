"""The server's state, shared by every API family: models, limits, counters."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request as HttpRequest

from llamay.sample import Sampler
from llamay.serve.core import TextGen
from llamay.serve.latency import Latency
from llamay.serve.models import Loaded, Models


@dataclass
class Metrics:
    """Totals for `/metrics` (Prometheus text)."""

    requests: int = 0
    requests_failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    prompt_seconds: float = 0.0
    decode_seconds: float = 0.0
    in_flight: int = 0
    contexts_expired: int = 0
    #: time to first token, per output token, queue wait: histograms per model
    latency: Latency = field(default_factory=Latency)

    def record(self, gen: TextGen) -> None:
        self.latency.record(gen)
        self.requests += 1
        self.prompt_tokens += gen.prompt_tokens
        self.completion_tokens += gen.completion_tokens
        self.cached_tokens += gen.cached_tokens
        self.prompt_seconds += gen.prompt_seconds
        self.decode_seconds += gen.decode_seconds


class MeteredGen(TextGen):
    """A TextGen that adds itself to the server's metrics when it ends."""

    metrics: Metrics
    server: ServerState
    id_slot: int = -1

    async def stream(self):
        self.metrics.in_flight += 1
        try:
            async for delta in super().stream():
                yield delta
        finally:
            self.metrics.in_flight -= 1
            self.metrics.record(self)
            # what that slot last held (llama-server's slot cache): the slot the request
            # named (llama-server's id_slot), else the engine slot it ran in
            slot = self.id_slot if self.id_slot >= 0 else getattr(self.handle, "slot", None)
            if slot is not None:
                # an image prompt's sequence: its placeholder ids and images (serve.vision)
                r = self.handle.request if self.handle is not None else None
                ids, images = (r.prompt_ids, r.images) if r and r.images else (self.prompt_ids, ())
                self.server.hold_slot(self.lm.name, slot, ids + self.token_ids, images)


@dataclass
class ServerState:
    models: Models
    api_key: str | None = None
    #: The most tokens one request may generate (None: up to the context).
    max_tokens_limit: int | None = None
    #: Contexts (`/v1/contexts`) unused this long are deleted, their KV pages freed; at
    #: most `max_contexts` live at once (unauthenticated clients must not pin the pool).
    context_ttl_s: float = 1800.0
    max_contexts: int = 256
    metrics: Metrics = field(default_factory=Metrics)
    started: float = field(default_factory=time.time)
    extra: dict[str, Any] = field(default_factory=dict)
    #: (model, engine slot) -> the tokens of the last generation that ran in that slot:
    #: llama-server's per-slot prompt cache, which /slots/{id}?action=save writes out.
    slot_tokens: dict[tuple[str, int], list[int]] = field(default_factory=dict)
    #: ... and the `ImageSpan`s over those tokens' image placeholder ids, where it had images.
    slot_images: dict[tuple[str, int], tuple] = field(default_factory=dict)

    def hold_slot(self, model: str, slot: int, tokens: list[int], images=()) -> None:
        """Record what an engine slot last held: `tokens` (an image's positions hold its
        placeholder ids) and `images` over them, which a save recomputes where the
        prefix cache has lost their K/V."""
        self.slot_tokens[(model, slot)] = list(tokens)
        if images:
            self.slot_images[(model, slot)] = tuple(images)
        else:
            self.slot_images.pop((model, slot), None)

    def textgen(
        self,
        lm: Loaded,
        prompt_ids: list[int],
        max_tokens: int | None,
        sampler: Sampler,
        stop=None,
        constraint=None,
        stop_ids: frozenset[int] | None = None,
        start=None,
        empty_ok: bool = False,
    ) -> TextGen:
        gen = MeteredGen(
            lm,
            prompt_ids,
            max_tokens,
            sampler,
            stop,
            constraint,
            max_tokens_limit=self.max_tokens_limit,
            stop_ids=stop_ids,
            start=start,
            empty_ok=empty_ok,
        )
        gen.metrics = self.metrics
        gen.server = self
        return gen

    async def constraint(self, lm: Loaded, **kw: Any):
        """A constraint built off the event loop (building a grammar can take a while)."""
        if not any(v not in (None, False) for v in kw.values()):
            return None
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, lambda: lm.model.constraint(**kw))


def state(request: HttpRequest) -> ServerState:
    return request.app.state.llamay
