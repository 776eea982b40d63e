"""Issue 19: the requests the peers' users send, exactly as their clients or curl send them,
answered as those APIs' references say."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.serve.conftest import running

CTX = 96  # a small context, so generating until it is full stays fast
MSGS = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def small_ctx(tiny_paths, serve_home):
    """The tiny llama with a 96-token context, one slot, no token cap."""
    from llamay.serve import create_app
    from llamay.serve.models import Models

    models = Models(
        {"tiny": tiny_paths["tiny"]}, n_ctx=CTX, parallel=1, use_store=False, default_keep_alive=-1
    )
    with running(create_app(models)) as s:
        yield s


@pytest.fixture(scope="module")
def http(small_ctx):
    with httpx.Client(base_url=small_ctx.url, timeout=300) as c:
        yield c


def test_no_token_limit_generates_until_the_context_is_full(http, tiny):
    """Defect 1: without max_tokens / n_predict / num_predict every peer generates to EOS
    or a full context (finish "length"; Ollama shifts a full window, for ten windows at
    most); llamay answered 400 (one KV page short)."""
    r = http.post("/v1/chat/completions", json={"model": "tiny", "messages": MSGS})
    assert r.status_code == 200, r.text
    u, choice = r.json()["usage"], r.json()["choices"][0]
    if choice["finish_reason"] == "length":
        assert u["prompt_tokens"] + u["completion_tokens"] == CTX
    else:  # the model's own end of turn came first
        assert choice["finish_reason"] == "stop"

    r = http.post("/completion", json={"prompt": "Once upon a time"})
    assert r.status_code == 200, r.text
    out = r.json()
    if out["stop_type"] == "limit":
        assert out["tokens_evaluated"] + out["tokens_predicted"] == CTX
        assert out["truncated"] is True  # llama-server: the context filled up

    r = http.post("/api/generate", json={"model": "tiny", "prompt": "Hi", "stream": False})
    assert r.status_code == 200, r.text
    out = r.json()
    if out["done_reason"] == "length":  # Ollama shifts a full window, for ten windows
        assert out["eval_count"] == 10 * CTX

    r = http.post("/v1/responses", json={"model": "tiny", "input": "Hi"})
    assert r.status_code == 200, r.text
    assert r.json()["status"] in ("completed", "incomplete")


def test_a_prompt_over_the_context_is_llama_servers_error_type(http):
    """Defect 7: llama-server's type for an overflowing prompt."""
    r = http.post("/completion", json={"prompt": "word " * 200, "n_predict": 1})
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "exceed_context_size_error"
    r = http.post("/v1/completions", json={"model": "tiny", "prompt": "word " * 200})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded"  # OpenAI's code


def test_bodies_without_content_type_are_json(http):
    """Defect 5: `curl -d '{...}'` sends application/x-www-form-urlencoded (Ollama's api.md
    examples all do); Ollama and llama-server parse the body as JSON anyway."""
    body = json.dumps(
        {
            "model": "tiny",
            "prompt": "Hi",
            "stream": False,
            "options": {"num_predict": 2, "temperature": 0},
        }
    )
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    r = http.post("/api/generate", content=body, headers=form)
    assert r.status_code == 200, r.text
    assert r.json()["eval_count"] == 2
    r = http.post(
        "/completion", content=json.dumps({"prompt": "Hi", "n_predict": 2, "temperature": 0})
    )
    assert r.status_code == 200, r.text
    assert r.json()["tokens_predicted"] == 2
    r = http.post("/api/generate", content=b"{not json", headers=form)
    assert r.status_code == 400


def test_model_null_or_any_name_when_one_model_is_served(http):
    """Defect 6: with one model, `"model": null` and any name (`gpt-3.5-turbo`, as
    llama-server's own examples send) mean that model."""
    for model in (None, "gpt-3.5-turbo"):
        r = http.post(
            "/v1/chat/completions", json={"model": model, "messages": MSGS, "max_tokens": 2}
        )
        assert r.status_code == 200, (model, r.text)
        assert r.json()["model"] == "tiny"


