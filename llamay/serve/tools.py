"""Chat prompts and tool calls, shared by the API families.

A forced tool call (OpenAI `tool_choice` "required" or a named function, Anthropic
`tool_choice` "any"/"tool", ...) is *enforced*: the output is constrained to the JSON
`{"name": <one of the tools>, "arguments": <that tool's parameters schema>}`. With "auto"
the model writes freely and a call is recognised in its text (`<tool_call>{...}</tool_call>`
as Hermes/Qwen templates teach, or the whole answer being such a JSON object).
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from llamay.errors import RequestError
from llamay.serve.core import encode_prompt
from llamay.serve.errors import ApiError
from llamay.serve.models import Loaded

#: What a model whose chat template knows no tools is told instead (as llama-server does
#: with its generic tool prompt); `parse_calls` reads the calls it then writes.
GENERIC_TOOLS_PROMPT = """You can call tools. To call one, answer with only
<tool_call>{{"name": "<tool name>", "arguments": {{<its arguments>}}}}</tool_call>
The tools, with their arguments as JSON Schema:
{tools}"""


def template_has_tools(lm: Loaded) -> bool:
    """Whether the model's chat template renders a `tools` list itself."""
    return "tools" in lm.model.tokenizer.chat_template


def _call_text(call: Any) -> str:
    """A history call as GENERIC_TOOLS_PROMPT teaches the model to write one."""
    fn = call.get("function") if isinstance(call, dict) else None
    fn = fn if isinstance(fn, dict) else {}
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            pass
    body = json.dumps({"name": fn.get("name"), "arguments": args}, ensure_ascii=False)
    return f"<tool_call>{body}</tool_call>"


def _generic_tools(messages: list[dict], tools: list[dict]) -> list[dict]:
    """`messages` with the tools described in the system message and earlier calls
    written out as the prompt teaches, for a template that would drop both."""
    specs = "\n".join(json.dumps(t.get("function", t), ensure_ascii=False) for t in tools)
    intro = GENERIC_TOOLS_PROMPT.format(tools=specs)
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if isinstance(calls, list) and calls:
            m = {k: v for k, v in m.items() if k != "tool_calls"}
            m["content"] = (m.get("content") or "") + "".join(map(_call_text, calls))
        out.append(m)
    if out and out[0].get("role") == "system":
        return [{**out[0], "content": f"{out[0].get('content') or ''}\n\n{intro}"}, *out[1:]]
    return [{"role": "system", "content": intro}, *out]


def prefill_split(messages: list[dict]) -> tuple[list[dict], str | None]:
    """(the messages before a final assistant turn to continue, that turn's text) or
    (messages, None): a last message from the assistant, without tool calls, is a prefill
    the reply continues (Anthropic's prefill, llama-server's --prefill-assistant default,
    an Ollama template's last assistant message), not a closed turn."""
    last = messages[-1] if messages else None
    if not isinstance(last, dict) or last.get("role") != "assistant" or last.get("tool_calls"):
        return messages, None
    content = last.get("content")
    if isinstance(content, str):
        return messages[:-1], content
    if isinstance(content, list) and all(
        isinstance(p, dict) and isinstance(p.get("text"), str) for p in content
    ):
        return messages[:-1], "".join(p["text"] for p in content)
    return messages, None


def render_prompt(
    lm: Loaded, messages: list[dict], tools: list[dict] | None = None, **kw: Any
) -> str:
    """The chat template's text for `messages` (OpenAI-shaped dicts), with a generation
    prompt, followed by a final assistant message's text when there is one
    (`prefill_split`: the reply continues it, as llama-server's does); `tools` in
    OpenAI's `{"type": "function", "function": {...}}` form, given to the template, or
    described in the system message when the template has no place for them (never
    dropped)."""
    messages, prefill = prefill_split(messages)
    if tools and not template_has_tools(lm):
        messages = _generic_tools(messages, tools)
    elif tools:
        kw["tools"] = tools
    text = lm.model.tokenizer.apply_chat_template(messages, add_generation_prompt=True, **kw)
    return text + (prefill or "")


