"""OpenAI's Responses API: POST /v1/responses (non-streaming and the typed event stream).

Input items (messages, function calls and their outputs) become chat messages for the
model's template; function tools are offered through it, and a forced tool choice is a
JSON-schema constraint on the call. Responses are stored (unless `store: false`) for
`previous_response_id`, retrieve and delete: `llamay.serve.stored_responses`.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from fastapi import APIRouter, Request
from pydantic import Field

from llamay.serve import tools as T
from llamay.serve.core import OpenModel, off_loop, primed, sse, sse_response
from llamay.serve.errors import ApiError
from llamay.serve.logprobs import chat_logprobs
from llamay.serve.sampling import extra_params, llama_constraint, make_sampler
from llamay.serve.state import ServerState, state
from llamay.serve.stored_responses import (
    input_items,
    output_messages,
    previous,
    resolve_references,
    response_store,
)
from llamay.serve.stored_responses import router as stored_router

router = APIRouter(tags=["OpenAI"])
router.include_router(stored_router)  # GET and DELETE /v1/responses/{id}


class ResponsesRequest(OpenModel):
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stream: bool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    previous_response_id: str | None = None
    store: bool | None = None
    metadata: dict[str, Any] | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    include: list[str] | None = None
    parallel_tool_calls: bool | None = None


#: The `include` value that asks for the output text's log-probabilities.
LOGPROBS = "message.output_text.logprobs"


_ROLES = ("user", "assistant", "system", "developer")


def _item_text(content: Any, where: str) -> str:
    """The text of an input item's content: a string, or a list of text parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(400, f"{where} must be a string or a list of text parts", param="input")
    parts = []
    for j, p in enumerate(content):
        if not isinstance(p, dict) or p.get("type") not in ("input_text", "output_text", "text"):
            kind = p.get("type") if isinstance(p, dict) else type(p).__name__
            raise ApiError(
                400,
                f"{where}.{j}: content of type {kind!r} is not supported (text only)",
                param="input",
            )
        if not isinstance(p.get("text", ""), str):
            raise ApiError(400, f"{where}.{j}.text must be a string", param="input")
        parts.append(p.get("text", ""))
    return "".join(parts)


def _responses_messages(body: ResponsesRequest) -> list[dict]:
    out: list[dict] = []
    if body.instructions:
        out.append({"role": "system", "content": body.instructions})
    if isinstance(body.input, str):
        return [*out, {"role": "user", "content": body.input}]
    for i, item in enumerate(body.input):
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role", "user")
            if role not in _ROLES:
                raise ApiError(400, f"input.{i}.role must be one of {_ROLES}", param="input")
            content = _item_text(item.get("content", ""), f"input.{i}.content")
            out.append({"role": "system" if role == "developer" else role, "content": content})
        elif kind == "function_call":
            if not isinstance(item.get("arguments", "{}"), str):
                raise ApiError(400, f"input.{i}.arguments must be a JSON string", param="input")
            call = {
                "id": item.get("call_id"),
                "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")},
            }
            call = T.history_call(call, f"input.{i}")
            out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "reasoning":
            continue  # earlier turns' reasoning stays out of the prompt (agents replay it)
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise ApiError(400, f"input.{i}.call_id must be a string", param="input")
            content = _item_text(item.get("output", ""), f"input.{i}.output")
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": content})
        else:
            raise ApiError(
                400, f"input.{i}: items of type {kind!r} are not supported", param="input"
            )
    return out


def _responses_tools(body: ResponsesRequest):
    """(tools for the template, forced functions or None)."""
    fns = []
    for t in body.tools or []:
        if t.get("type") != "function" or not t.get("name"):
            raise ApiError(
                400,
                f"tools of type {t.get('type')!r} are not supported (function tools only)",
                param="tools",
            )
        fns.append(
            {
                "name": t["name"],
                "description": t.get("description") or "",
                "parameters": t.get("parameters") or {"type": "object"},
            }
        )
    choice = body.tool_choice if body.tool_choice is not None else "auto"
    if not fns or choice == "none":
        return None, None
    tools = [{"type": "function", "function": f} for f in fns]
    if choice == "auto":
        return tools, None
    if choice == "required":
        return tools, fns
    if isinstance(choice, dict) and choice.get("type") == "function":
        return tools, T.pick(fns, choice.get("name"))
    raise ApiError(400, f"tool_choice {choice!r} is not supported", param="tool_choice")


