"""Anthropic's Messages API: /v1/messages (streaming with the real event sequence) and
/v1/messages/count_tokens."""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import Field

from llamay.serve import tools as T
from llamay.serve import vision as V
from llamay.serve.core import (
    EventStream,
    OpenModel,
    TextGen,
    guarded,
    off_loop,
    sse,
)
from llamay.serve.errors import ApiError, error_body, to_http_status
from llamay.serve.models import Loaded
from llamay.serve.sampling import extra_params, llama_constraint, make_sampler
from llamay.serve.state import ServerState, state

router = APIRouter(tags=["Anthropic"])


class Message(OpenModel):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class Tool(OpenModel):
    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})


class CountTokensRequest(OpenModel):
    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[Tool] | None = None
    tool_choice: dict[str, Any] | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    stream: bool = False
    metadata: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None


def _text(blocks: str | list[dict[str, Any]] | None, where: str) -> str:
    if blocks is None or isinstance(blocks, str):
        return blocks or ""
    parts = []
    for b in blocks:
        if b.get("type") != "text":
            raise ApiError(
                400, f"{where}: content blocks of type {b.get('type')!r} are not supported here"
            )
        parts.append(str(b.get("text", "")))
    return "".join(parts)


def _image_block(b: dict, where: str) -> bytes:
    """An image block's bytes: `source` base64 data, or a data: URL (http(s) refused)."""
    src = b.get("source") or {}
    if src.get("type") == "base64":
        return V.decode_base64(str(src.get("data", "")), where)
    if src.get("type") == "url":
        return V.url_bytes(src.get("url"), where)
    raise ApiError(400, f"{where}: an image source must be base64 (or a data: URL)")


def _messages(body: CountTokensRequest, images: list[bytes] | None = None) -> list[dict]:
    """The messages for the template; image blocks (with `images` given) become mtmd's
    `<__media__>` markers where they are, their bytes appended to `images`."""
    out: list[dict] = []
    if body.system:
        out.append({"role": "system", "content": _text(body.system, "system")})
    for i, m in enumerate(body.messages):
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
            continue
        text, calls = [], []
        for b in m.content:
            kind = b.get("type")
            if kind == "text":
                text.append(str(b.get("text", "")))
            elif kind == "image" and images is not None and m.role == "user":
                images.append(_image_block(b, f"messages.{i}.image"))
                text.append(V.MEDIA_MARKER)
            elif kind in ("thinking", "redacted_thinking") and m.role == "assistant":
                continue  # earlier turns' reasoning stays out of the prompt, as Anthropic's
            elif kind == "tool_use" and m.role == "assistant":
                if not isinstance(b.get("input", {}), dict):
                    raise ApiError(400, f"messages.{i}: a tool_use block's input must be an object")
                call = {
                    "id": b.get("id"),
                    "function": {"name": b.get("name"), "arguments": b.get("input") or {}},
                }
                calls.append(T.history_call(call, f"messages.{i}.tool_use"))
            elif kind == "tool_result" and m.role == "user":
                if not isinstance(b.get("tool_use_id"), str):
                    raise ApiError(400, f"messages.{i}: tool_result needs a string tool_use_id")
                content = b.get("content")
                content = content if isinstance(content, str) else _text(content, "tool_result")
                out.append(
                    {"role": "tool", "tool_call_id": b.get("tool_use_id"), "content": content}
                )
            else:
                raise ApiError(
                    400, f"messages.{i}: content blocks of type {kind!r} are not supported here"
                )
        if text or calls:
            msg: dict[str, Any] = {"role": m.role, "content": "".join(text)}
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
    out = _merged(out)
    # a final assistant message is a prefill the reply continues (`T.prefill_split`);
    # Anthropic refuses one ending in whitespace (a token boundary the model would not make)
    _, prefill = T.prefill_split(out)
    if prefill and prefill != prefill.rstrip():
        raise ApiError(400, "messages: final assistant content cannot end with trailing whitespace")
    return out


def _merged(msgs: list[dict]) -> list[dict]:
    """Consecutive user (or assistant) turns as one, as Anthropic combines them (a chat
    template may insist that turns alternate); an assistant turn's calls end it."""
    out: list[dict] = []
    for m in msgs:
        last = out[-1] if out else None
        if last and last["role"] == m["role"] in ("user", "assistant") and "tool_calls" not in last:
            last["content"] = "\n\n".join(x for x in (last["content"], m["content"]) if x)
            if "tool_calls" in m:
                last["tool_calls"] = m["tool_calls"]
        else:
            out.append(dict(m))
    return out


