"""The official `openai` client against the server: greedy output equals `Model.generate`
for the same chat template, usage counts, streaming structure, stop strings, n > 1, tools
with tool_choice enforced, response_format, models, embeddings."""

from __future__ import annotations

import base64
import json

import jsonschema
import numpy as np
import openai
import pytest

from tests.serve.conftest import chat_prompt, greedy, piece, want_logprobs

MSGS = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_chat_greedy_equals_generate(client, tiny):
    r = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=12, temperature=0)
    prompt = chat_prompt(tiny, MSGS)
    assert r.choices[0].message.content == greedy(tiny, prompt, 12)
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == "length"
    ids = tiny.tokenize(prompt, add_special=True, parse_special=True)
    assert r.usage.prompt_tokens == len(ids)
    assert r.usage.completion_tokens == 12
    assert r.usage.total_tokens == len(ids) + 12
    assert r.object == "chat.completion" and r.model == "tiny"


def test_chat_stream_structure_and_usage(client, tiny):
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=MSGS,
            max_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == greedy(tiny, chat_prompt(tiny, MSGS), 10)
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [c.choices[0].finish_reason for c in finals] == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    assert len({c.id for c in chunks}) == 1


def test_system_and_multi_turn(client, tiny):
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": [{"type": "text", "text": "And again?"}]},
    ]
    r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=0)
    plain = [{**m, "content": "And again?"} if isinstance(m["content"], list) else m for m in msgs]
    assert r.choices[0].message.content == greedy(tiny, chat_prompt(tiny, plain), 6)


def test_stop_strings_cut_the_text(client, tiny):
    full = greedy(tiny, chat_prompt(tiny, MSGS), 16)
    stop = full[5:8]
    r = client.chat.completions.create(
        model="tiny", messages=MSGS, max_tokens=16, temperature=0, stop=[stop]
    )
    assert r.choices[0].message.content == full[: full.index(stop)]
    assert r.choices[0].finish_reason == "stop"
    s = client.chat.completions.create(
        model="tiny", messages=MSGS, max_tokens=16, temperature=0, stop=stop, stream=True
    )
    assert (
        "".join(c.choices[0].delta.content or "" for c in s if c.choices)
        == full[: full.index(stop)]
    )


def test_n_and_seed(client):
    r = client.chat.completions.create(
        model="tiny", messages=MSGS, max_tokens=6, temperature=1.0, n=3, seed=7
    )
    assert [c.index for c in r.choices] == [0, 1, 2]
    again = client.chat.completions.create(
        model="tiny", messages=MSGS, max_tokens=6, temperature=1.0, n=3, seed=7
    )
    assert [c.message.content for c in r.choices] == [c.message.content for c in again.choices]
    assert r.usage.completion_tokens == sum(6 for _ in r.choices)
    chunks = list(
        client.chat.completions.create(
            model="tiny", messages=MSGS, max_tokens=6, temperature=1.0, n=3, seed=7, stream=True
        )
    )
    texts = ["", "", ""]
    reasons = {}
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] += ch.delta.content or ""
            if ch.finish_reason:
                reasons[ch.index] = ch.finish_reason
    assert texts == [c.message.content for c in r.choices]
    assert reasons == {0: "length", 1: "length", 2: "length"}


def test_logit_bias_bans_the_greedy_token(client, tiny):
    prompt = chat_prompt(tiny, MSGS)
    ids = tiny.tokenize(prompt, add_special=True, parse_special=True)
    first = list(tiny.generation(ids, 1, __import__("llamay.sample").sample.GREEDY))[0]
    r = client.chat.completions.create(
        model="tiny", messages=MSGS, max_tokens=1, temperature=0, logit_bias={str(first): -100}
    )
    assert r.choices[0].message.content != tiny.detokenize([first])


def test_completions_legacy(client, tiny):
    r = client.completions.create(
        model="tiny", prompt="Once upon a time", max_tokens=8, temperature=0
    )
    assert r.choices[0].text == greedy(tiny, "Once upon a time", 8)
    assert r.usage.prompt_tokens == len(tiny.tokenize("Once upon a time", parse_special=True))
    s = client.completions.create(
        model="tiny", prompt="Once upon a time", max_tokens=8, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in s) == r.choices[0].text


def test_response_format_json_schema(client):
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": False,
    }
    r = client.chat.completions.create(
        model="tiny",
        messages=MSGS,
        max_tokens=40,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    )
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 8},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
    },
}


