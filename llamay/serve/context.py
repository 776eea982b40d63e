"""llamay's context API: a conversation state you create, extend, generate from, fork,
snapshot and restore.

    POST   /v1/contexts                     {"model", "text" | "tokens" | "messages" | "snapshot"}
    GET    /v1/contexts                     list
    GET    /v1/contexts/{id}                its tokens and text
    POST   /v1/contexts/{id}/append         {"text" | "tokens" | "messages"}
    POST   /v1/contexts/{id}/generate       {"max_tokens", sampling..., "stream"} (appends)
    POST   /v1/contexts/{id}/fork           {"n"} -> n new contexts sharing the prefix
    POST   /v1/contexts/{id}/snapshot       {"name"} -> saved under the store
    GET    /v1/snapshots                    saved snapshots
    DELETE /v1/contexts/{id}, /v1/snapshots/{name}

A context is its token sequence and, on the continuous-batching engine, that sequence's
KV kept in the engine (`llamay.serve.kept`): create and append compute the new tokens'
KV at once, generate continues from the kept KV (computing only what was appended), fork
makes N contexts that share the parent's KV pages (each child's continuation forks them
in the engine, so the common prefix is never recomputed), snapshot writes the KV to the
store's KV snapshots (`llamay.kv.store_snapshot`) under a name that also keeps the token
list, and creating from a snapshot loads that KV back. A context
holds its KV pages until it is deleted or unused for the server's `context_ttl_s`; at
most `max_contexts` live at once (more: 429). Over the serial comparison engine a context is
its tokens only, re-sent with each generate.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from llamay.errors import ContextOverflowError, SnapshotError
from llamay.kv.snapshot import Snapshot as KVSnapshot
from llamay.kv.snapshot import load_snapshot, snapshot_dir, store_snapshot
from llamay.serve import kept
from llamay.serve.core import off_loop, primed, sse, sse_response
from llamay.serve.errors import ApiError, not_found
from llamay.serve.models import Loaded
from llamay.serve.sampling import make_sampler
from llamay.serve.state import ServerState, state

router = APIRouter(tags=["Contexts (llamay)"])

_SAMPLING = (
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "seed",
    "repeat_penalty",
    "presence_penalty",
    "frequency_penalty",
)
_SNAPSHOT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Content(_Strict):
    text: str | None = None
    tokens: list[int] | None = None
    messages: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = True


class CreateContext(Content):
    model: str = ""
    snapshot: str | None = None


class Generate(_Strict):
    max_tokens: int = Field(64, ge=0)
    stop: list[str] | None = None
    stream: bool = False
    temperature: float | None = Field(None, ge=0)
    top_k: int | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    min_p: float | None = Field(None, ge=0, le=1)
    seed: int | None = Field(None, ge=0, lt=2**32)
    repeat_penalty: float | None = Field(None, gt=0)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None


class Fork(_Strict):
    n: int = Field(1, ge=1, le=64)


class Snapshot(_Strict):
    name: str | None = None


class Ctx:
    def __init__(self, model: str, tokens: list[int], kv: kept.Kept | None = None):
        self.id = f"ctx_{uuid.uuid4().hex[:16]}"
        self.model = model
        self.tokens = tokens
        self.kv = kv  # the engine's KV of a prefix of `tokens` (None: none kept)
        self.restore_from: KVSnapshot | None = None  # a loaded snapshot not yet in the engine
        self.busy = False  # a generation is running from it
        self.last_used = time.monotonic()

    def drop_kv(self) -> None:
        if self.kv is not None:
            self.kv.drop()
            self.kv = None


async def _ensure_kv(lm: Loaded, ctx: Ctx) -> None:
    """Make the engine hold the KV of all of ctx.tokens (computing only what its kept KV,
    or its snapshot, lacks)."""
    engine = lm.engine
    if not kept.supports_kv(engine) or not ctx.tokens:
        return
    if ctx.kv is not None and not ctx.kv.usable_for(engine, ctx.tokens):
        ctx.drop_kv()  # the model was reloaded since: its engine holds nothing of ours
    if ctx.kv is not None and ctx.kv.tokens == ctx.tokens:
        return
    if len(ctx.tokens) >= lm.model.n_ctx:
        # checked here: an engine fork refused later would leave its pages held
        raise ContextOverflowError(
            f"the context would hold {len(ctx.tokens)} tokens; the model's context holds "
            f"{lm.model.n_ctx} (start the server with a larger --ctx)",
            len(ctx.tokens),
            lm.model.n_ctx,
        )
    new = await kept.prefill(engine, ctx.tokens, ctx.kv, ctx.restore_from)
    ctx.drop_kv()
    ctx.kv, ctx.restore_from = new, None


def _busy(ctx: Ctx) -> None:
    if ctx.busy:
        raise ApiError(409, f"context {ctx.id} is generating; wait for it to finish")


def _contexts(st: ServerState) -> dict[str, Ctx]:
    return st.extra.setdefault("contexts", {})


def live_contexts(st: ServerState) -> dict[str, Ctx]:
    """The contexts held now (expired ones deleted first)."""
    expire_contexts(st)
    return _contexts(st)


def expire_contexts(st: ServerState) -> int:
    """Delete the contexts unused for `st.context_ttl_s` (not those generating), freeing
    their KV; how many went."""
    ctxs, now = _contexts(st), time.monotonic()
    stale = [c for c in ctxs.values() if not c.busy and now - c.last_used > st.context_ttl_s]
    for c in stale:
        del ctxs[c.id]
        c.drop_kv()
    st.metrics.contexts_expired += len(stale)
    return len(stale)


def _room_for(st: ServerState, n: int) -> None:
    """Refuse (429) `n` more contexts beyond the server's cap."""
    expire_contexts(st)
    live = len(_contexts(st))
    if live + n > st.max_contexts:
        raise ApiError(
            429,
            f"the server holds {live} contexts, at most {st.max_contexts}: delete some "
            f"(unused ones are deleted after {st.context_ttl_s:g} s)",
            kind="rate_limit_error",
        )


