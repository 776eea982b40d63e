"""What every API family shares: one generation as text, stop strings, streaming bodies.

    gen = TextGen(lm, prompt_ids, max_tokens=64, sampler=Sampler(...), stop=["\\n\\n"])
    async for delta in gen.stream(): ...     # text pieces, stop strings cut out
    gen.finish_reason, gen.stop_sequence, gen.prompt_tokens, gen.completion_tokens

Set `gen.logprobs` (0: each token's own, N: with its top N) before streaming to have
`gen.token_logprobs` filled as tokens arrive (the engine's, from the sampling step);
`gen.take_logprobs()` hands over the rows not yet taken, for streamed chunks.

Leaving the stream early (a client disconnect cancels the response task, or the body
iterator is closed) cancels the request in the engine, which frees its state.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
import typing
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import anyio
import numpy as np
from pydantic import BaseModel, ConfigDict, model_validator
from starlette.responses import StreamingResponse

from llamay.engine.api import Handle, Request
from llamay.errors import ContextOverflowError, RequestError
from llamay.sample import Sampler
from llamay.serve.errors import ApiError, error_body, error_fields, error_kind, to_http_status
from llamay.serve.line_limits import LineLimits
from llamay.serve.models import Loaded
from llamay.serve.sampling import fit_sampler
from llamay.tok import IncrementalDecoder, StopStrings


def _admits_none(annotation: Any) -> bool:
    if annotation is Any or annotation is None or annotation is type(None):
        return True
    return any(_admits_none(a) for a in typing.get_args(annotation))


class OpenModel(BaseModel):
    """A request body that keeps fields it does not declare (`model_extra`): every API
    family takes llama.cpp's extra sampling fields. An explicit null is the field's
    default, as the peers read it (OpenAI's nullable fields, llama.cpp's `json_value`, a
    Go pointer left nil in Ollama): clients and wrappers send `"stream": null`."""

    model_config = ConfigDict(extra="allow")

    @model_validator(mode="before")
    @classmethod
    def _null_is_the_default(cls, data: Any) -> Any:
        if isinstance(data, dict) and None in data.values():
            strict = _non_nullable(cls)
            data = {k: v for k, v in data.items() if v is not None or k not in strict}
        return data


@functools.cache
def _non_nullable(cls: type[BaseModel]) -> frozenset[str]:
    """The input keys of `cls`'s fields whose type does not take None."""
    return frozenset(
        f.alias or name for name, f in cls.model_fields.items() if not _admits_none(f.annotation)
    )


