"""llama.cpp's server API: /completion, /tokenize, /detokenize, /apply-template, /health,
/metrics (Prometheus text), /props, /embedding(s) and rerank (/v1/rerank, /rerank); /slots
in llamay.serve.slots, /infill in llamay.serve.infill."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import AliasChoices, Field

from llamay import __version__
from llamay.errors import RequestError
from llamay.serve import kept, post_probs, readiness, slots
from llamay.serve import tools as T
from llamay.serve import vision as V
from llamay.serve.context import live_contexts
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
from llamay.serve.errors import ApiError
from llamay.serve.line_limits import LineLimits
from llamay.serve.logprobs import MAX_N_PROBS
from llamay.serve.lora_adapters import request_lora
from llamay.serve.models import Loaded
from llamay.serve.sampling import extra_params, make_sampler
from llamay.serve.speculative import draft_timings, request_draft
from llamay.serve.state import ServerState, state

router = APIRouter(tags=["llama.cpp"])


class CompletionRequest(OpenModel):
    model: str | None = None
    # a string, token ids, both mixed, {"prompt_string": ...}, or a list of those (then
    # one result per prompt)
    prompt: str | list[Any] | dict[str, Any] = ""
    n_predict: int = -1
    stream: bool = False
    stop: str | list[str] | None = None
    seed: int | None = None
    grammar: str | None = None
    json_schema: dict[str, Any] | None = None
    n_probs: int = 0  # negative: none, as llama-server reads it
    cache_prompt: bool = True
    # code completion: the least indentation of later lines, a time limit (line_limits)
    n_indent: int = 0
    t_max_predict_ms: float = 0
    # the result's fields, "a/b" naming a nested one (non-streamed results only)
    response_fields: list[str] | None = None
    timings_per_token: bool = False  # `timings` on every streamed chunk
    ignore_eos: bool = False
    samplers: str | list[str] | None = None
    logit_bias: list[list[Any]] | dict[str, Any] | None = None
    return_tokens: bool = False
    post_sampling_probs: bool = False
    # llama-server's slot for the request: the engine runs it in a free slot of its own,
    # and the server files its tokens under this one (for /slots/{id}?action=save)
    id_slot: int = -1
    # completions per prompt (llama-server's n_cmpl, alias n; 1 to the slot count)
    n_cmpl: int | None = None
    n: int | None = None


class TokenizeRequest(OpenModel):
    model: str | None = None
    content: str = ""
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(OpenModel):
    model: str | None = None
    tokens: list[int] = Field(default_factory=list)


class TemplateRequest(OpenModel):
    model: str | None = None
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None


class EmbeddingContentRequest(OpenModel):
    model: str | None = None
    # `input` (OpenAI's name) is taken too, as llama-server takes it
    content: str | list[str] | list[int] | list[list[int]] = Field(
        validation_alias=AliasChoices("content", "input")
    )
    embd_normalize: int = 2


class RerankRequest(OpenModel):
    model: str | None = None
    query: str = Field(min_length=1)
    documents: list[str] = Field(min_length=1)
    top_n: int | None = Field(None, ge=1)
    return_documents: bool = False


def _prompt_ids(lm: Loaded, prompt: str | list[int | str]) -> list[int]:
    if isinstance(prompt, str):
        return encode_prompt(lm, prompt)
    ids: list[int] = []
    for i, part in enumerate(prompt):
        if isinstance(part, str):
            ids += lm.model.tokenize(part, add_special=(i == 0), parse_special=True)
        else:
            ids.append(part)
    n_vocab = lm.model.tokenizer.vocab_size
    bad = [t for t in ids if not 0 <= t < n_vocab]
    if bad:
        raise ApiError(400, f"token id {bad[0]} is outside the vocabulary (0..{n_vocab - 1})")
    return ids


def _subprompt(lm: Loaded, p: Any) -> list[int]:
    if isinstance(p, dict):
        if p.get("multimodal_data"):  # base64 images, one per <__media__> in the text
            data, text = p["multimodal_data"], p.get("prompt_string")
            if not isinstance(data, list) or not all(isinstance(x, str) for x in data):
                raise ApiError(400, "multimodal_data must be a list of base64 strings")
            if not isinstance(text, str):
                raise ApiError(400, "with multimodal_data, prompt_string must be a string")
            images = [V.decode_base64(x, "multimodal_data") for x in data]
            return V.image_prompt(lm, text, images)[0]
        p = p.get("prompt_string")
        if not isinstance(p, (str, list)):
            raise ApiError(400, "a prompt object needs a prompt_string", param="prompt")
    if isinstance(p, list) and not all(isinstance(x, (int, str)) for x in p):
        raise ApiError(400, "a prompt list holds token ids and strings", param="prompt")
    return _prompt_ids(lm, p)


def prompt_list(lm: Loaded, prompt: Any) -> list[list[int]]:
    """The token ids of each prompt, split as llama-server's tokenize_input_prompts
    splits them: a list with a token id at its top level is one prompt (ids, or ids and
    strings mixed); any other list is several."""
    if isinstance(prompt, list) and not any(isinstance(x, int) for x in prompt):
        if not prompt:
            raise ApiError(400, "the prompt list is empty", param="prompt")
        return [_subprompt(lm, p) for p in prompt]
    return [_subprompt(lm, prompt)]


def timings(g: TextGen) -> dict[str, float]:
    """llama-server's `timings`: cache_n prompt tokens reused from the cache, prompt_n
    computed, predicted_n generated."""
    pm, dm = g.prompt_seconds * 1e3, g.decode_seconds * 1e3
    pn, dn = g.prompt_tokens - g.cached_tokens, g.predicted_tokens
    return {
        "cache_n": g.cached_tokens,
        "prompt_n": pn,
        "prompt_ms": pm,
        "prompt_per_token_ms": pm / pn if pn else 0.0,
        "prompt_per_second": pn / (pm / 1e3) if pm else 0.0,
        "predicted_n": dn,
        "predicted_ms": dm,
        "predicted_per_token_ms": dm / dn if dn else 0.0,
        "predicted_per_second": dn / (dm / 1e3) if dm else 0.0,
        **draft_timings(g.handle),  # speculative decoding: draft_n, draft_n_accepted
    }


def _stop_type(g: TextGen) -> str:
    if not g.prompt_ids:  # an empty prompt: nothing was generated, nothing stopped it
        return "none"
    if g.stop_sequence is not None:
        return "word"
    return "limit" if g.finish_reason == "length" else "eos"


def _bias(lm: Loaded, raw) -> tuple:
    """llama-server's logit_bias: [[token, bias], ...] or {token: bias}, a token given as
    an id or as a string (every token of the string, tokenised without special tokens,
    gets the bias; an object key that is all digits is an id), a bias of false bans it."""
    if raw is None:
        return ()
    items = raw.items() if isinstance(raw, dict) else raw
    out = []
    for item in items:
        try:
            tok, b = item
            if isinstance(b, bool) and b:
                raise TypeError
            b = -float("inf") if b is False else float(b)
        except (TypeError, ValueError):
            continue  # llama-server skips an entry that is not [token, bias]
        if isinstance(tok, str) and not (isinstance(raw, dict) and tok.isdigit()):
            ids = lm.model.tokenize(tok, add_special=False, parse_special=False)
            out += [(i, b) for i in ids]
        elif isinstance(tok, (int, str)) and not isinstance(tok, bool):
            out.append((int(tok), b))
        else:
            raise ApiError(400, f"logit_bias token {tok!r} is not an id or a string")
    return tuple(out)


@router.post("/completion", summary="Complete a prompt (llama.cpp)")
@router.post("/completions", include_in_schema=False)
async def completion(body: CompletionRequest, request: Request):
    st: ServerState = state(request)
    lm = await st.models.get(body.model, lenient=True)
    prompts = await off_loop(prompt_list, lm, body.prompt)
    return await complete(st, lm, body, prompts, request)


async def complete(
    st: ServerState, lm: Loaded, body: CompletionRequest, prompts: list[list[int]], request
):
    """llama-server's /completion (and /infill) of `prompts`: one result object, or a
    list of them (each with its `index`) when several prompts were sent."""
    params = extra_params(body.model_extra)
    if body.seed is not None and body.seed >= 0:
        params["seed"] = body.seed % (2**32)
    if body.samplers:
        params["samplers"] = body.samplers
    n_probs = max(0, body.n_probs)
    stop = [body.stop] if isinstance(body.stop, str) else body.stop
    if body.logit_bias:
        params["logit_bias"] = await off_loop(_bias, lm, body.logit_bias)
    sampler = make_sampler(**params)
    post = body.post_sampling_probs and n_probs > 0
    if post:
        post_probs.check(sampler, body.grammar is not None or body.json_schema is not None)
    stop_ids = frozenset() if body.ignore_eos else None
    n_slots = len(slots.occupants(st, lm))
    n_cmpl = body.n_cmpl if body.n_cmpl is not None else body.n if body.n is not None else 1
    if not 1 <= n_cmpl <= n_slots:
        raise ApiError(400, f"n_cmpl must be in [1, {n_slots}], not {n_cmpl}", param="n_cmpl")
    prompts = [ids for ids in prompts for _ in range(n_cmpl)]  # prompt by prompt
    # a slot past the last is no slot (llama-server takes any free one)
    pin = body.id_slot if len(prompts) == 1 and body.id_slot < n_slots else -1
    if body.n_predict == 0 and kept.supports_kv(lm.engine):
        outs = [await _evaluate(st, lm, i, ids, pin) for i, ids in enumerate(prompts)]
        return outs if len(outs) > 1 else outs[0]
    gens = []
    for ids in prompts:
        con = await st.constraint(lm, json_schema=body.json_schema, grammar=body.grammar)
        image = getattr(ids, "start", None)  # an image prompt runs on its own (serve.vision)
        start = image or slots.restored_for(st, lm, ids)  # a restored slot's K/V, if they fit
        g = st.textgen(lm, ids, body.n_predict, sampler, stop, con, stop_ids, start, empty_ok=True)
        g.keeps = start is not None and image is None  # kept K/V (a fork): released at the end
        g.id_slot = pin
        g.cache_prompt = body.cache_prompt
        lines = LineLimits(body.n_indent, body.t_max_predict_ms)
        g.lines = lines if lines.active else None
        if n_probs:
            g.logprobs = post_probs.WIDTH if post else min(n_probs, MAX_N_PROBS)
        g.lora = request_lora(lm, body.model_extra)
        g.draft = request_draft(body.model_extra)
        gens.append(g)
    several = len(gens) > 1

    def probs(g: TextGen, rows) -> list[dict[str, Any]]:
        if post:
            return _post_probs(lm, g.sampler, rows, n_probs)
        return _probs(lm, rows)

    def final(i: int, content: str, tokens: list[int]) -> dict[str, Any]:
        g = gens[i]
        out = {
            "index": i,
            "content": content,
            "tokens": tokens,
            "id_slot": _slot_of(g),
            "stop": True,
            "model": lm.name,
            "tokens_predicted": g.predicted_tokens,
            "tokens_evaluated": g.prompt_tokens,
            "prompt": lm.model.detokenize(g.prompt_ids),
            # llama-server's flag for a generation the context cut short
            "truncated": g.finish_reason == "length"
            and g.prompt_tokens + g.completion_tokens >= lm.model.n_ctx,
            "stop_type": _stop_type(g),
            "stopping_word": g.stop_sequence or "",
            # the tokens the slot holds after it: the last one generated is not computed
            "tokens_cached": g.prompt_tokens + max(0, g.predicted_tokens - 1),
            "has_new_line": "\n" in g.text,
            "timings": timings(g),
            "generation_settings": slots.generation_params(
                g.sampler,
                body.n_predict,
                n_probs,
                body.ignore_eos,
                stream=body.stream,
                timings_per_token=body.timings_per_token,
                post_sampling_probs=body.post_sampling_probs,
                n_indent=body.n_indent,
                t_max_predict_ms=body.t_max_predict_ms,
                cache_prompt=body.cache_prompt,
                stop=stop or [],
            ),
        }
        return out

    async def release() -> None:  # the forks of restored slots keep K/V: let them go
        for g in gens:
            if g.keeps and g.handle is not None:
                await kept.discard(lm.engine, g.handle)
                g.keeps = False

    if not body.stream:
        try:
            texts = await asyncio.gather(*(g.collect(request) for g in gens))
        finally:
            await release()
        outs = []
        for i, (g, text) in enumerate(zip(gens, texts, strict=True)):
            out = final(i, text, _all_tokens(g) if body.return_tokens else [])
            if n_probs:  # the end-of-generation token listed too, as llama-server does
                out["completion_probabilities"] = probs(g, g.logprob_rows() + g.eos_rows())
            if body.response_fields:
                out = picked(out, body.response_fields)
            outs.append(out)
        return outs if several else outs[0]

    sent = [0] * len(gens)

    def new_tokens(i: int) -> list[int]:
        g = gens[i]
        out = g.token_ids[sent[i] :]
        sent[i] = len(g.token_ids)
        return list(out)

    async def events():
        try:
            async for item in _events():
                yield item
        finally:
            await release()

    async def _events():
        async for i, delta in merged(gens):
            g = gens[i]
            if delta is None:
                rest = new_tokens(i), g.take_logprobs()
                if g.eos is not None:  # its own chunk, empty text, as llama-server sends it
                    eos = partial(i, "", [*rest[0], g.eos[0]], rest[1] + g.eos_rows(), True)
                    yield sse(eos)
                    rest = [], []
                end = final(i, "", rest[0])
                if n_probs and rest[1]:
                    end["completion_probabilities"] = probs(g, rest[1])
                yield sse(end)
                continue
            yield sse(partial(i, delta, new_tokens(i), g.take_logprobs()))

    def partial(i: int, content: str, tokens: list[int], rows, eos: bool = False):
        g = gens[i]
        out = {"index": i, "content": content, "tokens": tokens, "stop": False}
        out["id_slot"] = _slot_of(g)
        out["tokens_predicted"] = sent[i] + eos  # those sent so far (the pump runs ahead)
        out["tokens_evaluated"] = g.prompt_tokens
        if body.timings_per_token:
            out["timings"] = timings(g)
        if n_probs:
            out["completion_probabilities"] = probs(g, rows)
        return out

    return sse_response(await primed(events()), "llamacpp")


def picked(out: dict[str, Any], fields: list[str]) -> dict[str, Any]:
    """llama-server's `response_fields`: only the named fields of a result, each under
    its name, "a/b" the field b of a; a name that is not there is left out."""
    got: dict[str, Any] = {}
    for name in fields:
        v: Any = out
        for key in name.split("/"):
            if not isinstance(v, dict) or key not in v:
                break
            v = v[key]
        else:
            got[name] = v
    return got


def _all_tokens(g: TextGen) -> list[int]:
    """The ids generated, the end-of-generation token that ended them last."""
    return [*g.token_ids, *([g.eos[0]] if g.eos is not None else [])]


def _slot_of(g: TextGen) -> int:
    if getattr(g, "id_slot", -1) >= 0:
        return g.id_slot
    slot = g.handle.slot if g.handle is not None else None
    return -1 if slot is None else slot


async def _evaluate(
    st: ServerState, lm: Loaded, index: int, ids: list[int], pin: int = -1
) -> dict[str, Any]:
    """n_predict 0: "no tokens will be generated but the prompt is evaluated into the
    cache" (llama-server's README): a prefill-only request whose K/V go to the prefix
    cache, and its slot holds the prompt (for /slots/{id}?action=save). An image prompt's
    images are evaluated too: their K/V go to the prefix cache under the image's content."""
    check_ids(lm, [ids])
    if not ids:
        raise RequestError("the prompt is empty (no tokens to evaluate)")
    image = getattr(ids, "prompt", None)  # an `ImagePrompt` (serve.vision)
    full, spans = (image.ids, image.images) if image is not None else (list(ids), ())
    t0 = time.perf_counter()
    seq = await kept.prefill(lm.engine, full, images=spans)
    handle = seq.handle
    seq.drop()
    ms = (time.perf_counter() - t0) * 1e3
    slot = pin if pin >= 0 else handle.slot
    if slot is not None:
        st.hold_slot(lm.name, slot, full, spans)
    cached = handle.usage.cached_tokens
    n = len(ids) - cached
    return {
        "index": index,
        "content": "",
        "tokens": [],
        "id_slot": slot if slot is not None else -1,
        "stop": True,
        "model": lm.name,
        "tokens_predicted": 0,
        "tokens_evaluated": len(ids),
        "prompt": lm.model.detokenize(ids),
        "truncated": False,
        "stop_type": "limit",
        "stopping_word": "",
        "tokens_cached": len(ids),  # what the slot holds: the whole prompt
        "has_new_line": False,
        "timings": {
            "cache_n": cached,
            "prompt_n": n,
            "prompt_ms": ms,
            "prompt_per_token_ms": ms / n if n else 0.0,
            "prompt_per_second": n / (ms / 1e3) if ms and n else 0.0,
            "predicted_n": 0,
            "predicted_ms": 0.0,
            "predicted_per_token_ms": 0.0,
            "predicted_per_second": 0.0,
        },
    }


