"""The official `ollama` client against the server: generate/chat (streaming and not) equal
`Model.generate` for the same template, counts and durations, tags/show/ps/version, embed,
format, options, keep_alive, raw, and Ollama-shaped errors."""

from __future__ import annotations

import json

import jsonschema
import ollama
import pytest

from tests.serve.conftest import chat_prompt, greedy

MSGS = [{"role": "user", "content": "Why is the sky blue?"}]


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=server.url)


def test_generate_equals_generate(client, tiny):
    r = client.generate(
        model="tiny", prompt="Hello", options={"temperature": 0, "num_predict": 8}, stream=False
    )
    prompt = chat_prompt(tiny, [{"role": "user", "content": "Hello"}])
    assert r.response == greedy(tiny, prompt, 8)
    assert r.done and r.done_reason == "length"
    assert r.eval_count == 8
    assert r.prompt_eval_count == len(tiny.tokenize(prompt, parse_special=True))
    assert r.total_duration >= r.eval_duration > 0
    assert r.context[: r.prompt_eval_count] == tiny.tokenize(prompt, parse_special=True)
    assert len(r.context) == r.prompt_eval_count + 8


def test_generate_stream_raw_and_system(client, tiny):
    parts = list(
        client.generate(
            model="tiny",
            prompt="Once upon a time",
            raw=True,
            stream=True,
            options={"temperature": 0, "num_predict": 6},
        )
    )
    assert all(not p.done for p in parts[:-1]) and parts[-1].done
    assert "".join(p.response for p in parts) == greedy(tiny, "Once upon a time", 6)
    r = client.generate(
        model="tiny", prompt="Hi", system="Be terse.", options={"temperature": 0, "num_predict": 5}
    )
    msgs = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}]
    assert r.response == greedy(tiny, chat_prompt(tiny, msgs), 5)


def test_generate_with_go_template(client, tiny):
    tmpl = "<|im_start|>user\n{{ .Prompt }}<|im_end|>\n<|im_start|>assistant\n{{ .Response }}"
    r = client.generate(
        model="tiny", prompt="Hey", template=tmpl, options={"temperature": 0, "num_predict": 5}
    )
    assert r.response == greedy(tiny, "<|im_start|>user\nHey<|im_end|>\n<|im_start|>assistant\n", 5)


def test_chat_equals_generate_and_streams(client, tiny):
    r = client.chat(model="tiny", messages=MSGS, options={"temperature": 0, "num_predict": 8})
    want = greedy(tiny, chat_prompt(tiny, MSGS), 8)
    assert r.message.role == "assistant" and r.message.content == want
    parts = list(
        client.chat(
            model="tiny", messages=MSGS, stream=True, options={"temperature": 0, "num_predict": 8}
        )
    )
    assert "".join(p.message.content for p in parts) == want
    assert parts[-1].done and parts[-1].eval_count == 8 and parts[-1].done_reason == "length"


def test_stop_option(client, tiny):
    full = greedy(tiny, chat_prompt(tiny, MSGS), 12)
    stop = full[4:7]
    r = client.chat(
        model="tiny", messages=MSGS, options={"temperature": 0, "num_predict": 12, "stop": [stop]}
    )
    assert r.message.content == full[: full.index(stop)] and r.done_reason == "stop"


def test_format_schema(client):
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    r = client.chat(
        model="tiny", messages=MSGS, format=schema, options={"temperature": 0, "num_predict": 30}
    )
    jsonschema.validate(json.loads(r.message.content), schema)
    r = client.generate(
        model="tiny", prompt="x", format="json", options={"temperature": 0, "num_predict": 30}
    )
    assert r.response.startswith("{")  # JSON mode is an object (the random model may not close it)
    if r.done_reason == "stop":
        assert isinstance(json.loads(r.response), dict)


def test_tags_show_ps_version(client, tiny):
    tags = client.list()
    assert [m.model for m in tags.models] == ["tiny", "bert"]
    assert tags.models[0].details.family == "llama" and tags.models[0].size > 0
    show = client.show("tiny")
    assert show.template == tiny.tokenizer.chat_template
    assert show.modelinfo["general.architecture"] == "llama"
    assert "completion" in show.capabilities
    ps = client.ps()
    assert "tiny" in [m.model for m in ps.models]
    assert client._client.get("/api/version").json()["version"]


def test_embed(client):
    r = client.embed(model="bert", input=["a cat", "a dog"])
    assert len(r.embeddings) == 2 and len(r.embeddings[0]) > 0
    one = client.embeddings(model="bert", prompt="a cat")
    assert one.embedding == pytest.approx(r.embeddings[0], abs=1e-5)


def test_keep_alive_unload_and_reload(client, server):
    client.generate(model="bert", prompt="", keep_alive=0)
    assert "bert" not in server.state.models.loaded
    r = client.generate(model="tiny", prompt="", keep_alive="10m")
    assert r.done_reason == "load" and "tiny" in server.state.models.loaded


def test_unknown_options_are_ignored(client, tiny):
    """As Ollama does (its api.md's own example sends options this server has no use for,
    and newer Ollama adds more, e.g. draft_num_predict)."""
    options = {"temperature": 0, "num_predict": 6, "draft_num_predict": 2, "num_gpu": 1}
    r = client.generate(model="tiny", prompt="Hello", options=options, stream=False)
    prompt = chat_prompt(tiny, [{"role": "user", "content": "Hello"}])
    assert r.response == greedy(tiny, prompt, 6)


