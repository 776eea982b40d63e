"""Ollama's API: /api/generate, /api/chat (NDJSON streaming), /api/tags, /api/show,
/api/ps, /api/pull, /api/embed, /api/embeddings, /api/delete, /api/copy, /api/version.

Durations are nanoseconds; `keep_alive` is seconds or a Go duration ("5m", "1h", "-1");
`options` take Ollama's keys.
"""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from pydantic import Field

from llamay.errors import RequestError
from llamay.ollama.template import render as render_go_template
from llamay.serve import tools as T
from llamay.serve import vision as V
from llamay.serve.core import (
    EventStream,
    OpenModel,
    TextGen,
    embed_all,
    encode_prompt,
    guarded,
    ndjson,
    off_loop,
    primed,
)
from llamay.serve.errors import ApiError
from llamay.serve.fim import fim_ids
from llamay.serve.logprobs import piece
from llamay.serve.models import Known, Loaded
from llamay.serve.ollama_window import Window
from llamay.serve.sampling import EXTRA_FIELDS, make_sampler
from llamay.serve.state import ServerState, state

router = APIRouter(tags=["Ollama"])


class GenerateRequest(OpenModel):
    model: str = ""
    prompt: str | None = None
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    stream: bool = True
    raw: bool = False
    format: str | dict[str, Any] | None = None
    images: list[str] | None = None
    options: dict[str, Any] | None = None
    keep_alive: str | float | None = None
    think: bool | str | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    truncate: bool | None = None  # None: on (a prompt longer than the window is truncated)
    shift: bool | None = None  # None: on (a full window shifts: ollama_window)


class ChatMessage(OpenModel):
    role: str
    content: str | None = ""
    images: list[str] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_name: str | None = None


class ChatRequest(OpenModel):
    model: str = ""
    messages: list[ChatMessage] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    stream: bool = True
    format: str | dict[str, Any] | None = None
    options: dict[str, Any] | None = None
    keep_alive: str | float | None = None
    think: bool | str | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    truncate: bool | None = None  # None: on (a prompt longer than the window is truncated)
    shift: bool | None = None  # None: on (a full window shifts: ollama_window)


class EmbedRequest(OpenModel):
    model: str = ""
    input: str | list[str] = ""
    truncate: bool = True
    options: dict[str, Any] | None = None
    keep_alive: str | float | None = None
    dimensions: int | None = Field(None, ge=1)


class EmbeddingsRequest(OpenModel):
    model: str = ""
    prompt: str = ""
    options: dict[str, Any] | None = None
    keep_alive: str | float | None = None


# --- helpers ----------------------------------------------------------------------------