def _snapshot_dir():
    from llamay.store import store_dir

    return store_dir() / "contexts"


def _tokens_of(lm: Loaded, c: Content, first: bool) -> list[int]:
    given = [k for k in ("text", "tokens", "messages") if getattr(c, k) is not None]
    if len(given) > 1:
        raise ApiError(400, f"give one of text, tokens, messages, not {' and '.join(given)}")
    if c.tokens is not None:
        n_vocab = lm.model.tokenizer.vocab_size
        bad = [t for t in c.tokens if not 0 <= t < n_vocab]
        if bad:
            raise ApiError(400, f"token id {bad[0]} is outside the vocabulary")
        return list(c.tokens)
    if c.messages is not None:
        _no_images(c.messages)
        text = lm.model.tokenizer.apply_chat_template(
            c.messages, add_generation_prompt=c.add_generation_prompt
        )
    else:
        text = c.text or ""
    return lm.model.tokenize(text, add_special=first, parse_special=True)


def _no_images(messages: list[dict[str, Any]]) -> None:
    """Refuse image parts: a context is token ids (images' placeholder ids and embeddings
    are not kept with it, so its K/V could not be recomputed, restored or forked
    faithfully); a template would render the part as text."""
    for i, m in enumerate(messages):
        parts = m.get("content") if isinstance(m, dict) else None
        for part in parts if isinstance(parts, list) else ():
            if isinstance(part, dict) and part.get("type") not in ("text", None):
                raise ApiError(
                    400,
                    f"messages.{i}.content: contexts take text only, not {part.get('type')!r} "
                    "parts; send images to /v1/chat/completions, /completion or /api/chat",
                    param=f"messages.{i}.content",
                )


def _view(lm_or_none, ctx: Ctx) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": ctx.id,
        "object": "context",
        "model": ctx.model,
        "n_tokens": len(ctx.tokens),
        "kv_tokens": 0 if ctx.kv is None else len(ctx.kv.tokens),
        "tokens": ctx.tokens,
    }
    if lm_or_none is not None:
        out["text"] = lm_or_none.model.detokenize(ctx.tokens)
    return out


def _get_ctx(st: ServerState, cid: str) -> Ctx:
    expire_contexts(st)
    ctx = _contexts(st).get(cid)
    if ctx is None:
        raise not_found(f"context {cid!r} does not exist (or expired)")
    ctx.last_used = time.monotonic()
    return ctx


