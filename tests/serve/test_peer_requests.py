"""Requests the peers accept, as their official clients send them, answered with the
peers' semantics (found by driving the server with those clients, session 22):

- a final assistant message is a prefill the reply continues: Anthropic's documented
  prefill, llama-server's `--prefill-assistant` (on by default), an Ollama template's
  last assistant message; Anthropic refuses one ending in whitespace;
- an explicit null is the field's default (OpenAI's nullable `n`, `stream`, `echo`;
  llama.cpp's `json_value`; Ollama's Go pointers), as wrappers send it;
- Anthropic's `usage.input_tokens` leaves out the cache reads, and a stream's final
  usage (`message_delta`, cumulative) equals the whole message's;
- Anthropic's `thinking: {"type": "adaptive"}` (the client's types; `enabled` is
  deprecated for it);
- the Responses API's `include: ["message.output_text.logprobs"]` with `top_logprobs`,
  an empty `input` refused, a cut-off message item marked incomplete, replayed
  `reasoning` items taken, OpenAI's item id prefixes and `parallel_tool_calls` default;
- a server started with one model (`-m`) beside a store takes any unknown model name on
  the OpenAI and Anthropic routes as that model, as llama-server.

The oracle for every text is the tiny model itself, run directly on the prompt the
peer's semantics define (its chat template over the earlier messages, then the prefill)."""

from __future__ import annotations

import anthropic
import httpx
import numpy as np
import ollama
import openai
import pytest

from tests.serve.conftest import chat_prompt, greedy, piece, want_logprobs

ASK = [{"role": "user", "content": "Give me a JSON object describing a cat."}]
PREFILL = '{"name": "'


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=300) as c:
        yield c


def _continued(tiny, n: int) -> str:
    """What the model writes after the template's generation prompt and the prefill."""
    return greedy(tiny, chat_prompt(tiny, ASK) + PREFILL, n)


def test_a_final_assistant_message_is_continued_on_every_chat_api(server, oai, claude, http, tiny):
    msgs = [*ASK, {"role": "assistant", "content": PREFILL}]
    want = _continued(tiny, 10)
    # llama-server's /apply-template shows the prompt: the turn left open after the prefill
    r = http.post("/apply-template", json={"messages": msgs})
    assert r.json()["prompt"] == chat_prompt(tiny, ASK) + PREFILL

    got = oai.chat.completions.create(model="tiny", messages=msgs, max_tokens=10, temperature=0)
    assert got.choices[0].message.content == want

    m = claude.messages.create(
        model="tiny", max_tokens=10, messages=msgs, extra_body={"temperature": 0}
    )
    assert m.content[0].text == want  # Anthropic returns the continuation only

    parts = [*ASK, {"role": "assistant", "content": [{"type": "text", "text": PREFILL}]}]
    m = claude.messages.create(
        model="tiny", max_tokens=10, messages=parts, extra_body={"temperature": 0}
    )
    assert m.content[0].text == want

    c = ollama.Client(host=server.url)
    r = c.chat(model="tiny", messages=msgs, options={"num_predict": 10, "temperature": 0})
    assert r.message.content == want

    # an assistant turn that called a tool is history, not a prefill
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    closed = [*ASK, {"role": "assistant", "content": "", "tool_calls": [call]}]
    r = http.post("/apply-template", json={"messages": closed})
    assert r.json()["prompt"] == chat_prompt(tiny, closed)


def test_anthropic_refuses_a_prefill_ending_in_whitespace(claude):
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(
            model="tiny", max_tokens=4, messages=[*ASK, {"role": "assistant", "content": "A "}]
        )
    assert "trailing whitespace" in str(e.value)