@router.post("/v1/responses", summary="Create a model response (OpenAI Responses API)")
@router.post("/responses", include_in_schema=False)
async def responses(body: ResponsesRequest, request: Request):
    st: ServerState = state(request)
    lm = await st.models.get(body.model, lenient=True)
    body.input = resolve_references(st, body.input)
    tools, forced = _responses_tools(body)
    names = {t["function"]["name"] for t in tools or []}
    # The conversation: a previous response's turns (without its instructions, as OpenAI
    # documents), then this input; this request's instructions lead.
    messages = _responses_messages(body)
    system, own = (messages[:1], messages[1:]) if body.instructions else ([], messages)
    history = previous(st, body.previous_response_id) if body.previous_response_id else []
    history += own
    messages = system + history
    if not history:
        raise ApiError(400, "input must hold at least one item", param="input")
    ids = await off_loop(T.chat_ids, lm, messages, tools)
    fmt = (body.text or {}).get("format") or {}
    if forced is not None:
        ckw: dict[str, Any] = {"json_schema": T.call_schema(forced)}
    elif fmt.get("type") == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise ApiError(400, "text.format.schema must be a JSON schema object", param="text")
        ckw = {"json_schema": fmt["schema"]}
    elif fmt.get("type") == "json_object":
        ckw = {"json": True}
    elif fmt.get("type") in (None, "text"):
        ckw = llama_constraint(body.model_extra)  # llama-server's grammar / json_schema
    else:
        raise ApiError(400, f"text.format type {fmt.get('type')!r} is not supported", param="text")
    con = await st.constraint(lm, **ckw) if ckw else None
    sampler = make_sampler(
        **extra_params(body.model_extra), temperature=body.temperature, top_p=body.top_p
    )
    g = st.textgen(lm, ids, body.max_output_tokens, sampler, None, con)
    with_logprobs = LOGPROBS in (body.include or [])
    g.logprobs = (body.top_logprobs or 0) if with_logprobs else None

    def logprobs(rows) -> list[dict]:
        return chat_logprobs(lm, rows)["content"] if with_logprobs else []

    rid, mid = f"resp_{uuid.uuid4().hex}", f"msg_{uuid.uuid4().hex}"
    created = int(time.time())
    parallel = body.parallel_tool_calls is not False  # false: at most one call

    def output_items(text: str) -> list[dict]:
        """The reply's items: its message, or the text beside its calls (if any) as a
        message and then a function_call item a call."""
        calls = T.calls_in(text, forced, names, parallel)
        if not calls:
            return [message_item(text, logprobs(g.logprob_rows()))]
        beside = "" if forced is not None else T.text_around_calls(text)
        return ([message_item(beside, [])] if beside else []) + [
            {
                "type": "function_call",
                "id": f"fc_{uuid.uuid4().hex[:24]}",
                "call_id": T.call_id(),
                "name": c["name"],
                "arguments": T.forced_arguments(text)
                if forced is not None
                else json.dumps(c["arguments"]),
                "status": item_status(),
            }
            for c in calls
        ]

    def item_status() -> str:
        """An output item's status: incomplete when the reply was cut (max_output_tokens)."""
        return "incomplete" if g.finish_reason == "length" else "completed"

    def message_item(text: str, rows: list[dict]) -> dict:
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": rows}
        return {
            "type": "message",
            "id": mid,
            "status": item_status(),
            "role": "assistant",
            "content": [part],
        }

    def response(status: str, output: list[dict]) -> dict:
        incomplete = g.finish_reason == "length" and status != "in_progress"
        return {
            "id": rid,
            "object": "response",
            "created_at": created,
            "status": "incomplete" if incomplete else status,
            "model": lm.name,
            "output": output,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            # OpenAI's default; the calls a reply makes are read off its text either way
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "temperature": body.temperature,
            "top_p": body.top_p,
            "tool_choice": body.tool_choice or "auto",
            "tools": body.tools or [],
            "text": body.text or {"format": {"type": "text"}},
            "metadata": body.metadata or {},
            "previous_response_id": body.previous_response_id,
            "store": body.store is not False,
            "usage": None
            if status == "in_progress"
            else {
                "input_tokens": g.prompt_tokens,
                "output_tokens": g.completion_tokens,
                "total_tokens": g.prompt_tokens + g.completion_tokens,
                "input_tokens_details": {
                    "cached_tokens": g.cached_tokens,
                    # the rest was computed and entered the prefix cache
                    "cache_write_tokens": g.prompt_tokens - g.cached_tokens,
                },
                "output_tokens_details": {"reasoning_tokens": 0},
            },
        }

    def finished(status: str, items: list[dict]) -> dict:
        """The final response object, stored (unless `store: false`) with its turn."""
        out = response(status, items)
        if body.store is not False:
            history_out = history + output_messages(items)
            response_store(st).put(out, history_out, input_items(body.input))
        return out

    if not body.stream:
        text = await g.collect(request)
        return finished("completed", output_items(text))

    seq = iter(range(1 << 30))

    def ev(obj: dict) -> str:
        return sse({**obj, "sequence_number": next(seq)}, event=obj["type"])

    async def forced_call():
        """The enforced call as it is generated: its item once the name is complete, then
        the arguments as function_call_arguments.delta events."""
        call, item = T.ForcedCallStream(T.sole_name(forced)), None

        def added(name: str) -> tuple[dict, str]:
            it = {
                "type": "function_call",
                "id": f"fc_{uuid.uuid4().hex[:24]}",
                "call_id": T.call_id(),
                "name": name,
                "arguments": "",
                "status": "in_progress",
            }
            return it, ev({"type": "response.output_item.added", "output_index": 0, "item": it})

        def args_delta(piece: str) -> str:
            return ev(
                {
                    "type": "response.function_call_arguments.delta",
                    "item_id": item["id"],
                    "output_index": 0,
                    "delta": piece,
                }
            )

        async for delta in g.stream():
            name, piece = call.feed(delta)
            if name is not None:
                item, e = added(name)
                yield e
            if piece:
                yield args_delta(piece)
        whole = call.finish()
        args = T.forced_arguments(call.text)
        if item is None:  # keys in another order: nothing streamed yet
            item, e = added(whole["name"])
            yield e
            yield args_delta(args)
        yield ev(
            {
                "type": "response.function_call_arguments.done",
                "item_id": item["id"],
                "output_index": 0,
                "arguments": args,
            }
        )
        item = {**item, "arguments": args, "status": item_status()}
        yield ev({"type": "response.output_item.done", "output_index": 0, "item": item})
        done = "response.incomplete" if g.finish_reason == "length" else "response.completed"
        yield ev({"type": done, "response": finished("completed", [item])})

    async def events():
        yield ev({"type": "response.created", "response": response("in_progress", [])})
        yield ev({"type": "response.in_progress", "response": response("in_progress", [])})
        if forced is not None:
            async for e in forced_call():
                yield e
            return
        async for e in answer():
            yield e

    async def answer():
        """The text as it comes in a message item; with tools, from where a call begins
        the reply is held back, then each call is a function_call item."""
        auto, opened, streamed = T.AutoCalls(names), False, []

        def text_events(piece: str, rows) -> list[str]:
            nonlocal opened
            out = []
            if not opened:
                opened = True
                empty = {**message_item("", []), "status": "in_progress", "content": []}
                part = {"type": "output_text", "text": "", "annotations": []}
                out.append(ev({"type": "response.output_item.added", "output_index": 0,
                               "item": empty}))  # fmt: skip
                out.append(ev({"type": "response.content_part.added", "item_id": mid,
                               "output_index": 0, "content_index": 0, "part": part}))  # fmt: skip
            if not piece:  # an empty reply: the item opens and closes empty
                return out
            streamed.append(piece)
            out.append(ev({"type": "response.output_text.delta", "item_id": mid,
                           "output_index": 0, "content_index": 0, "delta": piece,
                           "logprobs": logprobs(rows)}))  # fmt: skip
            return out

        async for delta in g.stream():
            if out := auto.feed(delta):
                for e in text_events(out, g.take_logprobs()):
                    yield e
        calls = T.parse_calls(auto.held, names, parallel) if auto.holding else None
        rest = auto.flush() + ("" if calls else auto.held)  # no call after all: text too
        if rest or not (opened or calls):
            for e in text_events(rest, g.take_logprobs()):
                yield e
        items = []
        if opened:
            text = "".join(streamed)
            rows = logprobs(g.logprob_rows()) if not calls else []
            part = {"type": "output_text", "text": text, "annotations": []}
            yield ev({"type": "response.output_text.done", "item_id": mid, "output_index": 0,
                      "content_index": 0, "text": text, "logprobs": rows})  # fmt: skip
            yield ev({"type": "response.content_part.done", "item_id": mid, "output_index": 0,
                      "content_index": 0, "part": part})  # fmt: skip
            items.append(message_item(text, rows))
            yield ev({"type": "response.output_item.done", "output_index": 0, "item": items[0]})
        for c in calls or []:
            i, args = len(items), json.dumps(c["arguments"])
            item = {"type": "function_call", "id": f"fc_{uuid.uuid4().hex[:24]}",
                    "call_id": T.call_id(), "name": c["name"], "arguments": "",
                    "status": "in_progress"}  # fmt: skip
            yield ev({"type": "response.output_item.added", "output_index": i, "item": item})
            yield ev({"type": "response.function_call_arguments.delta", "item_id": item["id"],
                      "output_index": i, "delta": args})  # fmt: skip
            yield ev({"type": "response.function_call_arguments.done", "item_id": item["id"],
                      "output_index": i, "arguments": args})  # fmt: skip
            items.append({**item, "arguments": args, "status": item_status()})
            yield ev({"type": "response.output_item.done", "output_index": i, "item": items[-1]})
        done = "response.incomplete" if g.finish_reason == "length" else "response.completed"
        yield ev({"type": done, "response": finished("completed", items)})

    return sse_response(await primed(events()), "openai")