def _plan(body: CountTokensRequest):
    """(tools for the template, the functions a call is forced among or None)."""
    if not body.tools:
        return None, None
    functions = [
        {"name": t.name, "description": t.description or "", "parameters": t.input_schema}
        for t in body.tools
    ]
    tools = [{"type": "function", "function": f} for f in functions]
    choice = body.tool_choice or {"type": "auto"}
    kind = choice.get("type")
    if kind == "none":
        return None, None
    if kind == "auto":
        return tools, None
    if kind == "any":
        return tools, functions
    if kind == "tool":
        return tools, T.pick(functions, choice.get("name"))
    raise ApiError(400, f"tool_choice type {kind!r} is not auto, any, tool or none")


async def _prompt(lm: Loaded, body: CountTokensRequest):
    """(prompt ids, how an image prompt starts or None, tools for the template, the
    functions a call is forced among or None): image blocks as mtmd lays them out
    (llamay.serve.vision)."""
    tools, forced = _plan(body)
    images: list[bytes] = []
    msgs = _messages(body, images)
    if not images:
        return await off_loop(T.chat_ids, lm, msgs, tools), None, tools, forced
    text = await off_loop(T.render_prompt, lm, msgs, tools)
    ids, start = await off_loop(V.image_prompt, lm, text, images)
    return ids, start, tools, forced


_REASONS = {"length": "max_tokens", "stop": "end_turn", "cancelled": "end_turn"}


def _stop_reason(g: TextGen) -> str:
    if g.stop_sequence is not None:
        return "stop_sequence"
    if g.finish_reason == "length" and g.prompt_tokens + g.completion_tokens >= g.lm.model.n_ctx:
        return "model_context_window_exceeded"  # the context filled before max_tokens
    return _REASONS.get(g.finish_reason or "stop", "end_turn")


def _blocks(text: str, forced, names: set[str]) -> list[dict]:
    """A reply's content blocks: its text, or the text beside its tool calls (if any)
    then a tool_use block a call."""
    calls = T.calls_in(text, forced, names)
    if not calls:
        return [{"type": "text", "text": text}]
    beside = "" if forced is not None else T.text_around_calls(text)
    uses = [
        {"type": "tool_use", "id": T.call_id("toolu_"), "name": c["name"], "input": c["arguments"]}
        for c in calls
    ]
    return ([{"type": "text", "text": beside}] if beside else []) + uses


def _check_thinking(thinking: Any, max_tokens: int) -> None:
    """Anthropic's `thinking` setting, checked as its API does. The models served here
    write no separate reasoning, so an enabled budget produces no thinking blocks (the
    answer is the text blocks, as from a model that thought briefly)."""
    if thinking is None:
        return
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind in ("disabled", "adaptive", "between_tools"):
        return  # adaptive: the model decides whether to think (the client's types' kinds)
    if kind != "enabled":
        raise ApiError(
            400, 'thinking.type must be "enabled", "adaptive", "between_tools" or "disabled"'
        )
    budget = thinking.get("budget_tokens")
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1024:
        raise ApiError(400, "thinking.budget_tokens must be an integer >= 1024")
    if budget >= max_tokens:
        raise ApiError(400, "thinking.budget_tokens must be less than max_tokens")


