"""OpenAI's API: /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models (the
Responses API is `llamay.serve.responses`).

Streaming is SSE ending in `data: [DONE]`. Sampling parameters are OpenAI's plus
llama.cpp's (`top_k`, `min_p`, `repeat_penalty`, ...) as extra fields.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import time
import uuid
from typing import Any, Literal

import numpy as np
from fastapi import APIRouter, Request
from pydantic import Field

from llamay.errors import RequestError
from llamay.serve import tools as T
from llamay.serve import vision as V
from llamay.serve.best_of import best_candidates
from llamay.serve.core import (
    OpenModel,
    TextGen,
    check_ids,
    embed_all,
    encode_prompt,
    merged,
    off_loop,
    primed,
    sse,
    sse_response,
)
from llamay.serve.errors import ApiError, not_found
from llamay.serve.fim import fim_ids
from llamay.serve.llamacpp import EmbeddingContentRequest, embedding, timings
from llamay.serve.logprobs import (
    MAX_N_PROBS,
    chat_logprobs,
    legacy_logprobs,
    prompt_logprobs,
)
from llamay.serve.lora_adapters import request_lora
from llamay.serve.sampling import extra_params, llama_constraint, make_sampler
from llamay.serve.speculative import request_draft
from llamay.serve.state import ServerState, state

router = APIRouter(tags=["OpenAI"])


class StreamOptions(OpenModel):
    include_usage: bool = False


class ChatMessage(OpenModel):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class FunctionDef(OpenModel):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolDef(OpenModel):
    type: Literal["function"] = "function"
    function: FunctionDef


class _Sampling(OpenModel):
    model: str | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    n: int = Field(1, ge=1, le=16)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    logprobs: Any = None
    user: str | None = None
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0, le=1)
    repeat_penalty: float | None = Field(None, gt=0)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=0)
    max_completion_tokens: int | None = Field(None, ge=0)
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: dict[str, Any] | None = None
    tools: list[ToolDef] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=0)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1, le=16)


class EmbeddingRequest(OpenModel):
    model: str | None = None
    # None: llama-server's own form, `content` (answered as its /embedding answers)
    input: str | list[str] | list[int] | list[list[int]] | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None


# --- helpers ----------------------------------------------------------------------------


def _sampler(body: _Sampling, index: int = 0):
    bias = []
    for k, v in (body.logit_bias or {}).items():
        try:
            bias.append((int(k), -float("inf") if v <= -100 else float(v)))
        except ValueError:
            raise ApiError(
                400, f"logit_bias keys are token ids, not {k!r}", param="logit_bias"
            ) from None
    params = extra_params(body.model_extra)
    params.update(
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        min_p=body.min_p,
        repeat_penalty=body.repeat_penalty,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        logit_bias=tuple(bias) or None,
    )
    if body.seed is not None:
        params["seed"] = (body.seed + index) % (2**32)
    return make_sampler(**params)


def _stops(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)


def _text_of(content: str | list[dict[str, Any]] | None, images: list | None = None) -> str:
    """The text of a message's content; `image_url` parts (data URLs) become mtmd's
    `<__media__>` marker where they are, their bytes appended to `images`."""
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for p in content:
        if p.get("type") in ("text", "input_text"):
            parts.append(str(p.get("text", "")))
        elif p.get("type") == "image_url" and images is not None:
            url = p.get("image_url")
            url = url.get("url") if isinstance(url, dict) else url
            images.append(V.url_bytes(url, "messages: image_url"))
            parts.append(V.MEDIA_MARKER)
        else:
            raise ApiError(
                400,
                f"content parts of type {p.get('type')!r} are not supported (text only)",
                param="messages",
            )
    return "".join(parts)


def _messages(body: ChatCompletionRequest, images: list | None = None) -> list[dict]:
    out = []
    for i, m in enumerate(body.messages):
        msg: dict[str, Any] = {
            "role": "system" if m.role == "developer" else m.role,
            "content": _text_of(m.content, images),
        }
        if m.name:
            msg["name"] = m.name
        if m.tool_call_id:
            msg["tool_call_id"] = m.tool_call_id
        if m.tool_calls:
            msg["tool_calls"] = [
                T.history_call(c, f"messages.{i}.tool_calls.{j}")
                for j, c in enumerate(m.tool_calls)
            ]
        out.append(msg)
    return out


def _tool_plan(body: ChatCompletionRequest) -> tuple[list[dict] | None, list[dict] | None]:
    """(tools for the template, functions a call is forced among, or None)."""
    if not body.tools:
        if body.tool_choice not in (None, "none", "auto"):
            raise ApiError(400, "tool_choice needs tools", param="tool_choice")
        return None, None
    tools = [t.model_dump(exclude_none=True) for t in body.tools]
    functions = [t["function"] for t in tools]
    choice = body.tool_choice if body.tool_choice is not None else "auto"
    if choice == "none":
        return None, None
    if choice == "auto":
        return tools, None
    if choice == "required":
        return tools, functions
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        return tools, T.pick(functions, choice["function"].get("name"))
    raise ApiError(
        400,
        f"tool_choice {choice!r} is not none, auto, required or "
        '{"type": "function", "function": {"name": ...}}',
        param="tool_choice",
    )


def _response_format(fmt: dict[str, Any] | None) -> dict[str, Any]:
    if not fmt or fmt.get("type") in (None, "text"):
        return {}
    if fmt.get("type") == "json_object":
        return {"json": True}
    if fmt.get("type") == "json_schema":
        js = fmt.get("json_schema") or {}
        schema = js.get("schema")
        if not isinstance(schema, dict):
            raise ApiError(
                400,
                "response_format.json_schema.schema must be a JSON schema object",
                param="response_format",
            )
        return {"json_schema": schema}
    raise ApiError(
        400,
        f"response_format type {fmt.get('type')!r} is not text, json_object or json_schema",
        param="response_format",
    )


def _oa_reason(reason: str | None) -> str:
    return "length" if reason == "length" else "stop"


def _message_of(
    gen: TextGen, text: str, forced: list[dict] | None, names: set[str], parallel: bool = True
) -> tuple[dict, str]:
    calls = T.calls_in(text, forced, names, parallel)
    if calls:
        tool_calls = [
            {
                "id": T.call_id(),
                "type": "function",
                "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])},
            }
            for c in calls
        ]
        if forced:  # the arguments as generated, as a stream sends them
            tool_calls[0]["function"]["arguments"] = T.forced_arguments(text)
        reason = "length" if calls[0].get("cut") else "tool_calls"
        content = None if forced else T.text_around_calls(text) or None  # what came beside
        return {"role": "assistant", "content": content, "tool_calls": tool_calls}, reason
    return {"role": "assistant", "content": text}, _oa_reason(gen.finish_reason)


def _call_delta(name: str | None, arguments: str = "") -> dict:
    """A chunk delta of the one tool call: its start (with `name`), or more arguments."""
    if name is not None:
        fn = {"name": name, "arguments": arguments}
        return {"tool_calls": [{"index": 0, "id": T.call_id(), "type": "function", "function": fn}]}
    return {"tool_calls": [{"index": 0, "function": {"arguments": arguments}}]}


def _usage(gens: list[TextGen]) -> dict[str, Any]:
    p = gens[0].prompt_tokens if gens else 0
    c = sum(g.completion_tokens for g in gens)
    cached = gens[0].cached_tokens if gens else 0
    return {
        "prompt_tokens": p,
        "completion_tokens": c,
        "total_tokens": p + c,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


# --- routes -----------------------------------------------------------------------------


def _n_probs(body: ChatCompletionRequest) -> int | None:
    """How many alternatives each token's log-probability comes with (None: none asked):
    OpenAI's logprobs/top_logprobs, or llama-server's n_probs without them."""
    if body.logprobs:
        return body.top_logprobs or 0
    n_probs = (body.model_extra or {}).get("n_probs")
    if body.logprobs is None and isinstance(n_probs, int) and not isinstance(n_probs, bool):
        return min(n_probs, MAX_N_PROBS) if n_probs > 0 else None
    return None


@router.post("/v1/chat/completions", summary="Create a chat completion")
@router.post("/chat/completions", include_in_schema=False)  # llama-server's unprefixed route
async def chat_completions(body: ChatCompletionRequest, request: Request):
    st: ServerState = state(request)
    if body.logprobs not in (None, True, False):
        raise ApiError(400, "logprobs must be true or false", param="logprobs")
    if body.top_logprobs and not body.logprobs:
        raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    top = _n_probs(body)
    parallel = body.parallel_tool_calls is not False  # false: at most one call
    lm = await st.models.get(body.model, lenient=True)
    template_tools, forced = _tool_plan(body)
    names = {t["function"]["name"] for t in template_tools or []}
    images: list[bytes] = []
    messages = _messages(body, images)
    start = None
    if images:  # image_url parts: the prompt as mtmd lays it out (llamay.serve.vision)
        text = await off_loop(T.render_prompt, lm, messages, template_tools)
        ids, start = await off_loop(V.image_prompt, lm, text, images)
    else:
        ids = await off_loop(T.chat_ids, lm, messages, template_tools)
    max_tokens = (
        body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    )
    ckw = _response_format(body.response_format) or llama_constraint(body.model_extra)
    if forced is not None:
        ckw = {"json_schema": T.call_schema(forced)}
    gens = []
    for i in range(body.n):
        con = await st.constraint(lm, **ckw) if ckw else None
        g = st.textgen(lm, ids, max_tokens, _sampler(body, i), _stops(body.stop), con, start=start)
        g.logprobs = top
        g.lora = request_lora(lm, body.model_extra)
        g.draft = request_draft(body.model_extra)  # llama-server's speculative.n_max...
        gens.append(g)
    cid = f"chatcmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    model = lm.name

    if not body.stream:
        texts = await asyncio.gather(*(g.collect(request) for g in gens))
        choices = []
        for i, (g, t) in enumerate(zip(gens, texts, strict=True)):
            msg, reason = _message_of(g, t, forced, names, parallel)
            lp = chat_logprobs(lm, g.logprob_rows()) if top is not None else None
            choices.append({"index": i, "message": msg, "finish_reason": reason, "logprobs": lp})
        return {
            "id": cid,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": choices,
            "usage": _usage(gens),
            "system_fingerprint": "llamay",
            "timings": timings(gens[0]),  # llama-server's, on its OpenAI answers too
        }

    include_usage = bool(body.stream_options and body.stream_options.include_usage)

    def chunk(choices: list[dict], usage: dict | None = None, end: TextGen | None = None) -> str:
        obj = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "system_fingerprint": "llamay",
            "choices": choices,
        }
        if include_usage:
            obj["usage"] = usage
        if end is not None:  # a choice's last chunk: llama-server's timings
            obj["timings"] = timings(end)
        return sse(obj)

    opened: set[int] = set()  # the choices whose first chunk (with the role) has gone

    def choice(i: int, delta: dict, reason: str | None = None) -> dict:
        """A chunk's choice, with the log-probabilities of the tokens that arrived since
        the last chunk of choice i (when asked for). A choice's first delta carries the
        role and, as OpenAI's, a null content when it opens with a tool call."""
        if i not in opened:
            opened.add(i)
            delta = {"role": "assistant", "content": None if "tool_calls" in delta else "", **delta}
        rows = gens[i].take_logprobs() if top is not None else []
        lp = chat_logprobs(lm, rows) if rows else None
        return {"index": i, "delta": delta, "finish_reason": reason, "logprobs": lp}

    async def events():
        if forced is None and not names:  # plain text: the role goes first, at once
            for i in range(len(gens)):
                yield chunk([choice(i, {})])
        if forced is not None:
            # The enforced call as it is generated: its id and name once the name is
            # complete, then the arguments piece by piece.
            calls = [T.ForcedCallStream(T.sole_name(forced)) for _ in gens]
            async for i, delta in merged(gens):
                call = calls[i]
                if delta is None:
                    whole = call.finish()
                    if call.name is None:  # keys in another order: nothing streamed
                        yield chunk([choice(i, _call_delta(whole["name"]))])
                        args = json.dumps(whole["arguments"])
                        yield chunk([choice(i, _call_delta(None, args))])
                    reason = "length" if whole.get("cut") else "tool_calls"
                    yield chunk([choice(i, {}, reason)], end=gens[i])
                    continue
                name, piece = call.feed(delta)
                if name is not None:
                    yield chunk([choice(i, _call_delta(name))])
                if piece:
                    yield chunk([choice(i, _call_delta(None, piece))])
        else:
            autos = [T.AutoCalls(names) for _ in gens]
            async for i, delta in merged(gens):
                if delta is None:
                    if rest := autos[i].flush():  # a marker's start that never became one
                        yield chunk([choice(i, {"content": rest})])
                    if autos[i].holding:
                        msg, reason = _message_of(gens[i], autos[i].held, None, names, parallel)
                        out = {k: v for k, v in msg.items() if k != "role"}
                        if "tool_calls" in out:
                            out["tool_calls"] = [
                                {"index": j, **c} for j, c in enumerate(out["tool_calls"])
                            ]
                        if out.get("content") != "":
                            yield chunk([choice(i, out)])
                    else:
                        reason = _oa_reason(gens[i].finish_reason)
                    yield chunk([choice(i, {}, reason)], end=gens[i])
                    continue
                if out := autos[i].feed(delta):
                    yield chunk([choice(i, {"content": out})])
        if include_usage:
            yield chunk([], _usage(gens))
        yield sse("[DONE]")

    return sse_response(await primed(events()), "openai")