@pytest.mark.parametrize("stream", [False, True])
def test_named_tool_choice_is_enforced(client, stream, server):
    served = _served(server)
    kw = dict(
        model="tiny",
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        max_tokens=60,
        temperature=0,
        tools=[TIME, WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    r = client.chat.completions.create(**kw)
    assert r.choices[0].finish_reason == "tool_calls"
    call = r.choices[0].message.tool_calls[0]
    name, args = call.function.name, call.function.arguments
    assert call.id.startswith("call_")
    if stream:
        chunks = list(client.chat.completions.create(stream=True, **kw))
        calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
        reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
        assert reasons[-1] == "tool_calls"
        assert calls[0].id.startswith("call_") and calls[0].function.name == "get_weather"
        assert len(calls) > 2  # the arguments arrive in pieces, as they are generated
        # the pieces add up to the non-streaming answer's arguments
        assert "".join(c.function.arguments or "" for c in calls) == args
        served += 1  # the non-streaming request above
    assert name == "get_weather"
    jsonschema.validate(json.loads(args), WEATHER["function"]["parameters"])
    # the constrained request ran in the continuous-batching engine (no serial side engine)
    assert _served(server) == served + 1


def _served(server) -> int:
    from llamay.engine.scheduler import BatchEngine

    lm = server.state.models.loaded.get("tiny")
    if lm is None:
        return 0
    assert isinstance(lm.engine, BatchEngine)
    return lm.engine.stats()["served"]


def test_required_tool_choice_picks_a_tool(client):
    r = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "?"}],
        max_tokens=60,
        temperature=0,
        tools=[TIME, WEATHER],
        tool_choice="required",
    )
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name in ("get_time", "get_weather")
    json.loads(call.function.arguments)


def test_models_list_and_get(client):
    ids = [m.id for m in client.models.list()]
    assert ids == ["tiny", "bert"]
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")


def test_embeddings(client, tiny_paths):
    import numpy as np

    import llamay

    r = client.embeddings.create(model="bert", input=["hello world", "good night"])
    assert len(r.data) == 2 and r.usage.prompt_tokens > 0
    v = np.array(r.data[0].embedding)
    assert abs(np.linalg.norm(v) - 1) < 1e-4
    m = llamay.load(tiny_paths["bert"])
    want = m.embed(m.tokenize("hello world"))
    want = want / np.linalg.norm(want)
    np.testing.assert_allclose(v, want, atol=1e-4)
    b64 = client.embeddings.create(model="bert", input="hello world", encoding_format="base64")
    raw = b64.data[0].embedding
    got = np.frombuffer(base64.b64decode(raw), np.float32) if isinstance(raw, str) else raw
    np.testing.assert_allclose(np.asarray(got), v, atol=1e-5)


def test_errors_are_openai_shaped(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="nope", messages=MSGS)
    assert "nope" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=MSGS, temperature=5)
    assert e.value.param == "temperature"  # the field at fault, as OpenAI names it
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "word " * 3000}], max_tokens=1
        )
    assert "context" in e.value.message
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="bert", messages=MSGS, max_tokens=1)
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model="tiny", input="x")


def test_responses_api(client, tiny):
    r = client.responses.create(
        model="tiny",
        input="Name three colours.",
        max_output_tokens=8,
        temperature=0,
        instructions="Be brief.",
    )
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Name three colours."},
    ]
    want = greedy(tiny, chat_prompt(tiny, msgs), 8)
    assert r.output_text == want
    assert r.usage.output_tokens == 8 and r.status == "incomplete"
    events = list(
        client.responses.create(
            model="tiny",
            input="Name three colours.",
            max_output_tokens=8,
            temperature=0,
            instructions="Be brief.",
            stream=True,
        )
    )
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-1] == "response.incomplete"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == want
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_responses_forced_function_call(client):
    tool = {
        "type": "function",
        "name": "get_weather",
        "description": "weather",
        "parameters": WEATHER["function"]["parameters"],
    }
    ask = dict(
        model="tiny",
        input="Weather in Oslo?",
        tools=[tool],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=60,
        temperature=0,
    )
    r = client.responses.create(**ask)
    call = r.output[0]
    assert call.type == "function_call" and call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), tool["parameters"])
    stream = client.responses.create(
        **ask,
        stream=True,
    )
    events = list(stream)
    pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(pieces) > 1 and "".join(pieces) == call.arguments  # streamed as generated
    final = events[-1].response.output[0]
    assert final.name == "get_weather" and final.arguments == call.arguments
    assert call.status == final.status == "completed"
    # cut by max_output_tokens: the call's item is incomplete, as the response is
    cut = client.responses.create(**{**ask, "max_output_tokens": 8})
    assert (cut.status, cut.output[0].status) == ("incomplete", "incomplete")
    events = list(client.responses.create(**{**ask, "max_output_tokens": 8}, stream=True))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.output[0].status == "incomplete"


TIME_TOOL = {"type": "function", "name": "get_time", "parameters": TIME["function"]["parameters"]}


