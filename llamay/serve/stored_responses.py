"""Stored responses of OpenAI's Responses API: `store` (on by default, as OpenAI's), a
later request's `previous_response_id`, `GET /v1/responses/{id}`
(`client.responses.retrieve`) and `DELETE /v1/responses/{id}`.

A stored response keeps its object (what retrieve returns) and the conversation it ended
(its input and history as chat messages, then its output), so a request naming it as
`previous_response_id` continues that conversation; as OpenAI documents, the earlier
`instructions` are not carried over. The store is in memory and bounded like contexts:
at most `MAX_STORED` responses (the least recently used go first) and each forgotten
after the server's context TTL unused.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request

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

    def put(self, response: dict[str, Any], history: list[dict[str, Any]]) -> None:
        self._expire()
        self._items[response["id"]] = Stored(response, history)
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
            if out and out[-1].get("tool_calls") and not out[-1]["content"]:
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
    return out


@router.get("/v1/responses/{response_id}", summary="Retrieve a stored model response")
@router.get("/responses/{response_id}", include_in_schema=False)
async def retrieve(response_id: str, request: Request):
    item = response_store(state(request)).get(response_id)
    if item is None:
        raise not_found(f"no response with id {response_id!r} is stored")
    return item.response


@router.delete("/v1/responses/{response_id}", summary="Delete a stored model response")
@router.delete("/responses/{response_id}", include_in_schema=False)
async def delete(response_id: str, request: Request):
    if not response_store(state(request)).delete(response_id):
        raise not_found(f"no response with id {response_id!r} is stored")
    return {"id": response_id, "object": "response", "deleted": True}