def _prompts(lm, prompt, suffix: str | None = None) -> list[list[int]]:
    if suffix:  # fill in the middle: each text prompt is the prefix (llamay.serve.fim)
        texts = [prompt] if isinstance(prompt, str) else prompt
        if not texts or not all(isinstance(p, str) for p in texts):
            raise ApiError(400, "suffix needs a text prompt (not token ids)", param="suffix")
        return [fim_ids(lm, p, suffix) for p in texts]
    if isinstance(prompt, str):
        return [encode_prompt(lm, prompt)]
    if not prompt:
        raise RequestError("the prompt is empty (no tokens to condition on)")
    if all(isinstance(p, int) for p in prompt):
        return [list(prompt)]
    if all(isinstance(p, str) for p in prompt):
        return [encode_prompt(lm, p) for p in prompt]
    return [list(p) for p in prompt]


@router.post("/v1/completions", summary="Create a text completion")
async def completions(body: CompletionRequest, request: Request):
    st: ServerState = state(request)
    best_of = body.best_of or body.n
    if best_of < body.n:
        raise ApiError(400, "best_of must be greater than or equal to n", param="best_of")
    if best_of > body.n and body.stream:
        raise ApiError(400, "best_of greater than n cannot be streamed", param="best_of")
    lp = body.logprobs
    if lp is not None and (isinstance(lp, bool) or not isinstance(lp, int) or not 0 <= lp <= 20):
        raise ApiError(400, "logprobs must be an integer in [0, 20]", param="logprobs")
    lm = await st.models.get(body.model, lenient=True)
    prompts = await off_loop(_prompts, lm, body.prompt, body.suffix)
    check_ids(lm, prompts)
    ckw = llama_constraint(body.model_extra)  # llama-server's OAI completions take them too
    gens = []
    for p in prompts:
        for i in range(best_of):
            con = await st.constraint(lm, **ckw) if ckw else None
            g = st.textgen(
                lm, p, body.max_tokens, _sampler(body, i), _stops(body.stop), con, empty_ok=True
            )
            # best_of ranks candidates by their tokens' log-probabilities
            g.logprobs = lp if lp is not None or best_of == body.n else 0
            g.lora = request_lora(lm, body.model_extra)
            g.draft = request_draft(body.model_extra)
            gens.append(g)
    candidates = gens
    # echo with logprobs: the prompt's own tokens come first (OpenAI's legacy behaviour)
    echoed = [[] for _ in gens]
    if body.echo and lp is not None:
        per_prompt = [await off_loop(prompt_logprobs, lm, p, lp) for p in prompts]
        echoed = [rows for rows in per_prompt for _ in range(body.n)]
    tok = lm.model.tokenizer
    cid = f"cmpl-{uuid.uuid4().hex}"
    created = int(time.time())

    def usage() -> dict:  # every candidate's tokens count (OpenAI's best_of bills them)
        p = sum(len(x) for x in prompts)
        c = sum(g.completion_tokens for g in candidates)
        cached = sum(g.cached_tokens for g in candidates[::best_of])
        return {
            "prompt_tokens": p,
            "completion_tokens": c,
            "total_tokens": p + c,
            "prompt_tokens_details": {"cached_tokens": cached},
        }

    def echo(g: TextGen) -> str:
        return tok.decode(g.prompt_ids) if body.echo else ""

    if not body.stream:
        texts = await asyncio.gather(*(g.collect(request) for g in gens))
        if best_of > body.n:  # per prompt, the n with the highest mean logprob per token
            gens, texts = best_candidates(gens, texts, best_of, body.n)
        choices = [
            {
                "index": i,
                "text": echo(g) + t,
                "finish_reason": _oa_reason(g.finish_reason),
                "logprobs": legacy_logprobs(lm, echoed[i] + g.logprob_rows())
                if lp is not None
                else None,
            }
            for i, (g, t) in enumerate(zip(gens, texts, strict=True))
        ]
        return {
            "id": cid,
            "object": "text_completion",
            "created": created,
            "model": lm.name,
            "choices": choices,
            "usage": usage(),
            "system_fingerprint": "llamay",
            "timings": timings(gens[0]),
        }

    include_usage = bool(body.stream_options and body.stream_options.include_usage)

    def chunk(choices: list[dict], use: dict | None = None, end: TextGen | None = None) -> str:
        obj = {
            "id": cid,
            "object": "text_completion",
            "created": created,
            "model": lm.name,
            "choices": choices,
            "system_fingerprint": "llamay",
        }
        if include_usage:
            obj["usage"] = use
        if end is not None:
            obj["timings"] = timings(end)
            ended.append(end)
            if not include_usage and len(ended) == len(gens):
                obj["usage"] = usage()  # llama-server's: on the last choice's final chunk
        return sse(obj)

    sent = [0] * len(gens)  # characters of each choice's text sent (logprob offsets)
    ended: list[TextGen] = []

    def choice(i: int, text: str, reason: str | None = None, rows=None) -> dict:
        if rows is None:
            rows = gens[i].take_logprobs() if lp is not None else []
        logprobs = legacy_logprobs(lm, rows, sent[i]) if rows else None
        if logprobs:
            sent[i] = logprobs["text_offset"][-1] + len(logprobs["tokens"][-1])
        return {"index": i, "text": text, "finish_reason": reason, "logprobs": logprobs}

    async def events():
        if body.echo:
            for i, g in enumerate(gens):
                yield chunk([choice(i, echo(g), rows=echoed[i])])
        async for i, delta in merged(gens):
            if delta is None:
                yield chunk([choice(i, "", _oa_reason(gens[i].finish_reason))], end=gens[i])
            elif delta:
                yield chunk([choice(i, delta)])
        if include_usage:
            yield chunk([], usage())
        yield sse("[DONE]")

    return sse_response(await primed(events()), "openai")


