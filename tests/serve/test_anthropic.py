"""The official `anthropic` client against the server: messages (system, multi-turn,
stop_sequences) equal `Model.generate` for the same template, the streaming event sequence,
usage, tools with tool_choice enforced, count_tokens, errors."""

from __future__ import annotations

import anthropic
import jsonschema
import pytest

from tests.serve.conftest import chat_prompt, greedy

MSGS = [{"role": "user", "content": "Tell me a joke."}]
# The client has no sampling parameters any more; the server still takes them.
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


def test_message_equals_generate(client, tiny):
    r = client.messages.create(
        model="tiny", max_tokens=10, messages=MSGS, extra_body=GREEDY, system="You are funny."
    )
    msgs = [{"role": "system", "content": "You are funny."}, *MSGS]
    prompt = chat_prompt(tiny, msgs)
    assert r.content[0].type == "text"
    assert r.content[0].text == greedy(tiny, prompt, 10)
    assert r.stop_reason == "max_tokens" and r.role == "assistant" and r.type == "message"
    n = len(tiny.tokenize(prompt, parse_special=True))
    assert r.usage.input_tokens + r.usage.cache_read_input_tokens == n
    assert r.usage.output_tokens == 10


def test_multi_turn_blocks_and_stop_sequences(client, tiny):
    msgs = [
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "More?"},
    ]
    plain = [{"role": "user", "content": "Hi"}, msgs[1], msgs[2]]
    full = greedy(tiny, chat_prompt(tiny, plain), 12)
    stop = full[3:6]
    r = client.messages.create(
        model="tiny", max_tokens=12, messages=msgs, extra_body=GREEDY, stop_sequences=[stop]
    )
    assert r.content[0].text == full[: full.index(stop)]
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == stop


def test_stream_event_sequence(client, tiny, server):
    events = list(
        client.messages.create(
            model="tiny", max_tokens=8, messages=MSGS, extra_body=GREEDY, stream=True
        )
    )
    kinds = [e.type for e in events]
    n = kinds.count("content_block_delta")
    assert kinds == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * n,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert text == greedy(tiny, chat_prompt(tiny, MSGS), 8)
    assert events[-2].usage.output_tokens == 8 and events[-2].delta.stop_reason == "max_tokens"
    with client.messages.stream(model="tiny", max_tokens=8, messages=MSGS, extra_body=GREEDY) as s:
        final = s.get_final_message()
    assert final.content[0].text == text and final.usage.output_tokens == 8
    # the wire also carries the ping (the client drops it)
    import httpx

    body = {"model": "tiny", "max_tokens": 2, "messages": MSGS, "stream": True, **GREEDY}
    wire = httpx.post(server.url + "/v1/messages", json=body, timeout=60).text
    names = [line[7:] for line in wire.splitlines() if line.startswith("event: ")]
    assert names[:3] == ["message_start", "content_block_start", "ping"]


TOOLS = [
    {
        "name": "get_time",
        "description": "now",
        "input_schema": {"type": "object", "properties": {}},
    },
    {
        "name": "lookup",
        "description": "find a word",
        "input_schema": {
            "type": "object",
            "properties": {"word": {"type": "string", "maxLength": 6}},
            "required": ["word"],
            "additionalProperties": False,
        },
    },
]


def test_forced_tool_use_streams_its_arguments(client):
    kw = dict(
        model="tiny",
        max_tokens=40,
        messages=MSGS,
        extra_body=GREEDY,
        tools=TOOLS,
        tool_choice={"type": "tool", "name": "lookup"},
    )
    r = client.messages.create(**kw)
    assert r.stop_reason == "tool_use"
    block = r.content[0]
    assert block.type == "tool_use" and block.name == "lookup" and block.id.startswith("toolu_")
    jsonschema.validate(block.input, TOOLS[1]["input_schema"])

    with client.messages.stream(**kw) as s:
        events = list(s)
        streamed = s.get_final_message()
    pieces = [
        e.delta.partial_json
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    ]
    assert len(pieces) > 1  # the arguments arrive as they are generated, not in one piece
    # the client's accumulator rebuilds the same message as the non-streaming answer
    assert _same(streamed, r)


def test_a_forced_call_cut_before_its_name_has_the_one_name_it_could_have(client):
    kw = dict(model="tiny", max_tokens=2, messages=MSGS, extra_body=GREEDY, tools=TOOLS)
    one = {"type": "tool", "name": "lookup"}
    r = client.messages.create(tool_choice=one, **kw)
    assert r.stop_reason == "max_tokens" and r.content[0].name == "lookup"
    with client.messages.stream(tool_choice=one, **kw) as s:
        assert s.get_final_message().content[0].name == "lookup"
    # any of two: the name is not known
    assert client.messages.create(tool_choice={"type": "any"}, **kw).content[0].name == ""