def test_responses_with_tools_stream_text_as_it_comes(client):
    ask = dict(model="tiny", input="Hi", tools=[TIME_TOOL], max_output_tokens=6, temperature=0)
    whole = client.responses.create(**ask)
    assert whole.status == "incomplete" and whole.output[0].type == "message"
    events = list(client.responses.create(stream=True, **ask))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 1 and "".join(deltas) == whole.output_text
    assert events[-1].type == "response.incomplete"  # as the response's own status says
    assert events[-1].response.output_text == whole.output_text


def test_responses_a_call_after_text_streams_the_text_then_the_call(client):
    ask = dict(
        model="tiny",
        input="What time is it?",
        tools=[TIME_TOOL],
        max_output_tokens=64,
        temperature=0,
        extra_body={"grammar": TEXT_THEN_CALL_GBNF},
    )
    whole = client.responses.create(**ask)
    assert [o.type for o in whole.output] == ["message", "function_call"]
    assert whole.output_text == "Let me check." and whole.output[1].name == "get_time"
    events = list(client.responses.create(stream=True, **ask))
    kinds = [e.type for e in events]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text.strip() == "Let me check." and "<tool_call>" not in text
    assert kinds.index("response.function_call_arguments.delta") > kinds.index(
        "response.output_text.done"
    )
    final = events[-1]
    assert final.type == "response.completed"
    assert [o.type for o in final.response.output] == ["message", "function_call"]
    assert final.response.output[1].name == "get_time"
    assert json.loads(final.response.output[1].arguments) == {}


def test_parallel_tool_calls_false_is_one_call(client):
    call = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n'
    kw = _written_by_grammar(call * 2)
    r = client.chat.completions.create(**kw)
    assert len(r.choices[0].message.tool_calls) == 2  # parallel calls by default
    r = client.chat.completions.create(parallel_tool_calls=False, **kw)
    assert [c.function.name for c in r.choices[0].message.tool_calls] == ["get_time"]
    chunks = list(client.chat.completions.create(parallel_tool_calls=False, stream=True, **kw))
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert len(calls) == 1
    ask = dict(model="tiny", input="Time?", tools=[TIME_TOOL], max_output_tokens=64)
    ask |= dict(temperature=0, extra_body=kw["extra_body"], parallel_tool_calls=False)
    out = client.responses.create(**ask).output
    assert [o.type for o in out] == ["function_call"]


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs_equal_the_logits(client, tiny, stream):
    kw = dict(model="tiny", messages=MSGS, max_tokens=6, temperature=0, logprobs=True)
    if stream:
        chunks = list(client.chat.completions.create(stream=True, top_logprobs=3, **kw))
        content = [
            c
            for ch in chunks
            if ch.choices and ch.choices[0].logprobs
            for c in ch.choices[0].logprobs.content
        ]
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert sum(1 for ch in chunks if ch.choices and ch.choices[0].logprobs) > 1  # streamed
    else:
        r = client.chat.completions.create(top_logprobs=3, **kw)
        content, text = r.choices[0].logprobs.content, r.choices[0].message.content
    ids = tiny.tokenize(chat_prompt(tiny, MSGS), add_special=True, parse_special=True)
    toks, want = want_logprobs(tiny, ids, 6)
    assert [c.token for c in content] == [piece(tiny, t) for t in toks]
    assert "".join(c.token for c in content) == text
    for c, t, row in zip(content, toks, want, strict=True):
        assert c.logprob == pytest.approx(row[t], abs=1e-4)
        best = np.argsort(-row, kind="stable")[:3]
        assert [a.token for a in c.top_logprobs] == [piece(tiny, i) for i in best]
        np.testing.assert_allclose([a.logprob for a in c.top_logprobs], row[best], atol=1e-4)
    # logprobs without top_logprobs: the token's own only
    r = client.chat.completions.create(**kw)
    assert [len(c.top_logprobs) for c in r.choices[0].logprobs.content] == [0] * 6
    assert r.choices[0].logprobs.content[0].logprob == pytest.approx(want[0][toks[0]], abs=1e-4)


def test_legacy_top_logprobs_always_hold_the_sampled_token(client):
    """OpenAI: "The API will always return the logprob of the sampled token, so there may
    be up to logprobs+1 elements" (a draw at a high temperature leaves the top one)."""
    kw = dict(model="tiny", prompt="Hello", max_tokens=8, temperature=1.5, logprobs=1)
    outside = 0
    for seed in (1, 2, 3):
        lp = client.completions.create(seed=seed, **kw).choices[0].logprobs
        for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
            assert top[token] == value and len(top) <= 2
            outside += len(top) == 2
    assert outside  # some draws were not the most likely token