def _embedding_inputs(lm, inp) -> list[list[int]]:
    if isinstance(inp, str):
        return [lm.model.tokenize(inp)]
    if inp and all(isinstance(x, int) for x in inp):
        return [list(inp)]
    if all(isinstance(x, str) for x in inp):
        return [lm.model.tokenize(x) for x in inp]
    return [list(x) for x in inp]


@router.post("/v1/embeddings", summary="Create embeddings")
async def embeddings(body: EmbeddingRequest, request: Request):
    if body.input is None:  # llama-server answers {"content": ...} in its own form
        if "content" not in (body.model_extra or {}):
            raise ApiError(400, "input is required", param="input")
        return await embedding(EmbeddingContentRequest(**body.model_dump()), request)
    st: ServerState = state(request)
    lm = await st.models.get(body.model, lenient=True)
    prompts = await off_loop(_embedding_inputs, lm, body.input)
    if not prompts or any(not p for p in prompts):
        raise RequestError("embedding input must not be empty")
    check_ids(lm, prompts)
    vecs = await embed_all(lm, prompts)
    data = []
    for i, v in enumerate(vecs):
        if body.dimensions is not None:
            v = v[: body.dimensions]
            v = v / max(float(np.linalg.norm(v)), 1e-12)
        emb: Any = v.astype(np.float32).tolist()
        if body.encoding_format == "base64":
            emb = base64.b64encode(v.astype(np.float32).tobytes()).decode()
        data.append({"object": "embedding", "index": i, "embedding": emb})
    n = sum(len(p) for p in prompts)
    return {
        "object": "list",
        "data": data,
        "model": lm.name,
        "usage": {"prompt_tokens": n, "total_tokens": n},
    }