async def off_loop(fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """`fn(*args, **kw)` on a worker thread: chat templates (untrusted Jinja) and
    tokenisation of long texts are CPU work that must not hold up the event loop, and
    with it every other request and /health."""
    return await asyncio.get_running_loop().run_in_executor(None, lambda: fn(*args, **kw))


@functools.lru_cache(maxsize=16)
def _longest_token_bytes(tokenizer) -> int:
    """An upper bound on the UTF-8 bytes of text one token stands for (its vocabulary
    entry's, which spells bytes and spaces at least as long as their text)."""
    return max((len(t.encode("utf-8", "surrogatepass")) for t in tokenizer.vocab.tokens), default=1)


def encode_prompt(lm: Loaded, text: str, max_bytes: int | None = None) -> list[int]:
    """Token ids of a prompt, as `Model.generate` encodes it (BOS per the model, special
    tokens parsed). A text that cannot fit the context whatever its tokens (more bytes
    than the context's tokens could spell) is refused before it is tokenised: a 10 MB
    prompt would otherwise cost seconds of CPU to learn that. A caller that truncates
    the prompt instead names the most bytes it takes (`max_bytes`)."""
    n_bytes = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
    if max_bytes is not None:
        if n_bytes > max_bytes:
            raise ContextOverflowError(
                f"the prompt has {n_bytes} bytes; at most {max_bytes} are truncated to fit "
                "the context"
            )
        return lm.model.tokenize(text, add_special=True, parse_special=True)
    at_least = n_bytes // max(1, _longest_token_bytes(lm.model.tokenizer))
    if at_least >= lm.model.n_ctx:
        raise ContextOverflowError(
            f"the prompt has at least {at_least} tokens ({n_bytes} bytes); the context "
            f"holds {lm.model.n_ctx} (shorten the prompt or start the server with a larger "
            "--ctx)",
            at_least,
            lm.model.n_ctx,
        )
    return lm.model.tokenize(text, add_special=True, parse_special=True)


class TextGen:
    """One generation request over a loaded model's engine, as text."""

    def __init__(
        self,
        lm: Loaded,
        prompt_ids: list[int],
        max_tokens: int | None,
        sampler: Sampler,
        stop: Sequence[str] | None = None,
        constraint: Any = None,
        max_tokens_limit: int | None = None,
        stop_ids: frozenset[int] | None = None,
        start: Callable[[Request], Awaitable[Handle]] | None = None,
        empty_ok: bool = False,
    ):
        """`start`: how the request is run (default: submitted to the model's engine);
        the context API passes one that continues a sequence kept in the engine.
        `empty_ok`: an empty prompt generates nothing (llama-server's completions) rather
        than being refused."""
        n_ctx = lm.model.n_ctx
        if not getattr(lm.model.config, "causal", True):
            raise RequestError(
                f"model {lm.name!r} is an embedding model ({lm.model.config.arch}); it does "
                "not generate text (use the embeddings endpoints)"
            )
        if not prompt_ids and not empty_ok:
            raise RequestError("the prompt is empty (no tokens to condition on)")
        if len(prompt_ids) >= n_ctx:
            raise ContextOverflowError(
                f"the prompt has {len(prompt_ids)} tokens; the context holds {n_ctx} "
                "(shorten the prompt or start the server with a larger --ctx)",
                len(prompt_ids),
                n_ctx,
            )
        room = n_ctx - len(prompt_ids)
        if max_tokens is None or max_tokens < 0:
            max_tokens = room
        if max_tokens_limit is not None:
            max_tokens = min(max_tokens, max_tokens_limit)
        self.lm = lm
        self.prompt_ids = list(prompt_ids)
        self.max_tokens = min(max_tokens, room)
        self.max_tokens_limit = max_tokens_limit
        self.shift: Any = None  # Ollama's context shift (`shift_past`)
        self.shifts = 0  # how many times the context shifted
        self.sampler = fit_sampler(sampler, lm.model.tokenizer.vocab_size, n_ctx)
        self.stop = StopStrings(stop)
        self.constraint = constraint
        self.stop_ids = stop_ids
        self.start = start
        self.token_ids: list[int] = []
        self.logprobs: int | None = None  # None: no log-probabilities
        self.lora: dict[int, float] | None = None  # per-request adapter scales (lora_adapters)
        self.cache_prompt = True  # False: no cached prefix reused (llama-server's cache_prompt)
        self.lines: LineLimits | None = None  # llama-server's n_indent, t_max_predict_ms
        self.draft: dict[str, Any] = {}  # speculative decoding: draft_max/_min/_p_min
        self.token_logprobs: list[tuple[float, list[tuple[int, float]]]] = []
        # the end-of-generation token that ended the text: (id, logprob, alternatives)
        self.eos: tuple[int, float | None, tuple] | None = None
        self._logprobs_taken = 0
        self.text = ""
        self.finish_reason: str | None = None
        self.cached_tokens = 0
        self.handle = None
        self.t_start = time.perf_counter()
        self.t_first: float | None = None
        self.t_end: float | None = None

    @property
    def stop_sequence(self) -> str | None:
        """The stop string that ended the text, if one did."""
        return self.stop.hit

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def predicted_tokens(self) -> int:
        """llama-server's count of tokens generated: the end-of-generation token too."""
        return self.completion_tokens + (self.eos is not None)

    @property
    def prompt_seconds(self) -> float:
        return (self.t_first or self.t_end or time.perf_counter()) - self.t_start

    @property
    def decode_seconds(self) -> float:
        if self.t_first is None:
            return 0.0
        return (self.t_end or time.perf_counter()) - self.t_first

    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }

    def shift_past(self, window: Any, max_tokens: int) -> None:
        """Ollama's context shift: a reply that fills `window.size` tokens goes on over
        `window.shifted(context, n_prompt)`, up to `max_tokens` tokens in all (within the
        server's limit). Not for a reply that continues kept K/V (`start`)."""
        if self.start is not None:
            return
        self.shift = window
        self.max_tokens = min(max_tokens, self.max_tokens_limit or max_tokens)

    async def stream(self) -> AsyncIterator[str]:
        """Text deltas until a stop token, a stop string, the budget or cancellation (with
        a `shift_past` window, past its end)."""
        lm = self.lm
        lm.busy += 1
        self.t_start = time.perf_counter()
        try:
            if self.max_tokens <= 0 or not self.prompt_ids:  # nothing to condition on
                self.finish_reason = "length"
                return
            dec = IncrementalDecoder(lm.model.tokenizer)
            context = list(self.prompt_ids)
            while True:
                n0 = len(self.token_ids)
                room = self.max_tokens - n0
                if self.shift is not None:
                    room = min(room, self.shift.size - len(context))
                handle = await self._submit(context, room)
                async for out in self._segment(handle, dec):
                    yield out
                if n0 == 0:
                    self.cached_tokens = getattr(handle.usage, "cached_tokens", 0)
                if self.finish_reason is not None:  # a stop string or a line limit
                    return
                context += self.token_ids[n0:]
                full = self.shift is not None and len(context) >= self.shift.size
                if handle.finish_reason == "length" and full and room < self.max_tokens - n0:
                    context = self.shift.shifted(context, len(self.prompt_ids))
                    self.shifts += 1
                    continue
                break
            out, hit = self.stop.feed(dec.flush(), final=True)
            out, limited = self._limit(out)
            if out:
                self.text += out
                yield out
            reason = handle.finish_reason or "length"
            self.finish_reason = "stop" if hit else "length" if limited else reason
            if not (hit or limited):
                self.eos = handle.stop_token
        finally:
            if self.handle is not None and not self.handle.done:
                lm.engine.cancel(self.handle)
                if self.finish_reason is None:
                    self.finish_reason = "cancelled"
            self.t_end = time.perf_counter()
            lm.busy -= 1

    async def _submit(self, context: list[int], max_tokens: int) -> Handle:
        request = Request(
            context,
            max_tokens,
            self.sampler,
            stop_ids=self.stop_ids,
            constraint=self.constraint,
            logprobs=self.logprobs,
            lora=self.lora,
            cache_prompt=self.cache_prompt,
            **self.draft,
        )
        if self.start is not None:
            self.handle = await self.start(request)
        else:
            self.handle = self.lm.engine.submit(request)
        return self.handle

    async def _segment(self, handle: Handle, dec: IncrementalDecoder) -> AsyncIterator[str]:
        """The text of one engine request's tokens; a stop string or a line limit sets
        `finish_reason` and ends it."""
        async for ev in handle:
            if self.t_first is None:
                self.t_first = time.perf_counter()
            self.token_ids.append(ev.token_id)
            if ev.logprob is not None:
                self.token_logprobs.append((ev.logprob, list(ev.top_logprobs)))
            out, hit = self.stop.feed(dec.feed(ev.token_id))
            out, limited = self._limit(out)
            if out:
                self.text += out
                yield out
            if hit or limited:
                self.finish_reason = "stop" if hit else "length"
                self.lm.engine.cancel(handle)
                return

    def _limit(self, out: str) -> tuple[str, bool]:
        """`out` within the line limits (`lines`), and whether they end the text."""
        if self.lines is None or not out:
            return out, False
        return self.lines.feed(out, self.t_first)

    def logprob_rows(self) -> list[tuple[int, float, list[tuple[int, float]]]]:
        """(token id, logprob, [(id, logprob)] alternatives) of every token so far."""
        return [
            (t, lp, top) for t, (lp, top) in zip(self.token_ids, self.token_logprobs, strict=False)
        ]

    def eos_rows(self) -> list[tuple[int, float, list[tuple[int, float]]]]:
        """`logprob_rows`' row of the end-of-generation token, when one ended the text
        and log-probabilities were asked for."""
        if self.eos is None or self.eos[1] is None:
            return []
        return [(self.eos[0], self.eos[1], list(self.eos[2]))]

    def take_logprobs(self) -> list[tuple[int, float, list[tuple[int, float]]]]:
        """`logprob_rows` of the tokens received since the last call."""
        rows = self.logprob_rows()[self._logprobs_taken :]
        self._logprobs_taken += len(rows)
        return rows

    async def collect(self, request=None) -> str:
        """All the text. When `request`'s client goes away first (a non-streaming client
        that gives up), the generation is cancelled at once, between tokens or before the
        first, and what was generated so far is returned."""
        parts: list[str] = []

        async def run() -> None:
            agen = self.stream()
            try:
                async for delta in agen:
                    parts.append(delta)
            finally:
                await agen.aclose()

        if request is None:
            await run()
            return "".join(parts)
        work = asyncio.ensure_future(run())
        watcher = asyncio.ensure_future(wait_disconnected(request))
        try:
            await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
            if not work.done():  # the client left (or this handler was cancelled)
                work.cancel()
            await asyncio.gather(work, watcher, return_exceptions=True)
        if not work.cancelled():
            work.result()  # an error of the generation itself
        return "".join(parts)


