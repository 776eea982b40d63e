"""Sequences whose KV stays in the engine between requests: what the context API stands on.

    kv = await prefill(engine, tokens)                  # computes tokens' KV and keeps it
    h = await continue_from(engine, kv, request)        # request.prompt_ids: the whole text;
                                                        # only what kv lacks is computed
    kv2 = Kept(engine, h, tokens + generated)           # after h finished, kept
    kv.drop()                                           # releases the KV when unshared

A `Kept` is shared by every context forked from the same point (reference counted): their
continuations fork it in the engine, so they share its full pages and never recompute
them. All engine calls that wait on the engine's worker run off the event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from llamay.engine.api import Handle, Request
from llamay.errors import LlamayError
from llamay.kv.snapshot import Snapshot
from llamay.sample import GREEDY


def supports_kv(engine: Any) -> bool:
    """Whether `engine` can keep, fork and snapshot sequences (the batch engine can; the
    serial comparison engine cannot, so contexts there re-send their tokens)."""
    return all(hasattr(engine, op) for op in ("fork", "snapshot", "restore", "release"))


class Kept:
    """A finished `keep=True` request's KV in `engine`, covering `tokens`."""

    def __init__(self, engine: Any, handle: Handle, tokens: list[int]):
        self.engine, self.handle, self.tokens = engine, handle, list(tokens)
        self.refs = 1

    def share(self) -> Kept:
        self.refs += 1
        return self

    def drop(self) -> None:
        """One user fewer; the last one releases the KV (pages shared with forks stay
        with them)."""
        self.refs -= 1
        if self.refs == 0:
            try:
                self.engine.release(self.handle)
            except LlamayError:  # the engine was closed (model unloaded): nothing held
                pass

    def usable_for(self, engine: Any, tokens: list[int]) -> bool:
        return engine is self.engine and tokens[: len(self.tokens)] == self.tokens


def _prefill_request(prompt_ids: list[int], images=()) -> Request:
    """Computes the prompt's KV and keeps it, generating nothing (the engine's
    prefill-only request); `images`: the prompt's `ImageSpan`s."""
    return Request(list(prompt_ids), max_tokens=0, sampler=GREEDY, keep=True, images=images)


async def _run(fn, *args):
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


async def _drained(handle: Handle) -> None:
    async for _ in handle:
        pass


async def start(
    engine: Any, request: Request, kv: Kept | None = None, snapshot: Snapshot | None = None
) -> Handle:
    """Run `request` (its prompt_ids: the whole sequence) keeping its KV: forked from
    `kv`, or restored from `snapshot`, so that only the tokens past them are computed."""
    request = dataclasses.replace(request, keep=True)
    if kv is not None:
        more = dataclasses.replace(request, prompt_ids=request.prompt_ids[len(kv.tokens) :])
        return (await _run(engine.fork, kv.handle, [more]))[0]
    if snapshot is not None:
        more = dataclasses.replace(request, prompt_ids=request.prompt_ids[len(snapshot.tokens) :])
        return await _run(engine.restore, snapshot, more)
    return engine.submit(request)


async def prefill(
    engine: Any,
    tokens: list[int],
    kv: Kept | None = None,
    snapshot: Snapshot | None = None,
    images=(),
) -> Kept:
    """`tokens`' KV computed now and kept (from `kv` or `snapshot` where they cover a
    prefix of `tokens`; `images`: the `ImageSpan`s over `tokens`' placeholder ids, for a
    sequence started afresh)."""
    handle = await start(engine, _prefill_request(tokens, tuple(images)), kv, snapshot)
    await _drained(handle)
    if handle.finish_reason != "length":
        raise LlamayError(f"computing the context's KV ended with {handle.finish_reason}")
    return Kept(engine, handle, tokens)


async def snapshot_of(kv: Kept) -> Snapshot:
    return await _run(kv.engine.snapshot, kv.handle)


async def discard(engine: Any, handle: Handle) -> None:
    """Wait for a request the caller stopped following to end, then release the KV it may
    have kept (it can finish, kept, just before the cancel reaches the engine)."""
    try:
        await _drained(handle)
    except Exception:  # noqa: BLE001 - its error was the caller's to report
        pass
    try:
        await _run(engine.release, handle)
    except LlamayError:
        pass