def _post_probs(lm: Loaded, sampler, rows, n_probs: int) -> list[dict[str, Any]]:
    """llama-server's completion_probabilities with post_sampling_probs: `prob` and
    `top_probs` after the sampler chain (`llamay.serve.post_probs`)."""
    tok = lm.model.tokenizer

    def entry(i: int, p: float) -> dict[str, Any]:
        raw = tok.token_to_piece(i, special=False)  # a control token: "", as llama-server
        return {"id": i, "token": raw.decode("utf-8", "replace"), "bytes": list(raw), "prob": p}

    out = []
    for t, _, alts in rows:
        p, top = post_probs.post_sampling(sampler, t, alts, n_probs)
        out.append({**entry(t, p), "top_probs": [entry(i, q) for i, q in top]})
    return out


def _probs(lm: Loaded, rows) -> list[dict[str, Any]]:
    """llama.cpp's completion_probabilities of rows (token id, logprob, alternatives)."""
    tok = lm.model.tokenizer

    def entry(i: int, lp: float) -> dict[str, Any]:
        raw = tok.token_to_piece(i, special=False)  # a control token: "", as llama-server
        return {"id": i, "token": raw.decode("utf-8", "replace"), "bytes": list(raw), "logprob": lp}

    return [
        {**entry(t, lp), "top_logprobs": [entry(i, a) for i, a in alts]} for t, lp, alts in rows
    ]