@pytest.mark.parametrize("stream", [False, True])
def test_legacy_logprobs_equal_the_logits(client, tiny, stream):
    prompt = "Once upon a time"
    kw = dict(model="tiny", prompt=prompt, max_tokens=5, temperature=0, logprobs=2)
    if stream:
        parts = [c.choices[0] for c in client.completions.create(stream=True, **kw) if c.choices]
        lps = [p.logprobs for p in parts if p.logprobs]
        assert len(lps) > 1
        tokens = [t for lp in lps for t in lp.tokens]
        values = [v for lp in lps for v in lp.token_logprobs]
        tops = [t for lp in lps for t in lp.top_logprobs]
        offsets = [o for lp in lps for o in lp.text_offset]
        text = "".join(p.text for p in parts)
    else:
        r = client.completions.create(**kw).choices[0]
        lp, text = r.logprobs, r.text
        tokens, values, tops, offsets = (
            lp.tokens,
            lp.token_logprobs,
            lp.top_logprobs,
            lp.text_offset,
        )
    toks, want = want_logprobs(tiny, tiny.tokenize(prompt, parse_special=True), 5)
    assert tokens == [piece(tiny, t) for t in toks] and "".join(tokens) == text
    assert offsets == [len("".join(tokens[:k])) for k in range(5)]
    for v, top, t, row in zip(values, tops, toks, want, strict=True):
        assert v == pytest.approx(row[t], abs=1e-4)
        best = np.argsort(-row, kind="stable")[:2]
        assert list(top) == [piece(tiny, i) for i in best]
        np.testing.assert_allclose(list(top.values()), row[best], atol=1e-4)


def test_auto_tools_stream_plain_answers(client):
    kw = dict(model="tiny", messages=MSGS, max_tokens=8, temperature=0, tools=[TIME, WEATHER])
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(stream=True, **kw))
    parts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    if whole.choices[0].message.tool_calls is None:
        assert "".join(parts) == whole.choices[0].message.content
        assert len(parts) > 1  # streamed, not sent whole
        assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_auto_calls_pass_text_until_a_call_begins():
    from llamay.serve.tools import AutoCalls, parse_calls, text_around_calls

    call = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    reply = "Let me check.\n" + call + "\nDone."
    for cut in range(1, len(reply)):  # every split of the reply into two deltas
        auto = AutoCalls({"get_time"})
        sent = auto.feed(reply[:cut]) + auto.feed(reply[cut:]) + auto.flush()
        assert sent == "Let me check.\n" and auto.holding
        assert auto.held == call + "\nDone."
    assert parse_calls(reply, {"get_time"}) == [{"name": "get_time", "arguments": {}}]
    assert text_around_calls(reply) == "Let me check.\n\nDone."
    # a start of the marker that never becomes one is text at the end; "<" alone too
    for text in ("a < b", "see <tool", "<tool_calls are fun"):
        auto = AutoCalls({"get_time"})
        assert "".join(auto.feed(c) for c in text) + auto.flush() == text
        assert not auto.holding
    # a reply that opens with a JSON object is held whole; no tools: nothing is held
    auto = AutoCalls({"get_time"})
    assert auto.feed("  ") + auto.feed('{"name"') == "" and auto.held == '  {"name"'
    auto = AutoCalls(set())
    assert auto.feed(call) == call and not auto.holding


#: a reply that says something, then calls get_time (a grammar makes the tiny model write
#: it: llama-server's `grammar` field)
TEXT_THEN_CALL = 'Let me check.\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
TEXT_THEN_CALL_GBNF = "root ::= " + json.dumps(TEXT_THEN_CALL)


def _written_by_grammar(reply: str) -> dict:
    """A chat request with get_time on auto whose reply a GBNF grammar writes."""
    grammar = "root ::= " + json.dumps(reply)
    return dict(model="tiny", messages=MSGS, max_tokens=64, temperature=0, tools=[TIME],
                extra_body={"grammar": grammar})  # fmt: skip


def test_a_call_after_text_is_a_call_with_that_text(client):
    kw = _written_by_grammar(TEXT_THEN_CALL)
    whole = client.chat.completions.create(**kw).choices[0]
    assert whole.message.content == "Let me check."
    assert [c.function.name for c in whole.message.tool_calls] == ["get_time"]
    assert whole.finish_reason == "tool_calls"
    chunks = list(client.chat.completions.create(stream=True, **kw))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    text = "".join(d.content or "" for d in deltas)
    assert text.strip() == "Let me check." and "<tool_call>" not in text
    calls = [tc for d in deltas for tc in d.tool_calls or []]
    assert [c.function.name for c in calls] == ["get_time"]
    assert json.loads(calls[0].function.arguments) == {}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