def _same(a, b) -> bool:
    strip = lambda m: [  # noqa: E731
        {k: v for k, v in c.model_dump().items() if k != "id"} for c in m.content
    ]
    # the prompt's tokens (input_tokens leave out the cache reads, which differ per call)
    counts = lambda m: (  # noqa: E731
        m.usage.input_tokens + m.usage.cache_read_input_tokens,
        m.usage.output_tokens,
    )
    return strip(a) == strip(b) and a.stop_reason == b.stop_reason and counts(a) == counts(b)


def test_auto_tools_stream_text_as_it_comes(client):
    kw = dict(model="tiny", max_tokens=12, messages=MSGS, extra_body=GREEDY, tools=TOOLS)
    r = client.messages.create(**kw)
    assert r.content[0].type == "text"  # the tiny model's answer is no tool call
    with client.messages.stream(**kw) as s:
        deltas = [e for e in s if e.type == "content_block_delta"]
        streamed = s.get_final_message()
    assert len(deltas) > 1 and all(d.delta.type == "text_delta" for d in deltas)
    assert _same(streamed, r)


def test_a_call_after_text_is_a_text_block_then_a_tool_use_block(client):
    from tests.serve.test_openai import TEXT_THEN_CALL_GBNF

    kw = dict(
        model="tiny",
        max_tokens=64,
        messages=MSGS,
        tools=TOOLS,
        extra_body={**GREEDY, "grammar": TEXT_THEN_CALL_GBNF},
    )
    r = client.messages.create(**kw)
    assert [b.type for b in r.content] == ["text", "tool_use"]
    assert r.content[0].text == "Let me check." and r.content[1].name == "get_time"
    assert r.stop_reason == "tool_use"
    with client.messages.stream(**kw) as s:
        text = "".join(e.delta.text for e in s if e.type == "content_block_delta"
                       and e.delta.type == "text_delta")  # fmt: skip
        streamed = s.get_final_message()
    assert text.strip() == "Let me check."
    assert [b.type for b in streamed.content] == ["text", "tool_use"]
    assert streamed.content[1].name == "get_time" and streamed.content[1].input == {}
    assert streamed.stop_reason == "tool_use"


def test_tool_result_round_trip(client):
    msgs = [
        *MSGS,
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_time", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "noon"}],
        },
    ]
    r = client.messages.create(
        model="tiny", max_tokens=4, messages=msgs, extra_body=GREEDY, tools=TOOLS
    )
    assert r.usage.output_tokens <= 4


def test_output_format_json_schema(client):
    import json

    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "required": ["a"],
        "additionalProperties": False,
    }
    r = client.messages.create(
        model="tiny",
        max_tokens=30,
        messages=MSGS,
        extra_body=GREEDY,
        output_config={"format": {"type": "json_schema", "schema": schema}},
    )
    jsonschema.validate(json.loads(r.content[0].text), schema)


def test_count_tokens(client, tiny):
    r = client.messages.count_tokens(model="tiny", messages=MSGS, system="You are funny.")
    msgs = [{"role": "system", "content": "You are funny."}, *MSGS]
    assert r.input_tokens == len(tiny.tokenize(chat_prompt(tiny, msgs), parse_special=True))


def test_consecutive_turns_of_one_role_are_one_turn(client, tiny):
    """Anthropic combines consecutive user (or assistant) turns into one."""
    two = [{"role": "user", "content": "Hi"}, {"role": "user", "content": "What is 2+2?"}]
    one = [{"role": "user", "content": "Hi\n\nWhat is 2+2?"}]
    r = client.messages.count_tokens(model="tiny", messages=two)
    assert r.input_tokens == len(tiny.tokenize(chat_prompt(tiny, one), parse_special=True))
    got = client.messages.create(model="tiny", max_tokens=4, messages=two, extra_body=GREEDY)
    assert got.content[0].text == greedy(tiny, chat_prompt(tiny, one), 4)


def test_errors_are_anthropic_shaped(client):
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.create(model="nope", max_tokens=4, messages=MSGS)
    assert e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError, match="thinking"):
        client.messages.create(
            model="tiny",
            max_tokens=64,
            messages=MSGS,
            thinking={"type": "enabled", "budget_tokens": 32},
        )
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="tiny", max_tokens=0, messages=MSGS)
    assert e.value.body["error"]["type"] == "invalid_request_error"


def test_models_list_in_anthropics_shape(client, server):
    page = client.models.list()
    names = [m.id for m in page.data]
    assert names == [k.name for k in server.state.models.known()]
    assert page.has_more is False and (page.first_id, page.last_id) == (names[0], names[-1])
    one = client.models.retrieve(names[0])
    assert one.type == "model" and one.display_name == names[0]
    assert one.created_at.tzinfo is not None  # a datetime the client parsed