def test_errors_are_ollama_shaped(client):
    with pytest.raises(ollama.ResponseError) as e:
        client.generate(model="nope", prompt="hi")
    assert e.value.status_code == 404 and "nope" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.generate(model="tiny", prompt="hi", options={"top_k": "forty"})
    assert e.value.status_code == 400 and "top_k" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.generate(model="tiny", prompt="hi", keep_alive="soon")
    assert e.value.status_code == 400
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="tiny", messages=MSGS, think=True)
    assert e.value.status_code == 400 and "think" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.delete("nope:latest")
    assert e.value.status_code == 404


def test_store_endpoints(tiny_paths, serve_home, tiny):
    """create/copy/delete/pull over a server that serves the (temporary) store."""
    from llamay.serve import create_app
    from llamay.serve.models import Models
    from llamay.store import create as store_create
    from tests.serve.conftest import running

    store_create("tinystore", f"FROM {tiny_paths['tiny']}\n", progress=False)
    app = create_app(Models({}, use_store=True, default_keep_alive=-1))
    with running(app) as s:
        c = ollama.Client(host=s.url)
        assert "tinystore:latest" in [m.model for m in c.list().models]
        r = c.generate(model="tinystore", prompt="Hi", options={"temperature": 0, "num_predict": 3})
        assert r.eval_count == 3
        c.create(
            model="tinysys",
            from_="tinystore",
            system="Be brief.",
            parameters={"temperature": 0, "num_predict": 4},
        )
        assert "tinysys:latest" in [m.model for m in c.list().models]
        # the model's own system prompt and parameters apply
        r = c.chat(model="tinysys", messages=[{"role": "user", "content": "Hi"}])
        msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
        assert r.message.content == greedy(tiny, chat_prompt(tiny, msgs), 4)
        shown = c.show("tinysys")
        assert "temperature" in shown.parameters
        c.copy("tinystore", "tinycopy")
        assert "tinycopy:latest" in [m.model for m in c.list().models]
        c.delete("tinycopy")
        assert "tinycopy:latest" not in [m.model for m in c.list().models]
        with pytest.raises(ollama.ResponseError):
            c.create(model="evil", from_="/etc/passwd.gguf")
        # a pull from an unreachable loopback registry reports the error in the stream
        import httpx

        lines = httpx.post(
            s.url + "/api/pull",
            json={"model": "127.0.0.1:9/ns/none:latest", "insecure": True},
            timeout=60,
        ).text
        last = json.loads(lines.strip().splitlines()[-1])
        assert "error" in last


TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


def test_tools_stream_text_as_it_comes(client):
    kw = dict(
        model="tiny",
        messages=MSGS,
        tools=[TIME_TOOL],
        options={"temperature": 0, "num_predict": 8},
    )
    whole = client.chat(**kw)
    assert not whole.message.tool_calls  # the tiny model's answer is plain text
    parts = list(client.chat(stream=True, **kw))
    texts = [p.message.content for p in parts if p.message.content]
    assert len(texts) > 1 and "".join(texts) == whole.message.content


def test_tool_call_is_recognised_streaming_or_not(client):
    from llamay.serve.tools import call_schema

    # `format` pins the answer to a call's JSON, so the tiny model "calls" the tool
    kw = dict(
        model="tiny",
        messages=MSGS,
        tools=[TIME_TOOL],
        format=call_schema([TIME_TOOL["function"]]),
        options={"temperature": 0, "num_predict": 40},
    )
    whole = client.chat(**kw)
    (call,) = whole.message.tool_calls
    assert call.function.name == "get_time" and whole.message.content == ""
    jsonschema.validate(call.function.arguments, TIME_TOOL["function"]["parameters"])
    parts = list(client.chat(stream=True, **kw))
    calls = [c for p in parts for c in p.message.tool_calls or []]
    assert [c.model_dump() for c in calls] == [call.model_dump()]
    assert not any(p.message.content for p in parts)  # the call's JSON is not sent as text


def test_a_call_after_text_keeps_the_text(client, monkeypatch):
    """A reply that says something, then calls a tool: the text is the message's content,
    the call its tool_calls (streamed: the text as it comes, the call once whole). The
    generation is replaced by that reply (no grammar reaches Ollama's API to force it)."""
    from llamay.serve.core import TextGen

    call = '<tool_call>\n{"name": "get_time", "arguments": {"city": "Oslo"}}\n</tool_call>'
    reply = ["Let me ", "check.\n<tool", call[len("<tool") :]]

    async def said(self):
        for delta in reply:
            self.text += delta
            yield delta
        self.finish_reason = "stop"

    monkeypatch.setattr(TextGen, "stream", said)
    kw = dict(model="tiny", messages=MSGS, tools=[TIME_TOOL])
    whole = client.chat(**kw).message
    assert whole.content == "Let me check."
    assert [(c.function.name, c.function.arguments) for c in whole.tool_calls] == [
        ("get_time", {"city": "Oslo"})
    ]
    parts = [p.message for p in client.chat(stream=True, **kw)]
    assert "".join(p.content or "" for p in parts).strip() == "Let me check."
    calls = [c for p in parts for c in p.tool_calls or []]
    assert [c.model_dump() for c in calls] == [c.model_dump() for c in whole.tool_calls]