@router.post("/tokenize", summary="Tokenize text (llama.cpp)")
async def tokenize(body: TokenizeRequest, request: Request):
    lm = await state(request).models.get(body.model, lenient=True)
    tok = lm.model.tokenizer
    ids = await off_loop(
        tok.encode, body.content, add_special=body.add_special, parse_special=body.parse_special
    )
    if not body.with_pieces:
        return {"tokens": ids}
    pieces = []
    for i in ids:
        raw = tok.token_to_piece(i)
        try:
            piece: Any = raw.decode("utf-8")
        except UnicodeDecodeError:
            piece = list(raw)
        pieces.append({"id": i, "piece": piece})
    return {"tokens": pieces}


@router.post("/detokenize", summary="Detokenize token ids (llama.cpp)")
async def detokenize(body: DetokenizeRequest, request: Request):
    lm = await state(request).models.get(body.model, lenient=True)
    n_vocab = lm.model.tokenizer.vocab_size
    bad = [t for t in body.tokens if not 0 <= t < n_vocab]
    if bad:
        raise ApiError(400, f"token id {bad[0]} is outside the vocabulary (0..{n_vocab - 1})")
    return {"content": lm.model.detokenize(body.tokens)}


@router.post("/apply-template", summary="Render a chat with the model's template (llama.cpp)")
async def apply_template(body: TemplateRequest, request: Request):
    lm = await state(request).models.get(body.model, lenient=True)
    for i, m in enumerate(body.messages):
        if not isinstance(m.get("role"), str):
            raise ApiError(400, f"messages.{i}.role must be a string")
    return {"prompt": await off_loop(T.render_prompt, lm, body.messages, body.tools)}


