"""The real SmolLM2-135M-Instruct behind the server: greedy chat through each official
client equals `Model.generate` with the model's own template; a named tool call is
returned and validates against its schema (short outputs: SmolLM2 decodes a few tokens/s
on CPU)."""

from __future__ import annotations

import json

import anthropic
import jsonschema
import ollama
import openai
import pytest

import llamay
from llamay.serve import create_app
from llamay.serve.models import Models
from tests.serve.conftest import chat_prompt, greedy, running

pytestmark = [pytest.mark.model, pytest.mark.slow]

MSGS = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def smol(smollm2_path):
    return llamay.load(smollm2_path)


@pytest.fixture(scope="module")
def smol_server(smollm2_path, serve_home):
    app = create_app(Models({"smollm2": smollm2_path}, use_store=False, default_keep_alive=-1))
    with running(app) as s:
        yield s


def test_three_clients_equal_generate(smol, smol_server):
    want = greedy(smol, chat_prompt(smol, MSGS), 8)
    assert "Paris" in want
    oa = openai.OpenAI(base_url=smol_server.url + "/v1", api_key="x", max_retries=0)
    r = oa.chat.completions.create(model="smollm2", messages=MSGS, max_tokens=8, temperature=0)
    assert r.choices[0].message.content == want
    ol = ollama.Client(host=smol_server.url)
    o = ol.chat(model="smollm2", messages=MSGS, options={"temperature": 0, "num_predict": 8})
    assert o.message.content == want
    an = anthropic.Anthropic(base_url=smol_server.url, api_key="x", max_retries=0)
    a = an.messages.create(
        model="smollm2", max_tokens=8, messages=MSGS, extra_body={"temperature": 0}
    )
    assert a.content[0].text == want
    prompt = a.usage.input_tokens + a.usage.cache_read_input_tokens  # Anthropic's split
    assert r.usage.prompt_tokens == o.prompt_eval_count == prompt


def test_named_tool_call_validates(smol_server):
    params = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
        "additionalProperties": False,
    }
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather in a city",
                "parameters": params,
            },
        }
    ]
    oa = openai.OpenAI(base_url=smol_server.url + "/v1", api_key="x", max_retries=0)
    r = oa.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        max_tokens=40,
        temperature=0,
        tools=tools,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), params)