def test_explicit_nulls_are_the_defaults(oai, http, tiny):
    want = greedy(tiny, chat_prompt(tiny, ASK), 4)
    r = oai.chat.completions.create(
        model="tiny", messages=ASK, max_tokens=4, temperature=0, n=None, stream=None
    )
    assert [c.message.content for c in r.choices] == [want]  # n null: one choice, no stream
    r = oai.completions.create(model="tiny", prompt="Hi", max_tokens=3, temperature=0, echo=None)
    assert r.choices[0].text == greedy(tiny, "Hi", 3)  # echo null: not echoed

    bodies = {
        "/v1/completions": {"model": "tiny", "prompt": "Hi", "n": None, "stream": None},
        "/completion": {"prompt": "Hi", "stream": None, "n_probs": None, "cache_prompt": None},
        "/v1/responses": {"model": "tiny", "input": "Hi", "stream": None},
        "/api/generate": {"model": "tiny", "prompt": "Hi", "stream": None, "raw": None},
        "/api/chat": {"model": "tiny", "messages": ASK, "stream": None},
    }
    limits = {"/v1/completions": "max_tokens", "/completion": "n_predict"}
    for path, body in bodies.items():
        body = {**body, "temperature": 0, limits.get(path, "max_output_tokens"): 3}
        if path.startswith("/api/"):
            body = {k: v for k, v in body.items() if k != "max_output_tokens"}
            body["options"] = {"num_predict": 3, "temperature": 0}
        r = http.post(path, json=body)
        assert r.status_code == 200, (path, r.text)
        # the default: OpenAI and llama.cpp answer whole, Ollama streams (its *bool nil)
        kind = "application/x-ndjson" if path.startswith("/api/") else "application/json"
        assert r.headers["content-type"].startswith(kind), path
    # a required field is still required
    assert http.post("/v1/completions", json={"model": "tiny", "prompt": None}).status_code == 400


def test_anthropic_usage_leaves_out_the_cache_reads_streamed_or_not(claude):
    msgs = [{"role": "user", "content": "Tell me about the sea, the sky and the hills. " * 4}]
    kw = dict(model="tiny", max_tokens=3, messages=msgs, extra_body={"temperature": 0})
    prompt = claude.messages.count_tokens(model="tiny", messages=msgs).input_tokens
    claude.messages.create(**kw)  # the prompt enters the prefix cache
    whole = claude.messages.create(**kw).usage
    assert whole.cache_read_input_tokens > 0
    assert whole.input_tokens + whole.cache_read_input_tokens == prompt
    with claude.messages.stream(**kw) as s:
        final = s.get_final_message().usage
    assert final.cache_read_input_tokens == whole.cache_read_input_tokens
    assert final.input_tokens == whole.input_tokens
    assert final.output_tokens == whole.output_tokens


def test_anthropic_adaptive_thinking_is_taken(claude, tiny):
    for thinking in ({"type": "adaptive"}, {"type": "between_tools"}):
        m = claude.messages.create(
            model="tiny",
            max_tokens=4,
            messages=ASK,
            thinking=thinking,
            extra_body={"temperature": 0},
        )
        assert m.content[0].text == greedy(tiny, chat_prompt(tiny, ASK), 4)
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model="tiny", max_tokens=4, messages=ASK, thinking={"type": "x"})


@pytest.mark.parametrize("stream", [False, True])
def test_responses_logprobs_equal_the_logits(oai, tiny, stream):
    kw = dict(model="tiny", input=ASK, max_output_tokens=5, temperature=0, top_logprobs=2)
    kw["include"] = ["message.output_text.logprobs"]
    if stream:
        events = list(oai.responses.create(stream=True, **kw))
        deltas = [e for e in events if e.type == "response.output_text.delta"]
        rows = [lp for e in deltas for lp in e.logprobs]
        assert sum(1 for e in deltas if e.logprobs) > 1  # streamed as the tokens came
        item = next(e for e in events if e.type == "response.output_item.done").item
        assert [lp.token for lp in item.content[0].logprobs] == [lp.token for lp in rows]
    else:
        r = oai.responses.create(**kw)
        rows = r.output[0].content[0].logprobs
        assert r.output[0].status == "incomplete" and r.status == "incomplete"  # cut at 5
    ids = tiny.tokenize(chat_prompt(tiny, ASK), add_special=True, parse_special=True)
    toks, want = want_logprobs(tiny, ids, 5)
    assert [lp.token for lp in rows] == [piece(tiny, t) for t in toks]
    for lp, t, row in zip(rows, toks, want, strict=True):
        assert lp.logprob == pytest.approx(row[t], abs=1e-4)
        best = np.argsort(-row, kind="stable")[:2]
        assert [a.token for a in lp.top_logprobs] == [piece(tiny, i) for i in best]
    # without the include: none
    kw.pop("include")
    assert oai.responses.create(**kw).output[0].content[0].logprobs == []