async def wait_disconnected(request) -> None:
    """Return when the client of `request` (whose body has been read) disconnects."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class EventStream(StreamingResponse):
    """A streaming response that watches for the client leaving and, whatever happens,
    closes its body iterator (so a generation in progress is cancelled at once)."""

    async def __call__(self, scope, receive, send) -> None:
        try:
            async with anyio.create_task_group() as tg:

                async def body() -> None:
                    try:
                        await self.stream_response(send)
                    except OSError:
                        pass
                    tg.cancel_scope.cancel()

                tg.start_soon(body)
                await self.listen_for_disconnect(receive)
                tg.cancel_scope.cancel()
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()


def sse(data: Any, event: str | None = None) -> str:
    head = f"event: {event}\n" if event else ""
    body = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"{head}data: {body}\n\n"


def ndjson(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False) + "\n"


def sse_response(agen: AsyncIterator[str], family: str) -> EventStream:
    """An SSE response of `agen`; an error once streaming has begun becomes one last
    `data:` event with `family`'s error body."""

    def on_error(exc: Exception) -> str:
        status = to_http_status(exc)
        return sse(error_body(family, status, str(exc), None, error_kind(exc), error_fields(exc)))

    return EventStream(guarded(agen, on_error), media_type="text/event-stream")


async def guarded(agen: AsyncIterator[str], on_error) -> AsyncIterator[str]:
    """`agen`'s items; an error after the response has started becomes one last item,
    `on_error(exc)` (the status line is gone by then)."""
    try:
        async for item in agen:
            yield item
    except Exception as exc:  # noqa: BLE001 - reported to the client in-band
        yield on_error(exc)
    finally:
        await agen.aclose()