@router.post("/v1/contexts", summary="Create a context")
async def create(body: CreateContext, request: Request):
    st = state(request)
    _room_for(st, 1)
    if body.snapshot is not None:
        path = _snapshot_path(body.snapshot)
        if not path.is_file():
            raise not_found(f"snapshot {body.snapshot!r} does not exist")
        saved = json.loads(path.read_text())
        lm = await st.models.get(body.model or saved["model"])
        tokens = list(saved["tokens"]) + (
            await off_loop(_tokens_of, lm, body, False)
            if any(getattr(body, k) is not None for k in ("text", "tokens", "messages"))
            else []
        )
        ctx = Ctx(lm.name, tokens)
        if saved.get("kv") and kept.supports_kv(lm.engine):
            try:
                ctx.restore_from = await asyncio.get_running_loop().run_in_executor(
                    None, load_snapshot, saved["kv"]
                )
            except SnapshotError:
                pass  # its KV left the store: the tokens are computed again
    else:
        lm = await st.models.get(body.model)
        ctx = Ctx(lm.name, await off_loop(_tokens_of, lm, body, True))
    await _ensure_kv(lm, ctx)
    _contexts(st)[ctx.id] = ctx
    return _view(lm, ctx)


@router.get("/v1/contexts", summary="List contexts")
async def list_contexts(request: Request):
    st = state(request)
    expire_contexts(st)
    return {
        "object": "list",
        "data": [
            {
                "id": c.id,
                "model": c.model,
                "n_tokens": len(c.tokens),
                "kv_tokens": 0 if c.kv is None else len(c.kv.tokens),
            }
            for c in _contexts(st).values()
        ],
    }


@router.get("/v1/contexts/{cid}", summary="Show a context")
async def show(cid: str, request: Request):
    st = state(request)
    ctx = _get_ctx(st, cid)
    return _view(await st.models.get(ctx.model), ctx)


@router.delete("/v1/contexts/{cid}", summary="Delete a context")
async def delete(cid: str, request: Request):
    st = state(request)
    ctx = _get_ctx(st, cid)
    _busy(ctx)
    del _contexts(st)[cid]
    ctx.drop_kv()
    return Response(status_code=204)


@router.post("/v1/contexts/{cid}/append", summary="Append text, tokens or messages")
async def append(cid: str, body: Content, request: Request):
    st = state(request)
    ctx = _get_ctx(st, cid)
    _busy(ctx)
    lm = await st.models.get(ctx.model)
    before = ctx.tokens
    ctx.tokens = ctx.tokens + await off_loop(_tokens_of, lm, body, not ctx.tokens)
    try:
        await _ensure_kv(lm, ctx)
    except BaseException:
        ctx.tokens = before  # a failed append (say, past the context) changes nothing
        raise
    return _view(lm, ctx)


@router.post("/v1/contexts/{cid}/generate", summary="Generate from a context (appends)")
async def generate(cid: str, body: Generate, request: Request):
    st = state(request)
    ctx = _get_ctx(st, cid)
    _busy(ctx)
    lm = await st.models.get(ctx.model)
    sampler = make_sampler(**{k: getattr(body, k) for k in _SAMPLING})
    await _ensure_kv(lm, ctx)
    keeps = kept.supports_kv(lm.engine)
    base = ctx.kv.share() if ctx.kv is not None else None

    async def start(r):
        return await kept.start(lm.engine, r, base)

    g = st.textgen(
        lm, ctx.tokens, body.max_tokens, sampler, body.stop, start=start if keeps else None
    )
    ctx.busy = True
    settled = False

    def settle(complete: bool) -> None:
        """Once, when the generation ends: append what it made, and keep its KV when the
        engine kept exactly that (else let go of whatever the engine kept)."""
        nonlocal settled
        if settled:
            return
        settled, ctx.busy, ctx.last_used = True, False, time.monotonic()
        h = g.handle
        tokens = ctx.tokens + g.token_ids
        if keeps and h is not None:
            exact = (
                complete
                and g.stop_sequence is None
                and h.finish_reason in ("stop", "length")
                and h.usage.completion_tokens == len(g.token_ids)
            )
            if exact:
                ctx.drop_kv()
                ctx.kv = kept.Kept(lm.engine, h, tokens)
            else:
                asyncio.get_running_loop().create_task(kept.discard(lm.engine, h))
        if base is not None:
            base.drop()
        if complete:
            ctx.tokens = tokens

    def done() -> dict[str, Any]:
        settle(True)
        return {
            "id": ctx.id,
            "finish_reason": g.finish_reason,
            "n_tokens": len(ctx.tokens),
            "usage": {**g.usage(), "cached_tokens": g.cached_tokens},
            "tokens": g.token_ids,
        }

    if not body.stream:
        try:
            text = await g.collect(request)
            return {**done(), "text": text}
        finally:
            settle(False)

    async def events():
        try:
            async for delta in g.stream():
                yield sse({"text": delta})
            yield sse({**done(), "done": True})
        finally:
            settle(False)

    try:
        body_iter = await primed(events())
    except BaseException:
        settle(False)
        raise
    return sse_response(body_iter, "openai")


