"""The serve room's small pieces, without a server: stop-string hold-back, tool-call
parsing, keep-alive durations, error statuses and bodies, `-m` parsing."""

from __future__ import annotations

import json

import pytest

from llamay import errors as E
from llamay.serve.errors import ApiError, error_body, error_kind, family_of, to_http_status
from llamay.serve.ollama import keep_alive_seconds
from llamay.serve.tools import call_schema, parse_calls, pick
from llamay.tok.detok import held_back


@pytest.mark.parametrize(
    ("text", "stops", "n"),
    [
        ("hello wor", ["world"], 3),
        ("hello", ["xyz"], 0),
        ("ab", ["abc", "b"], 2),
        ("a\n", ["\n\n"], 1),
        ("", ["x"], 0),
        ("abcab", ["abcabd"], 5),
    ],
)
def test_held_back(text, stops, n):
    assert held_back(text, stops) == n


def test_parse_calls():
    names = {"get_weather"}
    tagged = (
        'Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    )
    assert parse_calls(tagged, names) == [{"name": "get_weather", "arguments": {"city": "Oslo"}}]
    bare = '{"name": "get_weather", "parameters": "{\\"city\\": \\"Rome\\"}"}'
    assert parse_calls(bare, names) == [{"name": "get_weather", "arguments": {"city": "Rome"}}]
    assert parse_calls('{"name": "other", "arguments": {}}', names) is None
    assert parse_calls("just text", names) is None
    assert parse_calls("<tool_call>{broken</tool_call>", names) is None


def test_call_schema_and_pick():
    fs = [{"name": "a", "parameters": {"type": "object"}}, {"name": "b"}]
    assert call_schema(fs[:1])["properties"]["name"] == {"const": "a"}
    assert len(call_schema(fs)["anyOf"]) == 2
    assert pick(fs, "b") == [fs[1]]
    with pytest.raises(E.RequestError, match="'c'"):
        pick(fs, "c")


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (None, None),
        (0, 0.0),
        (-1, -1.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("-1", -1.0),
        ("250ms", 0.25),
        ("10", 10.0),
    ],
)
def test_keep_alive(value, seconds):
    assert keep_alive_seconds(value) == seconds


@pytest.mark.parametrize("bad", ["soon", "5 minutes", "m5", ""])
def test_keep_alive_bad(bad):
    with pytest.raises(ApiError):
        keep_alive_seconds(bad)


def test_statuses_and_bodies():
    assert to_http_status(E.ModelNotFoundError("x")) == 404
    assert to_http_status(E.ContextOverflowError("x")) == 400
    assert to_http_status(E.GrammarSyntaxError("x")) == 400
    assert to_http_status(E.FetchError("x")) == 502
    assert to_http_status(ApiError(418, "tea")) == 418
    assert to_http_status(RuntimeError("x")) == 500
    assert family_of("/v1/messages/count_tokens") == "anthropic"
    assert family_of("/v1/chat/completions") == "openai"
    assert family_of("/api/chat") == "ollama"
    assert family_of("/completion") == "llamacpp"
    assert error_body("ollama", 400, "m") == {"error": "m"}
    assert error_body("anthropic", 404, "m")["error"]["type"] == "not_found_error"
    assert error_body("openai", 400, "m", "p")["error"]["param"] == "p"
    assert error_body("llamacpp", 400, "m")["error"]["code"] == 400
    # OpenAI's shapes: an unknown model is an invalid request coded model_not_found, and
    # a 4xx without a type of its own (405) is still the client's, not a server_error
    missing = error_body("openai", 404, "m", kind=error_kind(E.ModelNotFoundError("m")))["error"]
    assert (missing["type"], missing["code"]) == ("invalid_request_error", "model_not_found")
    other = error_body("openai", 404, "m", kind="not_found")["error"]  # a stored response's
    assert (other["type"], other["code"]) == ("invalid_request_error", None)
    assert error_body("openai", 405, "m")["error"]["type"] == "invalid_request_error"
    assert error_body("openai", 500, "m")["error"]["type"] == "server_error"


def test_parse_models(tmp_path):
    from llamay_cli.serve_cmds import parse_models

    f = tmp_path / "my-model.gguf"
    f.write_bytes(b"")
    assert parse_models([f"x={f}", str(f), "smollm2:135m"]) == {
        "x": str(f),
        "my-model": str(f),
        "smollm2:135m": "smollm2:135m",
    }


def test_models_load_once_keep_alive_and_unload(tmp_path):
    import asyncio

    from llamay.serve.models import Models

    loads, closed = [], []

    class FakeEngine:
        def __init__(self, model, parallel):
            self.model = model

        def close(self):
            closed.append(self.model)

    def loader(path, n_ctx, numerics):
        loads.append(path)
        return f"model:{path.name}"

    f = tmp_path / "a.gguf"
    f.write_bytes(b"")

    async def main():
        ms = Models(
            {"a": f},
            use_store=False,
            default_keep_alive=0.05,
            loader=loader,
            engine_factory=FakeEngine,
        )
        ms.GRACE_S = 0.0
        one, two = await asyncio.gather(ms.get("a"), ms.get("a:latest"))
        assert one is two and len(loads) == 1
        assert (await ms.get(None)) is one  # the default model
        one.busy = 1
        await asyncio.sleep(0.1)
        await ms.reap()
        assert "a" in ms.loaded  # busy: kept
        one.busy = 0
        await ms.reap()
        assert "a" not in ms.loaded and closed == ["model:a.gguf"]
        lm = await ms.get("a", keep_alive=-1)  # forever
        await asyncio.sleep(0.1)
        await ms.reap()
        assert ms.loaded["a"] is lm and len(loads) == 2
        lm.busy = 1
        assert await ms.unload_when_idle("a") and "a" in ms.loaded
        lm.busy = 0
        await ms.reap()
        assert "a" not in ms.loaded
        with pytest.raises(E.ModelNotFoundError, match="'b'"):
            ms.find("b")

    asyncio.run(main())


@pytest.mark.parametrize("step", [1, 2, 3, 7, 1000])
def test_forced_call_stream_is_split_invariant(step):
    from llamay.serve.tools import ForcedCallStream

    args = {"city": 'Pa}ri"s {x}', "n": [1, {"a": [2, "]"]}], "t": "\\"}
    text = '{"name": "get_\\"w", "arguments":  \n ' + json.dumps(args) + "\n }"
    s = ForcedCallStream()
    names = [n for i in range(0, len(text), step) if (n := s.feed(text[i : i + step])[0])]
    assert names == ['get_"w']
    assert json.loads(s.args) == args and s.args == json.dumps(args)
    assert s.finish() == {"name": 'get_"w', "arguments": args}


def test_forced_call_stream_other_key_order():
    from llamay.serve.tools import ForcedCallStream

    s = ForcedCallStream()
    assert s.feed('{"arguments": {"a": 1}, "name": "f"}') == (None, "")
    assert s.name is None and s.finish() == {"name": "f", "arguments": {"a": 1}}