async def primed(agen: AsyncIterator[str]) -> AsyncIterator[str]:
    """Run `agen` up to its first item now (so errors before any output become an HTTP
    error status), then hand back an iterator that yields it and the rest."""
    try:
        first = await agen.__anext__()
    except StopAsyncIteration:
        first = None
    except BaseException:
        await agen.aclose()
        raise

    async def rest() -> AsyncIterator[str]:
        try:
            if first is not None:
                yield first
            async for item in agen:
                yield item
        finally:
            await agen.aclose()

    return rest()


async def merged(gens: Sequence[TextGen]) -> AsyncIterator[tuple[int, str | None]]:
    """Several generations at once, as (index, delta) in arrival order; (index, None) when
    that one ends. Closing this stops (and so cancels) the ones still running."""
    q: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, g: TextGen) -> None:
        try:
            async for delta in g.stream():
                q.put_nowait((i, delta))
            q.put_nowait((i, None))
        except Exception as exc:  # noqa: BLE001 - re-raised by the consumer
            q.put_nowait((i, exc))

    tasks = [asyncio.create_task(pump(i, g)) for i, g in enumerate(gens)]
    try:
        left = len(tasks)
        while left:
            i, item = await q.get()
            if isinstance(item, Exception):
                raise item
            if item is None:
                left -= 1
            yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def check_ids(lm: Loaded, prompts: list[list[int]]) -> None:
    """Refuse token ids outside the model's vocabulary (400 naming `prompt`)."""
    n_vocab = lm.model.tokenizer.vocab_size
    for p in prompts:
        bad = [t for t in p if not 0 <= t < n_vocab]
        if bad:
            raise ApiError(
                400,
                f"token id {bad[0]} is outside the vocabulary (0..{n_vocab - 1})",
                param="prompt",
            )


async def embed_all(lm: Loaded, prompts: list[list[int]], normalize: int = 2) -> list[np.ndarray]:
    """Pooled embeddings of token-id prompts (off the event loop), normalised as llama.cpp's
    `embd_normalize` says (2, Euclidean, llama-server's default); the OpenAI, Ollama and
    rerank endpoints share it. A model pooling "none" (a decoder whose GGUF names no
    pooling) or "rank" (a reranker) has no one vector per input: a clear 400."""
    kind = lm.model.pooling
    if kind in ("none", "rank"):
        raise RequestError(
            f"model {lm.name!r} pools {kind!r}, which gives no single vector per input "
            + (
                "(a reranker: use /v1/rerank)"
                if kind == "rank"
                else "(its GGUF sets no pooling_type): serve it with --pooling mean, cls or last"
            )
        )

    def run():
        out = []
        for p in prompts:
            if len(p) > lm.model.n_ctx:
                raise RequestError(
                    f"the input has {len(p)} tokens; the context holds {lm.model.n_ctx}"
                )
            out.append(np.asarray(lm.model.embed(p, normalize=normalize), np.float32))
        return out

    return await asyncio.get_running_loop().run_in_executor(None, run)