@router.post("/v1/contexts/{cid}/fork", summary="Fork a context into n copies")
async def fork(cid: str, body: Fork, request: Request):
    st = state(request)
    ctx = _get_ctx(st, cid)
    _busy(ctx)
    _room_for(st, body.n)
    await _ensure_kv(await st.models.get(ctx.model), ctx)
    out = []
    for _ in range(body.n):
        # the children share the parent's kept KV; each continuation forks it in the engine
        c = Ctx(ctx.model, list(ctx.tokens), None if ctx.kv is None else ctx.kv.share())
        _contexts(st)[c.id] = c
        out.append({"id": c.id, "model": c.model, "n_tokens": len(c.tokens)})
    return {"object": "list", "data": out}


def _snapshot_path(name: str):
    if not _SNAPSHOT_NAME.fullmatch(name):  # .match lets "name\n" through (`$`)
        raise ApiError(400, f"snapshot name {name!r} must be letters, digits, '_', '.', '-'")
    return _snapshot_dir() / f"{name}.json"


def _kv_in_use(directory, but=None) -> set[str]:
    """The KV digests the named snapshots (but `but`) refer to."""
    out = set()
    for p in directory.glob("*.json"):
        if p == but:
            continue
        try:
            out.add(json.loads(p.read_text()).get("kv"))
        except (ValueError, OSError, AttributeError):
            continue
    return out


@router.post("/v1/contexts/{cid}/snapshot", summary="Save a context as a named snapshot")
async def snapshot(cid: str, body: Snapshot, request: Request):
    from llamay.files import atomic_write_json

    st = state(request)
    ctx = _get_ctx(st, cid)
    _busy(ctx)
    name = body.name or ctx.id
    path = _snapshot_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    saved: dict[str, Any] = {"model": ctx.model, "tokens": ctx.tokens}
    await _ensure_kv(await st.models.get(ctx.model), ctx)
    if ctx.kv is not None:
        snap = await kept.snapshot_of(ctx.kv)
        # into the store's KV snapshots (content-addressed: one file per sequence)
        digest = await asyncio.get_running_loop().run_in_executor(None, store_snapshot, snap)
        saved.update(kv=digest, kv_tokens=snap.n_cached)
    atomic_write_json(path, saved)
    return {
        "name": name,
        "model": ctx.model,
        "n_tokens": len(ctx.tokens),
        "kv_tokens": saved.get("kv_tokens", 0),
    }


@router.get("/v1/snapshots", summary="List saved snapshots")
async def snapshots():
    d = _snapshot_dir()
    out = []
    for p in sorted(d.glob("*.json")) if d.is_dir() else []:
        try:
            saved = json.loads(p.read_text())
            out.append({"name": p.stem, "model": saved["model"], "n_tokens": len(saved["tokens"])})
        except (ValueError, KeyError, OSError):
            continue
    return {"object": "list", "data": out}


@router.delete("/v1/snapshots/{name}", summary="Delete a saved snapshot")
async def delete_snapshot(name: str):
    path = _snapshot_path(name)
    if not path.is_file():
        raise not_found(f"snapshot {name!r} does not exist")
    kv = json.loads(path.read_text()).get("kv")
    if kv and kv not in _kv_in_use(path.parent, but=path):
        # the store's KV file of a snapshot no other name uses goes too
        (snapshot_dir() / (kv.removeprefix("sha256:") + ".kv.npz")).unlink(missing_ok=True)
    path.unlink()
    return Response(status_code=204)
