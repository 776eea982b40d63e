"""Stored responses of OpenAI's Responses API: `store` (on by default, as OpenAI's), a
later request's `previous_response_id`, `GET /v1/responses/{id}`
(`client.responses.retrieve`), `GET /v1/responses/{id}/input_items`
(`client.responses.input_items.list`), `DELETE /v1/responses/{id}`, and input items of
type `item_reference` (an earlier input or output item, by its id).

A stored response keeps its object (what retrieve returns) and the conversation it ended
(its input and history as chat messages, then its output), so a request naming it as
`previous_response_id` continues that conversation; as OpenAI documents, the earlier
`instructions` are not carried over. The store is in memory and bounded like contexts:
at most `MAX_STORED` responses (the least recently used go first) and each forgotten
after the server's context TTL unused.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import APIRouter, Query, Request

from llamay.serve import tools as T
from llamay.serve.errors import ApiError, not_found
from llamay.serve.state import ServerState, state

router = APIRouter(tags=["OpenAI"])

#: The most responses kept at once.
MAX_STORED = 256


@dataclass
class Stored:
    response: dict[str, Any]
    #: the conversation up to and including this response's output, as chat messages
    history: list[dict[str, Any]]
    #: the request's own input, as the API's input items (with ids)
    inputs: list[dict[str, Any]] = field(default_factory=list)
    used: float = field(default_factory=time.monotonic)


class ResponseStore:
    """Responses by id, least recently used first; bounded in number and idle time."""

    def __init__(self, max_items: int = MAX_STORED, ttl_s: float = 1800.0):
        self.max_items, self.ttl_s = max_items, ttl_s
        self._items: OrderedDict[str, Stored] = OrderedDict()

    def _expire(self) -> None:
        now = time.monotonic()
        while self._items:
            rid, item = next(iter(self._items.items()))
            if now - item.used <= self.ttl_s:
                break
            del self._items[rid]

    def put(
        self,
        response: dict[str, Any],
        history: list[dict[str, Any]],
        inputs: list[dict[str, Any]] | None = None,
    ) -> None:
        self._expire()
        self._items[response["id"]] = Stored(response, history, inputs or [])
        self._items.move_to_end(response["id"])
        while len(self._items) > self.max_items:
            self._items.popitem(last=False)

    def get(self, rid: str) -> Stored | None:
        self._expire()
        item = self._items.get(rid)
        if item is not None:
            item.used = time.monotonic()
            self._items.move_to_end(rid)
        return item

    def item(self, item_id: str) -> dict[str, Any] | None:
        """The input or output item with this id in any stored response (newest first)."""
        self._expire()
        for stored in reversed(self._items.values()):
            for it in (*stored.inputs, *stored.response.get("output", [])):
                if it.get("id") == item_id:
                    return it
        return None

    def delete(self, rid: str) -> bool:
        self._expire()
        return self._items.pop(rid, None) is not None

    def __len__(self) -> int:
        self._expire()
        return len(self._items)


def response_store(st: ServerState) -> ResponseStore:
    store = st.extra.get("responses")
    if store is None:
        store = st.extra.setdefault("responses", ResponseStore(MAX_STORED, st.context_ttl_s))
    return store


def previous(st: ServerState, rid: str) -> list[dict[str, Any]]:
    """The conversation `previous_response_id` names, or a 400 saying it is unknown."""
    item = response_store(st).get(rid)
    if item is None:
        raise ApiError(
            400,
            f"previous response with id {rid!r} not found (never stored, deleted, or expired "
            f"after {st.context_ttl_s:g} s unused or beyond the {MAX_STORED} kept)",
            param="previous_response_id",
        )
    return [dict(m) for m in item.history]


def is_reference(item: Any) -> bool:
    """Whether an input item is an `item_reference` (its `type` may be left out: an item
    with an id and nothing else)."""
    if not isinstance(item, dict):
        return False
    return item.get("type") == "item_reference" or (item.keys() == {"id"})


def resolve_references(st: ServerState, given: str | list[Any]) -> str | list[Any]:
    """`input` with each `item_reference` replaced by the stored item it names (an input
    or output item of a stored response), or a 400 naming the one not found."""
    if isinstance(given, str) or not any(is_reference(it) for it in given):
        return given
    store = response_store(st)
    out = []
    for i, it in enumerate(given):
        if is_reference(it):
            found = store.item(it["id"]) if isinstance(it.get("id"), str) else None
            if found is None:
                raise ApiError(
                    400, f"input.{i}: item with id {it.get('id')!r} not found", param="input"
                )
            it = found
        out.append(it)
    return out


def output_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A response's output items as the chat messages they add to the conversation."""
    out: list[dict[str, Any]] = []
    for it in items:
        if it.get("type") == "message":
            text = "".join(p.get("text", "") for p in it.get("content", []))
            out.append({"role": "assistant", "content": text})
        elif it.get("type") == "function_call":
            if not it.get("name"):  # a call cut off before its name: nothing to replay
                continue
            fn = {"name": it["name"], "arguments": it.get("arguments", "")}
            try:
                call = T.history_call({"id": it.get("call_id"), "function": fn}, "a call")
            except ApiError:  # storing never fails the response it stores
                continue
            if out:  # one reply: its calls go with its text (the message before them)
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
    return out