@router.post("/v1/messages", summary="Create a message (Anthropic)")
async def messages(body: MessagesRequest, request: Request):
    st: ServerState = state(request)
    _check_thinking((body.model_extra or {}).get("thinking"), body.max_tokens)
    lm = await st.models.get(body.model, lenient=True)
    ids, start, tools, forced = await _prompt(lm, body)
    names = {t["function"]["name"] for t in tools or []}
    con = None
    if forced is not None:
        con = await st.constraint(lm, json_schema=T.call_schema(forced))
    elif (fmt := (body.output_config or {}).get("format")) is not None:
        if (
            not isinstance(fmt, dict)
            or fmt.get("type") != "json_schema"
            or not isinstance(fmt.get("schema"), dict)
        ):
            raise ApiError(
                400, 'output_config.format must be {"type": "json_schema", "schema": {...}}'
            )
        con = await st.constraint(lm, json_schema=fmt["schema"])
    elif ckw := llama_constraint(body.model_extra):  # llama-server's grammar / json_schema
        con = await st.constraint(lm, **ckw)
    sampler = make_sampler(
        **extra_params(body.model_extra),
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
    )
    g = st.textgen(lm, ids, body.max_tokens, sampler, body.stop_sequences, con, start=start)
    mid = f"msg_{uuid.uuid4().hex[:24]}"

    def message(content: list[dict], stop_reason: str | None, out_tokens: int) -> dict:
        return {
            "id": mid,
            "type": "message",
            "role": "assistant",
            "model": lm.name,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": g.stop_sequence,
            "usage": {**usage(), "output_tokens": out_tokens},
        }

    def usage() -> dict:
        # Anthropic's input_tokens leave out the cache reads (the prompt is their sum),
        # as llama-server's: n_prompt_tokens - n_prompt_tokens_cache
        return {
            "input_tokens": g.prompt_tokens - g.cached_tokens,
            "cache_read_input_tokens": g.cached_tokens,
            "cache_creation_input_tokens": 0,
        }

    if not body.stream:
        text = await g.collect(request)
        blocks = _blocks(text, forced, names)
        used = blocks[-1]["type"] == "tool_use" and g.finish_reason != "length"
        reason = "tool_use" if used else _stop_reason(g)
        return message(blocks, reason, g.completion_tokens)

    def ev(obj: dict) -> str:
        return sse(obj, event=obj["type"])

    def block_start(i: int, block: dict) -> str:
        return ev({"type": "content_block_start", "index": i, "content_block": block})

    def text_delta(i: int, text: str) -> str:
        return ev(
            {
                "type": "content_block_delta",
                "index": i,
                "delta": {"type": "text_delta", "text": text},
            }
        )

    def json_delta(i: int, piece: str) -> str:
        return ev(
            {
                "type": "content_block_delta",
                "index": i,
                "delta": {"type": "input_json_delta", "partial_json": piece},
            }
        )

    called: list[str] = []  # the tools the streamed answer calls

    def tool_start(i: int, name: str) -> str:
        called.append(name)
        return block_start(
            i, {"type": "tool_use", "id": T.call_id("toolu_"), "name": name, "input": {}}
        )

    async def forced_call():
        """The enforced call as it is generated: its block opens once the name is known,
        the arguments follow as input_json_delta pieces."""
        call = T.ForcedCallStream(T.sole_name(forced))
        yield ev({"type": "ping"})
        async for delta in g.stream():
            name, piece = call.feed(delta)
            if name is not None:
                yield tool_start(0, name)
            if piece:
                yield json_delta(0, piece)
        whole = call.finish()
        if call.name is None:  # keys in another order: nothing streamed, send it whole
            yield tool_start(0, whole["name"])
            yield json_delta(0, json.dumps(whole["arguments"]))
        yield ev({"type": "content_block_stop", "index": 0})

    async def answer():
        """Text as it comes; with tools, from where a tool call begins the answer is held
        back and sent as its blocks once whole (after the text block, if one streamed)."""
        auto = T.AutoCalls(names)
        opened = not names  # without tools the text block opens at once, as Anthropic's does
        if opened:
            yield block_start(0, {"type": "text", "text": ""})
        yield ev({"type": "ping"})

        async def text(out: str):
            nonlocal opened
            if not opened:
                yield block_start(0, {"type": "text", "text": ""})
                opened = True
            yield text_delta(0, out)

        async for delta in g.stream():
            if out := auto.feed(delta):
                async for e in text(out):
                    yield e
        pieces = [auto.flush()]
        calls = T.parse_calls(auto.held, names) if auto.holding else None
        if not calls:  # no call after all: what was held is text too
            pieces.append(auto.held)
        for out in filter(None, pieces):
            async for e in text(out):
                yield e
        if not calls:
            if not opened:
                yield block_start(0, {"type": "text", "text": ""})
            yield ev({"type": "content_block_stop", "index": 0})
            return
        i = 0
        if opened:
            yield ev({"type": "content_block_stop", "index": 0})
            i = 1
        for b in _blocks(auto.held, None, names):
            if b["type"] == "tool_use":
                yield tool_start(i, b["name"])
                yield json_delta(i, json.dumps(b["input"]))
            else:
                yield block_start(i, {"type": "text", "text": ""})
                yield text_delta(i, b["text"])
            yield ev({"type": "content_block_stop", "index": i})
            i += 1

    async def events():
        yield ev({"type": "message_start", "message": message([], None, 0)})
        async for e in forced_call() if forced is not None else answer():
            yield e
        yield ev(
            {
                "type": "message_delta",
                "delta": {
                    "stop_reason": "tool_use"
                    if called and g.finish_reason != "length"
                    else _stop_reason(g),
                    "stop_sequence": g.stop_sequence,
                },
                # cumulative, as Anthropic's: the cache reads are known by now
                "usage": {**usage(), "output_tokens": g.completion_tokens},
            }
        )
        yield ev({"type": "message_stop"})

    def on_error(exc: Exception) -> str:
        body = error_body("anthropic", to_http_status(exc), str(exc))
        return sse(body, event="error")

    return EventStream(guarded(events(), on_error), media_type="text/event-stream")


@router.post("/v1/messages/count_tokens", summary="Count a request's input tokens (Anthropic)")
async def count_tokens(body: CountTokensRequest, request: Request):
    st: ServerState = state(request)
    lm = await st.models.get(body.model, lenient=True)
    ids, _, _, _ = await _prompt(lm, body)  # images counted as /v1/messages counts them
    return {"input_tokens": len(ids)}