def history_call(call: Any, where: str) -> dict:
    """One tool call from a conversation's history in the form templates take,
    `{"id", "type": "function", "function": {"name", "arguments"}}` with JSON-string
    arguments parsed (kept as text when they are not JSON); a malformed call is a 400
    naming `where` (a template would otherwise fail on it, or render garbage)."""
    if not isinstance(call, dict):
        raise ApiError(400, f"{where} must be an object", param="messages")
    fn = call.get("function")
    if not isinstance(fn, dict):
        raise ApiError(400, f"{where}.function must be an object with a name", param="messages")
    if not isinstance(fn.get("name"), str) or not fn["name"]:
        raise ApiError(400, f"{where}.function.name must be a non-empty string", param="messages")
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            pass
    elif not isinstance(args, dict):
        raise ApiError(
            400, f"{where}.function.arguments must be a JSON string or object", param="messages"
        )
    if not isinstance(call.get("id", ""), str | None):
        raise ApiError(400, f"{where}.id must be a string", param="messages")
    return {**call, "type": "function", "function": {**fn, "arguments": args}}


def chat_ids(
    lm: Loaded, messages: list[dict], tools: list[dict] | None = None, max_bytes: int | None = None
) -> list[int]:
    """The token ids of `render_prompt`'s text (blocking: run it with `core.off_loop`);
    `max_bytes` as `encode_prompt`'s."""
    return encode_prompt(lm, render_prompt(lm, messages, tools), max_bytes)