def _text_parts(content: Any, kind: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        parts = [{"type": kind, "text": content}]
    else:
        parts = [{"type": kind, "text": p.get("text", "")} for p in content or []]
    if kind == "output_text":
        parts = [{**p, "annotations": []} for p in parts]
    return parts


#: OpenAI's id prefixes of input items.
_ID_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}


def input_items(given: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A request's `input` as the items `input_items` lists: messages (user, system and
    developer as input messages, assistant as output messages), function calls and their
    outputs, each with an id."""
    if isinstance(given, str):
        given = [{"type": "message", "role": "user", "content": given}]
    out = []
    for item in given:
        kind = item.get("type", "message")
        prefix = _ID_PREFIXES.get(kind, kind[:3])
        done = {"id": item.get("id") or f"{prefix}_{uuid.uuid4().hex}", "status": "completed"}
        if kind == "message":
            role = item.get("role", "user")
            text_kind = "output_text" if role == "assistant" else "input_text"
            content = _text_parts(item.get("content", ""), text_kind)
            out.append({**done, "type": "message", "role": role, "content": content})
        elif kind == "function_call":
            keys = ("call_id", "name", "arguments")
            out.append({**done, "type": kind, **{k: item.get(k, "") for k in keys}})
        elif kind == "function_call_output":
            output = item.get("output", "")
            out.append({**done, "type": kind, "call_id": item.get("call_id"), "output": output})
    return out


@router.get("/v1/responses/{response_id}", summary="Retrieve a stored model response")
@router.get("/responses/{response_id}", include_in_schema=False)
async def retrieve(response_id: str, request: Request):
    item = response_store(state(request)).get(response_id)
    if item is None:
        raise not_found(f"no response with id {response_id!r} is stored")
    return item.response


@router.get(
    "/v1/responses/{response_id}/input_items", summary="List a stored response's input items"
)
@router.get("/responses/{response_id}/input_items", include_in_schema=False)
async def list_input_items(
    response_id: str,
    request: Request,
    after: str | None = None,
    limit: int = Query(20, ge=1, le=100),
    order: Literal["asc", "desc"] = "desc",
):
    """OpenAI's cursor page: `order` (default newest first), `limit` (1-100, default 20),
    `after` an item id."""
    item = response_store(state(request)).get(response_id)
    if item is None:
        raise not_found(f"no response with id {response_id!r} is stored")
    items = item.inputs if order == "asc" else item.inputs[::-1]
    if after is not None:
        ids = [x["id"] for x in items]
        if after not in ids:
            raise ApiError(400, f"after: no input item {after!r} in this response", param="after")
        items = items[ids.index(after) + 1 :]
    page = items[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else "",
        "last_id": page[-1]["id"] if page else "",
        "has_more": len(items) > limit,
    }


@router.delete("/v1/responses/{response_id}", summary="Delete a stored model response")
@router.delete("/responses/{response_id}", include_in_schema=False)
async def delete(response_id: str, request: Request):
    if not response_store(state(request)).delete(response_id):
        raise not_found(f"no response with id {response_id!r} is stored")
    return {"id": response_id, "object": "response", "deleted": True}