@router.get("/health", summary="Readiness (llama.cpp): 503 while the models warm up")
async def health(request: Request):
    code, body = readiness.health(state(request))
    return JSONResponse(body, status_code=code) if code != 200 else body


def _engine_stats(st: ServerState) -> list[tuple[str, dict[str, Any]]]:
    return [(name, dict(lm.engine.stats())) for name, lm in list(st.models.loaded.items())]


@router.get(
    "/metrics",
    summary="Prometheus metrics (llama.cpp names plus llamay's)",
    response_class=PlainTextResponse,
)
async def metrics(request: Request):
    st: ServerState = state(request)
    m = st.metrics
    rows: list[tuple[str, str, str, float]] = [
        ("llamacpp:prompt_tokens_total", "counter", "Prompt tokens processed", m.prompt_tokens),
        ("llamacpp:tokens_predicted_total", "counter", "Tokens generated", m.completion_tokens),
        ("llamacpp:prompt_seconds_total", "counter", "Prompt processing time", m.prompt_seconds),
        ("llamacpp:tokens_predicted_seconds_total", "counter", "Generation time", m.decode_seconds),
        ("llamacpp:requests_processing", "gauge", "Requests generating now", m.in_flight),
        ("llamay_requests_total", "counter", "Generation requests finished", m.requests),
        (
            "llamay_prefix_cache_hit_tokens_total",
            "counter",
            "Prompt tokens served from the prefix cache",
            m.cached_tokens,
        ),
        ("llamay_models_loaded", "gauge", "Models loaded", len(st.models.loaded)),
        ("llamay_contexts", "gauge", "Contexts held (/v1/contexts)", len(live_contexts(st))),
        ("llamay_contexts_max", "gauge", "Most contexts held at once", st.max_contexts),
        (
            "llamay_context_ttl_seconds",
            "gauge",
            "Idle time before a context expires",
            st.context_ttl_s,
        ),
        ("llamay_contexts_expired_total", "counter", "Contexts expired unused", m.contexts_expired),
    ]
    stats = _engine_stats(st)
    queued = sum(int(s.get("queued", 0)) for _, s in stats)
    pages = sum(int(s.get("pages_used", s.get("kv_pages_used", 0))) for _, s in stats)
    held = sum(int(s.get("pages_held", 0)) for _, s in stats)
    drafted = sum(int(s.get("draft_tokens", 0)) for _, s in stats)
    accepted = sum(int(s.get("draft_accepted", 0)) for _, s in stats)
    rows += [
        ("llamay_draft_tokens_total", "counter", "Draft tokens proposed (speculative)", drafted),
        ("llamay_draft_accepted_total", "counter", "Draft tokens accepted", accepted),
        ("llamay_kv_pages_held", "gauge", "KV pages held by live sequences", held),
        ("llamacpp:requests_deferred", "gauge", "Requests waiting for a slot", queued),
        ("llamay_kv_pages_used", "gauge", "KV cache pages in use", pages),
    ]
    lines = []
    for name, kind, doc, value in rows:
        lines += [f"# HELP {name} {doc}", f"# TYPE {name} {kind}", f"{name} {float(value):g}"]
    return PlainTextResponse(
        "\n".join(lines) + "\n" + m.latency.render(),  # and the latency histograms
        media_type="text/plain; version=0.0.4; charset=utf-8",
    )