def test_llama_server_unprefixed_routes(http):
    """llama-server serves its OpenAI routes without /v1 too."""
    r = http.post("/chat/completions", json={"messages": MSGS, "max_tokens": 2})
    assert r.status_code == 200 and r.json()["object"] == "chat.completion"
    assert http.get("/models").json()["data"][0]["id"] == "tiny"
    r = http.post("/responses", json={"input": "Hi", "max_output_tokens": 2})
    assert r.status_code == 200 and r.json()["object"] == "response"
    r = http.post("/chat/completions", json={"messages": []})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def test_tools_reach_a_model_whose_template_has_none(server, tiny):
    """Defect 4: SmolLM2's template renders no tools; they were dropped (prompt_tokens equal
    with and without). Now the system message describes them, as llama-server's generic
    tool prompt does, and history calls are written the way it teaches."""
    from llamay.tok.chat import render_chat

    assert "tools" not in tiny.tokenizer.chat_template
    http = httpx.Client(base_url=server.url, timeout=120)
    plain = {"model": "tiny", "messages": MSGS, "max_tokens": 1}
    n_plain = http.post("/v1/chat/completions", json=plain).json()["usage"]["prompt_tokens"]
    r = http.post("/v1/chat/completions", json={**plain, "tools": [WEATHER]})
    assert r.json()["usage"]["prompt_tokens"] > n_plain + 20
    history = [
        *MSGS,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "rain"},
    ]
    shown = http.post("/apply-template", json={"messages": history, "tools": [WEATHER]})
    prompt = shown.json()["prompt"]
    system = prompt.split("<|im_end|>")[0]
    assert "get_weather" in system and "<tool_call>" in system  # described, with the format
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>' in prompt
    # the template itself (plain Jinja's rendering is the oracle) sees ordinary messages
    assert prompt.endswith(render_chat(tiny.tokenizer.chat_template, MSGS)[-30:])


@pytest.mark.parametrize("stream", [False, True])
def test_echo_with_logprobs_covers_the_prompt(server, tiny, stream):
    """Defect 9: with echo, the prompt's own tokens carry logprobs (the first none) and
    the generated tokens' text_offset starts after the echoed prompt."""
    import numpy as np
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    prompt = "Once upon a time"
    kw = dict(model="tiny", prompt=prompt, max_tokens=3, temperature=0, logprobs=1, echo=True)
    if stream:
        parts = [c.choices[0] for c in client.completions.create(stream=True, **kw) if c.choices]
        lps = [p.logprobs for p in parts if p.logprobs]
        tokens = [t for lp in lps for t in lp.tokens]
        values = [v for lp in lps for v in lp.token_logprobs]
        offsets = [o for lp in lps for o in lp.text_offset]
        text = "".join(p.text for p in parts)
    else:
        r = client.completions.create(**kw).choices[0]
        tokens, values, offsets, text = (
            r.logprobs.tokens,
            r.logprobs.token_logprobs,
            r.logprobs.text_offset,
            r.text,
        )
    ids = tiny.tokenize(prompt, add_special=True, parse_special=True)
    assert len(tokens) == len(ids) + 3 and values[0] is None
    logits = np.asarray(tiny.logits(ids), np.float64)
    logp = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
    for k in range(1, len(ids)):  # each prompt token given those before it
        assert values[k] == pytest.approx(logp[k - 1][ids[k]], abs=1e-4)
    echoed = tiny.detokenize(ids)
    assert text.startswith(echoed)
    assert offsets[len(ids)] == len(echoed)  # the first generated token's offset
    assert offsets == sorted(offsets)


def test_anthropic_thinking_is_accepted(small_ctx):
    """Missing feature: `thinking` (and thinking blocks in the history) instead of a 400;
    the answer validates as the SDK's typed Message."""
    import anthropic
    from anthropic.types import Message

    client = anthropic.Anthropic(base_url=small_ctx.url, api_key="x", max_retries=0)
    history = [
        *MSGS,
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "They greet me.", "signature": "sig"},
                {"type": "text", "text": "Hello!"},
            ],
        },
        {"role": "user", "content": "How are you?"},
    ]
    r = client.messages.create(
        model="tiny",
        max_tokens=2048,
        messages=history,
        thinking={"type": "enabled", "budget_tokens": 1024},
        extra_body={"temperature": 0},
    )
    Message.model_validate_json(r.model_dump_json())
    assert r.content and all(b.type == "text" for b in r.content)
    with pytest.raises(anthropic.BadRequestError, match="budget_tokens"):
        client.messages.create(
            model="tiny",
            max_tokens=1024,
            messages=MSGS,
            thinking={"type": "enabled", "budget_tokens": 1024},
        )


def test_ollama_raw_has_no_context_and_show_counts_parameters(server, tiny_paths):
    """Defect 8: "raw mode will not return a context" (api.md); show's model_info has
    general.parameter_count (here against gguf-py's reading of the file)."""
    import numpy as np
    import ollama
    from gguf import GGUFReader

    client = ollama.Client(host=server.url)
    r = client.generate(model="tiny", prompt="Hi", raw=True, options={"num_predict": 2})
    assert r.context is None
    assert client.generate(model="tiny", prompt="Hi", options={"num_predict": 2}).context
    info = client.show("tiny").modelinfo
    want = sum(int(np.prod(t.shape)) for t in GGUFReader(tiny_paths["tiny"]).tensors)
    assert info["general.parameter_count"] == want