def test_responses_input_items(oai, tiny):
    with pytest.raises(openai.BadRequestError):
        oai.responses.create(model="tiny", input=[], max_output_tokens=2)
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": []}
    r = oai.responses.create(
        model="tiny", input=[reasoning, *ASK], max_output_tokens=4, temperature=0
    )
    assert r.output_text == greedy(tiny, chat_prompt(tiny, ASK), 4)
    assert r.parallel_tool_calls is True  # OpenAI's default
    items = oai.responses.input_items.list(r.id).data
    assert [i.id[:4] for i in items] == ["msg_"]  # OpenAI's prefix; the reasoning not listed


def test_any_name_means_the_one_model_served_beside_a_store(tiny_paths, serve_home, tiny):
    """`llamay serve -m tiny` over a store holding another model: as llama-server, an
    unknown name on the OpenAI and Anthropic routes means the model it was started with
    (the store's others stay loadable by name); Ollama's routes keep their 404, which
    `ollama run` answers with a pull."""
    from llamay.serve import create_app
    from llamay.serve.models import Models
    from llamay.store import create as store_create
    from tests.serve.conftest import running

    store_create("other", f"FROM {tiny_paths['tiny']}\n", progress=False)
    models = Models({"tiny": tiny_paths["tiny"]}, use_store=True, default_keep_alive=-1)
    with running(create_app(models)) as s, httpx.Client(base_url=s.url, timeout=300) as c:
        ids = [m["id"] for m in c.get("/v1/models").json()["data"]]
        assert "tiny" in ids and "other:latest" in ids
        want = greedy(tiny, chat_prompt(tiny, ASK), 3)
        body = {"model": "gpt-4o-mini", "messages": ASK, "max_tokens": 3, "temperature": 0}
        r = c.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["model"] == "tiny" and r.json()["choices"][0]["message"]["content"] == want
        r = c.post("/v1/messages", json={**body, "model": "claude-x"})
        assert r.status_code == 200 and r.json()["content"][0]["text"] == want
        r = c.post("/api/chat", json={**body, "model": "llama3", "stream": False})
        assert r.status_code == 404


def test_a_streamed_tool_call_accumulates_to_the_unstreamed_message(oai):
    # OpenAI opens a tool call's stream with `content: null`: the client's accumulated
    # message then has no content, as the unstreamed one has none
    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"enum": ["Paris", "Rome"]}},
                "required": ["city"],
            },
        },
    }
    kw = dict(
        model="tiny",
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        max_tokens=60,
        temperature=0,
        tools=[weather],
        tool_choice="required",
    )
    whole = oai.chat.completions.create(**kw).choices[0].message
    with oai.chat.completions.stream(**kw) as s:
        got = s.get_final_completion().choices[0].message
    assert whole.content is None and got.content is None
    assert [(c.function.name, c.function.arguments) for c in got.tool_calls] == [
        (c.function.name, c.function.arguments) for c in whole.tool_calls
    ]
    # a plain answer still opens with the role and an empty content, at once
    plain = dict(kw, tools=None, tool_choice=None, max_tokens=3)
    first = next(iter(oai.chat.completions.create(stream=True, **plain)))
    assert first.choices[0].delta.role == "assistant" and first.choices[0].delta.content == ""


def test_item_references_name_stored_input_and_output_items(oai, tiny):
    first = oai.responses.create(model="tiny", input="Name a colour.", max_output_tokens=5)
    (asked,) = oai.responses.input_items.list(first.id).data
    answer = first.output[0]
    again = "And another one?"
    r = oai.responses.create(
        model="tiny",
        input=[
            {"type": "item_reference", "id": asked.id},
            {"type": "item_reference", "id": answer.id},
            {"role": "user", "content": again},
        ],
        max_output_tokens=6,
        temperature=0,
    )
    msgs = [
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": again},
    ]
    assert r.output_text == greedy(tiny, chat_prompt(tiny, msgs), 6)
    # the stored request lists the items it referenced, under their own ids
    listed = oai.responses.input_items.list(r.id, order="asc").data
    assert [it.id for it in listed[:2]] == [asked.id, answer.id]

    with pytest.raises(openai.BadRequestError) as err:
        oai.responses.create(
            model="tiny",
            input=[{"type": "item_reference", "id": "msg_unknown"}],
            max_output_tokens=2,
        )
    assert "msg_unknown" in str(err.value)