def _special_text(tok, kind: str) -> str:
    i = tok.vocab.special.get(kind)
    return tok.vocab.tokens[i] if i is not None and 0 <= i < len(tok.vocab.tokens) else ""


@router.get("/props", summary="Server and default model properties (llama.cpp)")
async def props(request: Request, model: str | None = None):
    """llama-server's /props for the default (or `?model=`) model: its context, slots,
    path, chat template and the default sampling settings."""
    st: ServerState = state(request)
    lm = await st.models.get(model, lenient=True)
    tok = lm.model.tokenizer
    defaults = slots.generation_params(make_sampler())
    return {
        "default_generation_settings": {"n_ctx": lm.model.n_ctx, "params": defaults},
        "total_slots": st.models.parallel,
        "model_alias": lm.name,
        "model_path": str(lm.known.path),
        "chat_template": tok.chat_template,
        "chat_template_caps": {"supports_tools": T.template_has_tools(lm)},
        "bos_token": _special_text(tok, "bos"),
        "eos_token": _special_text(tok, "eos"),
        "modalities": {
            "vision": getattr(lm.model, "projector", None) is not None,
            "audio": False,
            "video": False,
        },
        "media_marker": V.MEDIA_MARKER,
        # what llama-server's flags turn on: these are always served here
        "endpoint_slots": True,
        "endpoint_props": False,  # POST /props (changing settings) is not served
        "endpoint_metrics": True,
        "is_sleeping": False,
        "build_info": f"llamay {__version__}",
    }