def _model_obj(k, lm=None) -> dict:
    """OpenAI's model object; a loaded model (`lm`) also carries llama-server's `meta`
    (clients read its n_ctx_train, as the context the model was trained for)."""
    out = {"id": k.name, "object": "model", "created": k.created, "owned_by": "llamay"}
    # Anthropic's Models API reads the same route: its fields beside OpenAI's
    when = datetime.datetime.fromtimestamp(k.created, datetime.UTC)
    out |= {"type": "model", "display_name": k.name, "created_at": when.isoformat()}
    if lm is not None:
        from llamay.gguf.inspect import summary

        cfg, tok = lm.model.config, lm.model.tokenizer
        s = summary(getattr(lm.model, "gguf", None) or k.path)  # the loaded file if it can
        out["meta"] = {
            "vocab_type": {"spm": 1, "bpe": 2, "wpm": 3}.get(tok.vocab.kind, 0),  # llama.cpp's
            "n_vocab": tok.vocab_size,
            "n_ctx_train": cfg.context_length,
            "n_embd": cfg.d_model,
            "n_params": s["parameter_count"],
            "size": s["tensor_bytes"],
            "ftype": str(s["file_type"] or ""),
            "n_ctx": lm.model.n_ctx,
        }
    return out


@router.get("/v1/models", summary="List models")
@router.get("/models", include_in_schema=False)
async def list_models(request: Request):
    st: ServerState = state(request)
    loaded = st.models.loaded
    data = [_model_obj(k, loaded.get(k.name)) for k in st.models.known()]
    ids = [m["id"] for m in data] or [None]
    # Anthropic's paging fields beside OpenAI's list
    return {
        "object": "list",
        "data": data,
        "has_more": False,
        "first_id": ids[0],
        "last_id": ids[-1],
    }


@router.get("/v1/models/{model_id:path}", summary="Describe a model")
async def get_model(model_id: str, request: Request):
    st: ServerState = state(request)
    for k in st.models.known():
        if k.name == model_id:
            return _model_obj(k, st.models.loaded.get(k.name))
    raise not_found(f"model {model_id!r} is not available on this server", model=True)