def call_schema(functions: list[dict]) -> dict:
    """The JSON schema of one call of any of `functions` ({"name", "parameters"})."""
    options = []
    for f in functions:
        params = f.get("parameters") or {"type": "object"}
        options.append(
            {
                "type": "object",
                "properties": {"name": {"const": f["name"]}, "arguments": params},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    return options[0] if len(options) == 1 else {"anyOf": options}


def pick(functions: list[dict], name: str | None) -> list[dict]:
    """The functions a forced call may use: all, or the one named."""
    if name is None:
        return functions
    chosen = [f for f in functions if f.get("name") == name]
    if not chosen:
        raise RequestError(f"tool_choice names {name!r}, which is not among the tools given")
    return chosen


_TAGGED = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)


def parse_calls(text: str, names: set[str], parallel: bool = True) -> list[dict] | None:
    """Tool calls in a model's free text, or None: each `{"name", "arguments": dict}`
    (the first only without `parallel`: OpenAI's parallel_tool_calls false)."""
    blobs = _TAGGED.findall(text)
    if not blobs and text.strip().startswith("{"):
        blobs = [text.strip()]
    calls = []
    for blob in blobs:
        try:
            obj = json.loads(blob)
        except ValueError:
            continue
        if isinstance(obj, dict) and obj.get("name") in names:
            args = obj.get("arguments", obj.get("parameters", {}))
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except ValueError:
                    continue
            calls.append({"name": obj["name"], "arguments": args if isinstance(args, dict) else {}})
    return (calls if parallel else calls[:1]) or None


def forced_call(text: str, sole: str | None = None) -> dict:
    """The call in the output of a constrained (forced) generation. Cut off before its
    JSON closed (max_tokens), it is `{"name": what came of it, "arguments": {}, "cut":
    True}`: the answer is still a 200, finishing for length, as OpenAI's is. `sole`: the
    one function that could be called (its name, though the cut came before it)."""
    try:
        obj = json.loads(text)
    except ValueError:
        partial = ForcedCallStream()
        partial.feed(text)
        return {"name": partial.name or sole or "", "arguments": {}, "cut": True}
    return {"name": obj["name"], "arguments": obj.get("arguments", {})}


def call_id(prefix: str = "call_") -> str:
    return prefix + uuid.uuid4().hex[:24]


def sole_name(forced: list[dict] | None) -> str | None:
    """The name of the one function a forced call can be, if it is one."""
    return forced[0]["name"] if forced and len(forced) == 1 else None


def calls_in(
    text: str, forced: list[dict] | None, names: set[str], parallel: bool = True
) -> list[dict] | None:
    """The tool calls in a generation's text: the one forced call (among the `forced`
    functions), the calls recognised among `names` (`parse_calls`), or None (plain text)."""
    if forced:
        return [forced_call(text, sole_name(forced))]
    return parse_calls(text, names, parallel) if names else None


def text_around_calls(text: str) -> str:
    """A reply's text outside its tagged tool calls (none for a reply that is one bare
    JSON call), stripped: what an API sends beside the calls it recognised."""
    if text.lstrip().startswith("{"):
        return ""
    return _TAGGED.sub("", text).strip()


_MARK = "<tool_call>"


def _mark_prefix(text: str) -> int:
    """The length of the longest end of `text` that begins the marker (it may be
    completed by the next delta)."""
    for n in range(min(len(text), len(_MARK) - 1), 0, -1):
        if _MARK.startswith(text[-n:]):
            return n
    return 0


class AutoCalls:
    """One answer with tools on "auto", as it streams: text passes on as it comes until a
    tool call begins (a `<tool_call>` marker, or a JSON object opening the answer); from
    there on the answer is held back (`held`), to be read whole when it ends
    (`parse_calls`, `text_around_calls`). An end that may begin the marker waits for the
    next delta; `flush` gives it at the end, when it never became one."""

    def __init__(self, names: set[str]):
        self.watch = bool(names)
        self.mode = None if names else "text"  # None: only whitespace so far
        self.held = ""
        self._tail = ""  # text not yet passed on: leading whitespace, or a marker's start
        self._sent = False

    def feed(self, delta: str) -> str:
        """The part of `delta` that may be sent now as text."""
        if self.mode == "tool":
            self.held += delta
            return ""
        text, self._tail = self._tail + delta, ""
        if self.mode is None:
            if not text.strip():
                self._tail = text
                return ""
            if text.lstrip().startswith("{"):
                self.mode, self.held = "tool", text
                return ""
            self.mode = "text"
        if not self.watch:
            return self._out(text)
        at = text.find(_MARK)
        if at >= 0:
            self.mode, self.held = "tool", text[at:]
            before = text[:at]
            return self._out(before if self._sent or before.strip() else "")
        keep = _mark_prefix(text)
        self._tail = text[len(text) - keep :]
        return self._out(text[: len(text) - keep])

    def _out(self, text: str) -> str:
        self._sent = self._sent or bool(text)
        return text

    def flush(self) -> str:
        """At the end: the text held back as a marker's possible start (none once a call
        began)."""
        out, self._tail = self._tail, ""
        return "" if self.mode == "tool" else self._out(out)

    @property
    def holding(self) -> bool:
        """Whether a call began: `held` is the answer from there on."""
        return self.mode == "tool"


_CALL_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')


class ForcedCallStream:
    """A forced call's JSON (`call_schema`'s `{"name": ..., "arguments": {...}}`) as it
    streams: the name as soon as it is complete, then the arguments' JSON text piece by
    piece (the wrapper's closing brace left out), so an API can stream the call.

    When the text does not begin as `{"name": "...", "arguments": ` (another key order),
    nothing streams and `finish` returns the whole call parsed at the end."""

    def __init__(self, sole: str | None = None):
        self.sole = sole  # `forced_call`'s
        self.text = ""
        self.name: str | None = None
        self.args = ""  # the arguments' JSON text passed on so far
        self._depth = 0
        self._in_str = self._esc = self._closed = False

    def feed(self, delta: str) -> tuple[str | None, str]:
        """(the name if it became known with this delta, else None; arguments text)."""
        self.text += delta
        if self.name is None:
            m = _CALL_HEAD.match(self.text)
            if m is None:
                return None, ""
            self.name = json.loads(f'"{m.group(1)}"')
            return self.name, self._scan(self.text[m.end() :])
        return None, self._scan(delta)

    def _scan(self, piece: str) -> str:
        """The part of `piece` inside the arguments value (a JSON object)."""
        out = []
        for ch in piece:
            if self._closed:
                break
            if not self.args and not out and ch.isspace():
                continue  # before the value (however the deltas split the text)
            out.append(ch)
            if self._in_str:
                if self._esc:
                    self._esc = False
                elif ch == "\\":
                    self._esc = True
                elif ch == '"':
                    self._in_str = False
            elif ch == '"':
                self._in_str = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                self._closed = self._depth == 0
        text = "".join(out)
        self.args += text
        return text

    def finish(self) -> dict:
        """The whole call (`forced_call`), checked against what was streamed."""
        call = forced_call(self.text, self.sole)
        if call.get("cut"):
            return call
        if self.name is not None and json.loads(self.args) != call["arguments"]:
            raise RequestError("the streamed tool call arguments do not parse as sent")
        return call


def forced_arguments(text: str) -> str:
    """A forced call's arguments as the JSON text generated (what a stream sends piece by
    piece, so streamed and whole answers agree); re-serialised when keys came in another
    order."""
    call = ForcedCallStream()
    call.feed(text)
    return call.args if call.name is not None else json.dumps(forced_call(text)["arguments"])