@router.post("/embedding", summary="Embeddings (llama.cpp's own form)")
@router.post("/embeddings", include_in_schema=False)
async def embedding(body: EmbeddingContentRequest, request: Request):
    """llama-server's non-OpenAI embeddings: `[{index, embedding: [[...]]}]` per input,
    normalised by `embd_normalize` (2, Euclidean, by default); a model pooling none gives
    every token's unnormalised vector, as llama-server does."""
    lm = await state(request).models.get(body.model, lenient=True)
    model, c = lm.model, body.content
    items = [c] if isinstance(c, str) or (c and isinstance(c[0], int)) else c
    if not items or any(not x for x in items):
        raise RequestError("embedding content must not be empty")
    if model.pooling == "rank":
        raise RequestError(f"model {lm.name!r} is a reranker: use /v1/rerank")

    def tokenize():
        return [model.tokenize(x, parse_special=True) if isinstance(x, str) else x for x in items]

    prompts = await off_loop(tokenize)
    check_ids(lm, prompts)
    norm = -1 if model.pooling == "none" else body.embd_normalize

    def run():
        return [np.atleast_2d(model.embed(p, normalize=norm)).tolist() for p in prompts]

    vecs = await asyncio.get_running_loop().run_in_executor(None, run)
    return [{"index": i, "embedding": v} for i, v in enumerate(vecs)]