def test_props_and_cors(http, tiny):
    """llama-server's /props (its web UI reads it first) and CORS preflight."""
    p = http.get("/props").json()
    assert p["default_generation_settings"]["n_ctx"] == CTX and p["total_slots"] == 1
    assert p["chat_template"] == tiny.tokenizer.chat_template
    assert p["default_generation_settings"]["params"]["top_k"] == 40  # llama.cpp's default
    pre = http.options(
        "/v1/chat/completions",
        headers={
            "Origin": "http://example.test",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type,authorization",
        },
    )
    assert pre.status_code == 200
    assert pre.headers["access-control-allow-origin"] in ("*", "http://example.test")
    assert "POST" in pre.headers["access-control-allow-methods"]
    r = http.get("/v1/models", headers={"Origin": "http://example.test"})
    assert r.headers["access-control-allow-origin"] == "*"


def test_a_cut_off_forced_tool_call_is_a_200_for_length(server):
    """Defect 3's last point: a forced (schema-constrained) call cut off by max_tokens is a
    200 finishing for length on every API, not a 400 after the generation."""
    import anthropic
    import openai
    from openai.types.chat import ChatCompletion

    oa = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    kw = dict(model="tiny", messages=MSGS, max_tokens=3, temperature=0, tools=[WEATHER])
    r = oa.chat.completions.create(tool_choice="required", **kw)
    ChatCompletion.model_validate_json(r.model_dump_json())
    assert r.choices[0].finish_reason == "length"
    chunks = list(oa.chat.completions.create(tool_choice="required", stream=True, **kw))
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"

    an = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    m = an.messages.create(
        model="tiny",
        max_tokens=3,
        messages=MSGS,
        tools=[{"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}],
        tool_choice={"type": "any"},
    )
    assert m.stop_reason == "max_tokens"

    tool = {"type": "function", **WEATHER["function"]}
    body = {"model": "tiny", "input": "Hi", "max_output_tokens": 3, "tools": [tool]}
    r = httpx.post(server.url + "/v1/responses", json={**body, "tool_choice": "required"})
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "incomplete"
    assert r.json()["incomplete_details"] == {"reason": "max_output_tokens"}


def test_llama_server_grammar_and_json_schema_on_chat(server):
    """llama-server takes `grammar` and `json_schema` on /v1/chat/completions too."""
    import jsonschema

    body = {"model": "tiny", "messages": MSGS, "max_tokens": 12, "temperature": 0}
    r = httpx.post(
        server.url + "/v1/chat/completions", json={**body, "grammar": 'root ::= "yes" | "no"'}
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] in ("yes", "no")
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    r = httpx.post(
        server.url + "/v1/chat/completions", json={**body, "max_tokens": 40, "json_schema": schema}
    )
    assert r.status_code == 200, r.text
    if r.json()["choices"][0]["finish_reason"] == "stop":
        jsonschema.validate(json.loads(r.json()["choices"][0]["message"]["content"]), schema)
    r = httpx.post(server.url + "/v1/chat/completions", json={**body, "grammar": 5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "grammar"


def test_llama_server_grammar_on_completions(server):
    """llama-server's OpenAI completions honour `grammar` too (it was ignored: a 200 with free
    text), and a grammar over the limits is refused, not ignored."""
    body = {"model": "tiny", "prompt": "Answer:", "max_tokens": 12, "temperature": 0}
    r = httpx.post(
        server.url + "/v1/completions", json={**body, "grammar": 'root ::= "yes" | "no"'}
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] in ("yes", "no")
    r = httpx.post(
        server.url + "/v1/completions", json={**body, "grammar": "root ::= [a-z]{1000000000}"}
    )
    assert r.status_code == 400, r.text


def test_anthropic_a_reply_the_context_cut_short_says_so(small_ctx):
    """Anthropic's stop reasons: `max_tokens` for the request's limit, and
    `model_context_window_exceeded` when the context filled first (the client's own)."""
    import anthropic

    client = anthropic.Anthropic(base_url=small_ctx.url, api_key="x", max_retries=0)
    kw = dict(model="tiny", messages=MSGS, extra_body={"temperature": 0})
    r = client.messages.create(max_tokens=4000, **kw)
    used = r.usage.input_tokens + r.usage.cache_read_input_tokens + r.usage.output_tokens
    assert (r.stop_reason, used) == ("model_context_window_exceeded", CTX)
    with client.messages.stream(max_tokens=4000, **kw) as s:
        assert s.get_final_message().stop_reason == "model_context_window_exceeded"
    assert client.messages.create(max_tokens=4, **kw).stop_reason == "max_tokens"