_DURATION = re.compile(r"(-?\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}


def keep_alive_seconds(value: str | float | None) -> float | None:
    """Seconds from Ollama's keep_alive (a number of seconds or a Go duration); None:
    the server's default; negative: forever."""
    if value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    text = value.strip()
    try:
        return float(text)
    except ValueError:
        pass
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text.replace("+", ""):
        raise ApiError(
            400,
            f"keep_alive {value!r} is not a number of seconds or a duration like 5m, 1h30m or -1",
        )
    return sum(float(n) * _UNIT[u] for n, u in parts)


def now_iso() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _options(options: dict[str, Any] | None) -> tuple[dict[str, Any], int | None, list[str]]:
    """(sampler params, num_predict, stop strings) from Ollama `options`."""
    params: dict[str, Any] = {}
    num_predict = None
    stop: list[str] = []
    for k, v in (options or {}).items():
        if k in EXTRA_FIELDS or k == "seed":  # Ollama's names are llama.cpp's
            params[k] = v  # checked by make_sampler
        elif k == "num_predict":
            if not isinstance(v, int) or isinstance(v, bool):
                raise ApiError(400, f"option num_predict must be an integer, not {v!r}")
            num_predict = None if v < 0 else v
        elif k == "stop":
            items = [v] if isinstance(v, str) else v
            if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
                raise ApiError(400, "option stop must be a string or a list of strings")
            stop = items
        # Other options (hardware, loading, newer Ollama's own) are ignored, as Ollama
        # ignores the ones it does not know.
    return params, num_predict, stop


def model_layers(k: Known) -> tuple[str | None, str | None, dict[str, Any]]:
    """The model's own (system, Go template, params) from its store layers, if any."""
    from llamay.store import manifest as media

    def text(mt: str) -> str | None:
        p = k.layers.get(mt)
        try:
            return p.read_text() if p is not None else None
        except OSError:
            return None

    params: dict[str, Any] = {}
    raw = text(media.PARAMS)
    if raw:
        try:
            loaded = json.loads(raw)
        except ValueError:
            loaded = {}
        known = {*EXTRA_FIELDS, "seed", "num_predict", "stop", "num_ctx", "num_keep"}
        params = {key: v for key, v in loaded.items() if key in known}
    return text(media.SYSTEM), text(media.TEMPLATE), params


def _no_thinking(think) -> None:
    if think not in (None, False, ""):
        raise ApiError(400, "think: thinking mode is not supported by this server yet")


def _format(fmt: str | dict[str, Any] | None) -> dict[str, Any]:
    if fmt is None or fmt == "":
        return {}
    if fmt == "json":
        return {"json": True}
    if isinstance(fmt, dict):
        return {"json_schema": fmt}
    raise ApiError(400, f'format must be "json" or a JSON schema, not {fmt!r}')


def _timings(g: TextGen, lm: Loaded, t0: float, load_s: float) -> dict[str, Any]:
    return {
        "total_duration": int((time.perf_counter() - t0) * 1e9),
        "load_duration": int(load_s * 1e9),
        "prompt_eval_count": g.prompt_tokens,
        "prompt_eval_duration": int(g.prompt_seconds * 1e9),
        "eval_count": g.completion_tokens,
        "eval_duration": int(g.decode_seconds * 1e9),
    }


def _want_logprobs(body: GenerateRequest | ChatRequest) -> int | None:
    """How many alternatives per token the request asks for (None: no logprobs)."""
    top = body.top_logprobs
    if top is not None and (isinstance(top, bool) or not 0 <= top <= 20):
        raise ApiError(400, f"top_logprobs must be between 0 and 20, not {top!r}")
    if not body.logprobs:  # top_logprobs counts only with logprobs on (api.md)
        return None
    return top or 0


def _logprobs(lm: Loaded, g: TextGen, want: int | None) -> dict[str, Any]:
    """`{"logprobs": [...]}` of the tokens since the last call, in Ollama's shape
    (`{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}`), or {}."""
    if want is None:
        return {}
    out = []
    for tok, lp, alts in g.take_logprobs():
        text, raw = piece(lm, tok)
        row: dict[str, Any] = {"token": text, "logprob": lp, "bytes": raw}
        if want:
            row["top_logprobs"] = [
                dict(zip(("token", "bytes"), piece(lm, i), strict=True), logprob=a) for i, a in alts
            ]
        out.append(row)
    return {"logprobs": out}


def _reason(g: TextGen) -> str:
    return "length" if g.finish_reason == "length" else "stop"


async def _get(st: ServerState, name: str, keep_alive) -> tuple[Loaded, float]:
    was = st.models.find(name).name in st.models.loaded
    t = time.perf_counter()
    lm = await st.models.get(name, keep_alive_seconds(keep_alive))
    return lm, 0.0 if was else time.perf_counter() - t


def ndjson_response(agen) -> EventStream:
    return EventStream(
        guarded(agen, lambda e: ndjson({"error": str(e)})), media_type="application/x-ndjson"
    )


# --- generate / chat ----------------------------------------------------------------------


def _generate_text(lm: Loaded, body: GenerateRequest, prompt: str, system, template) -> str:
    if body.raw:
        return prompt
    if template:
        return render_go_template(template, prompt, system)
    messages = [{"role": "system", "content": system}] if system else []
    return T.render_prompt(lm, [*messages, {"role": "user", "content": prompt}])


def _image_list(images: list[str], where: str) -> list[bytes]:
    """Ollama's `images`: base64 strings (a data: URL is taken too)."""
    return [
        V.url_bytes(x, where) if str(x)[:5].lower() == "data:" else V.decode_base64(x, where)
        for x in images
    ]


def _generate_ids(
    lm: Loaded, body: GenerateRequest, system: str | None, template: str | None, window: Window
) -> list[int]:
    """The prompt's token ids: raw, through a Go template (the request's or the model's
    own), or through the model's chat template; after `context`'s ids when given; cut to
    the request's window."""
    prompt = body.prompt or ""
    if body.suffix:  # fill in the middle, with the model's FIM tokens (as llama.cpp's /infill)
        return window.cut(list(body.context or []) + fim_ids(lm, prompt, body.suffix))
    text = _generate_text(lm, body, prompt, system, template)
    if body.context:
        ids = lm.model.tokenize(text, add_special=False, parse_special=True)
        return window.cut(list(body.context) + ids)
    return window.cut(encode_prompt(lm, text, window.max_bytes))


@router.post("/api/generate", summary="Generate a completion (Ollama)")
async def generate(body: GenerateRequest, request: Request):
    st: ServerState = state(request)
    t0 = time.perf_counter()
    images = _image_list(body.images, "images") if body.images else []
    if images and (body.context or body.suffix):
        raise ApiError(400, "images with context or suffix are not supported")
    _no_thinking(body.think)
    want_lp = _want_logprobs(body)
    ka = keep_alive_seconds(body.keep_alive)
    if not body.prompt and not body.context and not body.suffix:
        # Ollama: an empty prompt loads (or, with keep_alive 0, unloads) the model.
        if ka == 0:
            known = st.models.find(body.model)
            await st.models.unload_when_idle(known.name)
            return {
                "model": known.name,
                "created_at": now_iso(),
                "response": "",
                "done": True,
                "done_reason": "unload",
            }
        lm, _ = await _get(st, body.model, body.keep_alive)
        return {
            "model": lm.name,
            "created_at": now_iso(),
            "response": "",
            "done": True,
            "done_reason": "load",
        }
    lm, load_s = await _get(st, body.model, body.keep_alive)
    own_system, own_template, own_params = model_layers(lm.known)
    options = {**own_params, **(body.options or {})}
    params, num_predict, stop = _options(options)
    window = Window.of(lm, options, num_predict, body.truncate, body.shift)
    system = body.system if body.system is not None else own_system
    start = None
    if images:  # each image where a <__media__> is, else before the prompt (Ollama's order)
        prompt = body.prompt or ""
        if V.MEDIA_MARKER not in prompt:
            prompt = V.MEDIA_MARKER * len(images) + prompt
        template = body.template or own_template
        text = await off_loop(_generate_text, lm, body, prompt, system, template)
        ids, start = await off_loop(V.image_prompt, lm, text, images)
    else:
        ids = await off_loop(_generate_ids, lm, body, system, body.template or own_template, window)
    first = window.max_tokens(len(ids), num_predict)
    con = await st.constraint(lm, **_format(body.format))
    g = st.textgen(lm, ids, first, make_sampler(**params), stop, con, start=start)
    if window.shift:
        g.shift_past(window, window.reply_limit(num_predict))
    g.logprobs = want_lp

    def final() -> dict[str, Any]:
        out = {
            "model": lm.name,
            "created_at": now_iso(),
            "response": "",
            "done": True,
            "done_reason": _reason(g),
            "context": g.prompt_ids + g.token_ids,
            **_timings(g, lm, t0, load_s),
            **_logprobs(lm, g, want_lp),
        }
        if body.raw or images:  # "raw mode will not return a context" (Ollama's api.md);
            del out["context"]  # an image prompt's ids are no context to send back
        return out

    if not body.stream:
        text = await g.collect(request)
        st.models.touch(lm, ka)
        return {**final(), "response": text}

    async def lines():
        async for delta in g.stream():
            yield ndjson(
                {
                    "model": lm.name,
                    "created_at": now_iso(),
                    "response": delta,
                    "done": False,
                    **_logprobs(lm, g, want_lp),
                }
            )
        st.models.touch(lm, ka)
        yield ndjson(final())

    return ndjson_response(await primed(lines()))


def _chat_messages(body: ChatRequest, images: list[bytes] | None = None) -> list[dict]:
    """The messages for the template; a message's `images` (base64) go before its content
    as mtmd's `<__media__>` markers, their bytes appended to `images`."""
    out = []
    for i, m in enumerate(body.messages):
        content = m.content or ""
        if m.images:
            if images is None:
                raise ApiError(400, "images are not supported here")
            images.extend(_image_list(m.images, f"messages.{i}.images"))
            content = V.MEDIA_MARKER * len(m.images) + content
        msg: dict[str, Any] = {"role": m.role, "content": content}
        if m.tool_calls:
            msg["tool_calls"] = [
                T.history_call(c, f"messages.{i}.tool_calls.{j}")
                for j, c in enumerate(m.tool_calls)
            ]
        if m.tool_name:
            msg["name"] = m.tool_name
        out.append(msg)
    return out


@router.post("/api/chat", summary="Chat (Ollama)")
async def chat(body: ChatRequest, request: Request):
    st: ServerState = state(request)
    t0 = time.perf_counter()
    _no_thinking(body.think)
    want_lp = _want_logprobs(body)
    ka = keep_alive_seconds(body.keep_alive)
    if not body.messages:
        if ka == 0:
            known = st.models.find(body.model)
            await st.models.unload_when_idle(known.name)
            reason = "unload"
        else:
            known = (await st.models.get(body.model, ka)).known
            reason = "load"
        return {
            "model": known.name,
            "created_at": now_iso(),
            "message": {"role": "assistant", "content": ""},
            "done": True,
            "done_reason": reason,
        }
    lm, load_s = await _get(st, body.model, body.keep_alive)
    own_system, _, own_params = model_layers(lm.known)
    options = {**own_params, **(body.options or {})}
    params, num_predict, stop = _options(options)
    window = Window.of(lm, options, num_predict, body.truncate, body.shift)
    tools = body.tools or None
    names = {(t.get("function") or {}).get("name") for t in tools or []} - {None}
    images: list[bytes] = []
    messages = _chat_messages(body, images)
    if own_system and not any(m["role"] == "system" for m in messages):
        messages = [{"role": "system", "content": own_system}, *messages]
    start = None
    if images:
        text = await off_loop(T.render_prompt, lm, messages, tools)
        ids, start = await off_loop(V.image_prompt, lm, text, images)
    else:
        ids = await off_loop(window.chat_ids, lm, messages, tools)
    first = window.max_tokens(len(ids), num_predict)
    con = await st.constraint(lm, **_format(body.format))
    g = st.textgen(lm, ids, first, make_sampler(**params), stop, con, start=start)
    if window.shift:
        g.shift_past(window, window.reply_limit(num_predict))
    g.logprobs = want_lp

    def message(content: str) -> dict[str, Any]:
        calls = T.parse_calls(content, names) if names else None
        if calls:
            return {
                "role": "assistant",
                "content": T.text_around_calls(content),
                "tool_calls": [
                    {"function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls
                ],
            }
        return {"role": "assistant", "content": content}

    def final(content: str = "") -> dict[str, Any]:
        return {
            "model": lm.name,
            "created_at": now_iso(),
            "message": message(content),
            "done": True,
            "done_reason": _reason(g),
            **_timings(g, lm, t0, load_s),
            **_logprobs(lm, g, want_lp),
        }

    if not body.stream:
        content = await g.collect(request)
        st.models.touch(lm, ka)
        return final(content)

    def line(msg: dict[str, Any]) -> str:
        return ndjson(
            {
                "model": lm.name,
                "created_at": now_iso(),
                "message": msg,
                "done": False,
                **_logprobs(lm, g, want_lp),
            }
        )

    async def lines():
        # Text streams as it comes; with tools, an answer that starts like a tool call is
        # held back and sent as one message with its tool_calls (as Ollama does).
        auto = T.AutoCalls(names)
        async for delta in g.stream():
            if out := auto.feed(delta):
                yield line({"role": "assistant", "content": out})
        if out := auto.flush():
            yield line({"role": "assistant", "content": out})
        if auto.holding:
            yield line(message(auto.held))
        st.models.touch(lm, ka)
        yield ndjson(final())

    return ndjson_response(await primed(lines()))


# --- embeddings ---------------------------------------------------------------------------


@router.post("/api/embed", summary="Embeddings (Ollama)")
async def embed(body: EmbedRequest, request: Request):
    st: ServerState = state(request)
    t0 = time.perf_counter()
    lm, load_s = await _get(st, body.model, body.keep_alive)
    inputs = [body.input] if isinstance(body.input, str) else body.input
    if not inputs or any(not x for x in inputs):
        raise RequestError("embedding input must not be empty")
    prompts = await off_loop(lambda: [lm.model.tokenize(x) for x in inputs])
    size = Window.of(lm, body.options or {}, None, body.truncate, None).size
    if body.truncate:  # Ollama cuts an input to the window (num_ctx), keeping its start
        prompts = [p[:size] for p in prompts]
    elif any(len(p) > size for p in prompts):
        raise ApiError(400, f"an input has more tokens than the context length ({size})")
    vecs = await embed_all(lm, prompts)
    if body.dimensions:
        import numpy as np

        vecs = [
            v[: body.dimensions] / max(float(np.linalg.norm(v[: body.dimensions])), 1e-12)
            for v in vecs
        ]
    return {
        "model": lm.name,
        "embeddings": [v.tolist() for v in vecs],
        "total_duration": int((time.perf_counter() - t0) * 1e9),
        "load_duration": int(load_s * 1e9),
        "prompt_eval_count": sum(len(p) for p in prompts),
    }


@router.post("/api/embeddings", summary="Embedding of one prompt (Ollama, legacy)")
async def embeddings(body: EmbeddingsRequest, request: Request):
    st: ServerState = state(request)
    lm, _ = await _get(st, body.model, body.keep_alive)
    if not body.prompt:
        return {"embedding": []}
    (vec,) = await embed_all(lm, [await off_loop(lm.model.tokenize, body.prompt)])
    return {"embedding": vec.tolist()}