@router.post("/v1/rerank", summary="Rerank documents against a query")
@router.post("/rerank", include_in_schema=False)
@router.post("/reranking", include_in_schema=False)  # llama-server's name and alias
@router.post("/v1/reranking", include_in_schema=False)
async def rerank(body: RerankRequest, request: Request):
    """A cross-encoder reranker (llama.cpp's pooling_type 4, RANK, with the `cls.*` head:
    bge-reranker, jina-reranker) scores each query/document pair as one input, made as
    llama-server's format_rerank makes it (`"method": "rank"`). A model without a rank
    head gets the cosine of the query's and each document's pooled embeddings instead,
    and the response says so (`"method": "embedding_cosine"`)."""
    lm = await state(request).models.get(body.model, lenient=True)
    model = lm.model
    if model.has_rank_head:
        method = "rank"
        prompts = await off_loop(
            lambda: [model.rerank_tokens(body.query, d) for d in body.documents]
        )
        check_ids(lm, prompts)

        def run():
            return [float(model.embed(p, pooling="rank")[0]) for p in prompts]

        scores = await asyncio.get_running_loop().run_in_executor(None, run)
    else:
        method = "embedding_cosine"
        texts = [body.query, *body.documents]
        prompts = await off_loop(lambda: [model.tokenize(t) for t in texts])
        vecs = await embed_all(lm, prompts)
        scores = [float(np.dot(vecs[0], d)) for d in vecs[1:]]
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[: body.top_n or len(scores)]
    results = []
    for i in order:
        r: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
        if body.return_documents:
            r["document"] = {"text": body.documents[i]}
        results.append(r)
    n = sum(len(p) for p in prompts)
    return {
        "model": lm.name,
        "object": "list",
        "method": method,
        "results": results,
        "usage": {"prompt_tokens": n, "total_tokens": n},
    }
