"""llama-server's request semantics, held to llama-server itself: the answers it gave to
`tests.serve.fim_model.REQUESTS` on the tiny llama with one slot of 256
(tests/fixtures/llamaserver/goldens.json, "requests"). The requests are chosen so that the
answer depends on no numerics (a grammar forces the text, or the answer is about the
request): `n_indent`, `t_max_predict_ms`, a `stop` string, `response_fields`, the sampler
order as letters and other names, malformed `logit_bias` entries skipped, negative
temperature/top_k (greedy, off), `tokens_cached`, `cache_prompt: false`, the streamed
chunks' fields with `timings_per_token`, a context overflow's error fields,
`/v1/models`' `meta`, the end-of-generation token counted, listed and streamed, an empty
prompt answered with nothing, an `id_slot` past the last, `/v1/completions`' streamed
usage and the chat route's `n_probs`. Differences from llama-server by design are named
where they are checked."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
from fixture_data import fixture

from llamay.sample import GREEDY
from llamay.serve import create_app
from llamay.serve.line_limits import LineLimits
from llamay.serve.models import Models
from tests.serve.conftest import running
from tests.serve.fim_model import REQUESTS


@pytest.fixture(scope="module")
def recorded():
    return json.loads(fixture("llamaserver", "goldens.json").read_text())


@pytest.fixture(scope="module")
def golden(recorded):
    return recorded["requests"]


@pytest.fixture(scope="module")
def http(tiny_paths, serve_home):
    """llamay as the goldens' llama-server ran: the tiny llama, one slot of 256."""
    models = Models({"tiny": tiny_paths["tiny"]}, n_ctx=256, parallel=1, use_store=False)
    with running(create_app(models)) as s, httpx.Client(base_url=s.url, timeout=120) as c:
        yield c


def _post(http, name: str, **more):
    path, body = REQUESTS[name]
    return http.post(path, json={**body, **more})


def _ids(tiny, text: str) -> list[int]:
    return tiny.tokenize(text, add_special=True, parse_special=True)


def test_n_indent_ends_at_the_first_line_indented_less(http, golden):
    for name in ("n_indent", "n_indent_off"):
        want, got = golden[name]["body"], _post(http, name).json()
        assert (got["content"], got["stop_type"]) == (want["content"], want["stop_type"])
    # streamed, nothing past the cut is sent
    r = _post(http, "n_indent", stream=True)
    chunks = [json.loads(x[6:]) for x in r.text.splitlines() if x.startswith("data: ")]
    assert "".join(c["content"] for c in chunks) == golden["n_indent"]["body"]["content"]
    assert chunks[-1]["stop_type"] == "limit"


def test_t_max_predict_ms_ends_after_the_next_newline_once_the_time_is_up(http):
    # a time limit of 1 µs: over by the first newline; the text ends with that token
    body = {"prompt": "Hi", "n_predict": 24, "grammar": 'root ::= "a\\nb\\nc\\nd"'}
    r = http.post("/completion", json={**body, "t_max_predict_ms": 0.001}).json()
    assert r["content"].endswith("\n") and r["content"].count("\n") == 1
    assert r["stop_type"] == "limit"
    assert http.post("/completion", json=body).json()["content"] == "a\nb\nc\nd"  # no limit


def test_line_limits():
    import time

    long_ago = time.perf_counter() - 1.0
    lines = LineLimits(n_indent=4)
    assert lines.feed("first line, not checked\n    ok\n", None) == (
        "first line, not checked\n    ok\n",
        False,
    )
    assert lines.feed("  ", None) == ("  ", False)  # undecided: only whitespace so far
    assert lines.feed("\tx", None) == ("\t", True)  # 3 of 4: cut before the x
    timed = LineLimits(t_max_predict_ms=500)
    assert timed.feed("a\n", time.perf_counter()) == ("a\n", False)  # in time
    assert timed.feed("b", long_ago) == ("b", False)  # late, but no newline yet
    assert timed.feed("c\nd", long_ago) == ("c\nd", True)


def test_a_stop_string_alone(http, golden):
    want, got = golden["stop_string"]["body"], _post(http, "stop_string").json()
    for key in ("content", "stop_type", "stopping_word"):
        assert got[key] == want[key]


def test_response_fields(http, golden):
    want, got = golden["response_fields"]["body"], _post(http, "response_fields").json()
    assert got.keys() == want.keys()  # "nope/x" left out
    assert got["timings/prompt_n"] == want["timings/prompt_n"]
    assert got["generation_settings/n_predict"] == want["generation_settings/n_predict"]


@pytest.mark.parametrize("name", ["samplers_letters", "samplers_other_names"])
def test_sampler_order_as_letters_and_other_names(http, golden, name):
    want = golden[name]["body"]["generation_settings"]["samplers"]
    got = _post(http, name).json()["generation_settings"]["samplers"]
    assert got == want


def test_malformed_logit_bias_entries_are_skipped(http, golden):
    r = _post(http, "logit_bias_malformed")
    assert r.status_code == golden["logit_bias_malformed"]["status"] == 200
    want = golden["logit_bias_malformed"]["body"]["generation_settings"]["logit_bias"]
    assert r.json()["generation_settings"]["logit_bias"] == want


def test_negative_temperature_is_greedy_and_negative_top_k_off(http, golden, tiny):
    want = golden["negative_values"]
    r = _post(http, "negative_values")
    assert r.status_code == want["status"] == 200
    got = r.json()
    for key in ("temperature", "top_k"):
        assert got["generation_settings"][key] == want["body"]["generation_settings"][key]
    toks = list(tiny.generation(_ids(tiny, "Hi"), 2, GREEDY))
    assert got["content"] == tiny.detokenize(toks)


def test_tokens_cached_counts_what_the_slot_holds(http, golden):
    want, got = golden["tokens_cached"]["body"], _post(http, "tokens_cached").json()
    for key in ("tokens_cached", "tokens_evaluated", "tokens_predicted"):
        assert got[key] == want[key]


def test_cache_prompt_false_computes_the_whole_prompt(http, golden):
    want = golden["cache_prompt_off"]["body"]["timings"]
    for _ in range(2):  # the second time too, though the first left the prompt cached
        got = _post(http, "cache_prompt_off").json()["timings"]
        assert (got["cache_n"], got["prompt_n"]) == (want["cache_n"], want["prompt_n"])
    reused = _post(http, "cache_prompt_off", cache_prompt=True).json()["timings"]
    assert reused["cache_n"] > 0  # the cache itself is there


def test_streamed_chunks_carry_counts_and_timings(http, golden):
    r = _post(http, "stream_partials")
    first = next(json.loads(x[6:]) for x in r.text.splitlines() if x.startswith("data: "))
    assert sorted(first) == golden["stream_partials"]["body"]["first_chunk_keys"]


@pytest.mark.parametrize("name", ["overflow", "overflow_chat"])
def test_a_context_overflow_reports_the_prompt_and_the_context(http, golden, name):
    want, r = golden[name], _post(http, name)
    assert r.status_code == want["status"] == 400
    got, expected = r.json()["error"], want["body"]["error"]
    assert (got["n_prompt_tokens"], got["n_ctx"]) == (
        expected["n_prompt_tokens"],
        expected["n_ctx"],
    )
    if name == "overflow":
        assert got["type"] == expected["type"]
    else:  # OpenAI's shape on its route: an invalid request whose code says why
        assert got["code"] == "context_length_exceeded"


def test_v1_models_meta(http, recorded, tiny):
    http.post("/completion", json={"prompt": "Hi", "n_predict": 1})  # loaded
    meta = http.get("/v1/models").json()["data"][0]["meta"]
    assert sorted(meta) == recorded["v1_models_meta_keys"]
    assert meta["n_vocab"] == tiny.tokenizer.vocab_size
    assert meta["n_ctx_train"] == tiny.config.context_length and meta["n_ctx"] == 256


def test_embeddings_take_either_field_name(server, tiny_paths):
    import llamay

    bert = llamay.load(tiny_paths["bert"])
    want = np.asarray(bert.embed(bert.tokenize("a cat", parse_special=True), normalize=2))
    with httpx.Client(base_url=server.url, timeout=120) as c:
        own = c.post("/embedding", json={"model": "bert", "input": "a cat"}).json()
        np.testing.assert_allclose(own[0]["embedding"][0], want, atol=1e-5)
        # /v1/embeddings with llama-server's field answers in llama-server's own form
        alt = c.post("/v1/embeddings", json={"model": "bert", "content": "a cat"}).json()
        np.testing.assert_allclose(alt[0]["embedding"][0], want, atol=1e-5)
        r = c.post("/v1/embeddings", json={"model": "bert"})
        assert r.status_code == 400


def _chunks(r) -> list[dict]:
    lines = [x[6:] for x in r.text.splitlines() if x.startswith("data: ")]
    return [json.loads(x) for x in lines if x != "[DONE]"]


def _listed(rows: list[dict]) -> list[tuple]:
    return [(r["id"], r["token"], r["bytes"]) for r in rows]


def test_the_end_of_generation_token_is_counted_listed_and_streamed(http, golden):
    for name in ("eos_first", "eos_after_text"):
        want, got = golden[name]["body"], _post(http, name).json()
        for key in ("content", "tokens", "tokens_predicted", "tokens_cached", "stop_type"):
            assert got[key] == want[key], (name, key)
        assert got["timings"]["predicted_n"] == want["timings"]["predicted_n"]
        want_rows, got_rows = want["completion_probabilities"], got["completion_probabilities"]
        assert _listed(got_rows) == _listed(want_rows)  # the token last, its text ""
    # streamed: the token in a chunk of its own, empty text, before the final one
    want = golden["eos_after_text_stream"]["body"]["chunks"]
    got = _chunks(_post(http, "eos_after_text_stream"))

    def shape(chunks):
        keys = ("content", "tokens", "stop", "tokens_predicted")
        return [
            ({k: c[k] for k in keys}, _listed(c.get("completion_probabilities", [])))
            for c in chunks
        ]

    assert shape(got) == shape(want)


@pytest.mark.parametrize("name", ["empty_prompt", "empty_prompt_v1"])
def test_an_empty_prompt_is_answered_with_nothing(http, golden, name):
    want, r = golden[name], _post(http, name)
    assert r.status_code == want["status"] == 200
    got, expected = r.json(), want["body"]
    if name == "empty_prompt":
        for key in ("content", "stop", "stop_type", "tokens_predicted", "tokens_evaluated"):
            assert got[key] == expected[key], key
    else:
        assert got["choices"][0]["text"] == expected["choices"][0]["text"] == ""
        assert got["choices"][0]["finish_reason"] == expected["choices"][0]["finish_reason"]
        for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
            assert got["usage"][key] == expected["usage"][key]


def test_an_id_slot_past_the_last_is_no_slot(http, golden):
    want, r = golden["id_slot_past_the_last"], _post(http, "id_slot_past_the_last")
    assert r.status_code == want["status"] == 200
    assert r.json()["id_slot"] == want["body"]["id_slot"]


def test_v1_completions_streams_usage_on_its_final_chunk(http, golden):
    import openai

    want = golden["v1_stream_usage"]["body"]["chunks"][-1]["usage"]
    client = openai.OpenAI(base_url=f"{str(http.base_url).rstrip('/')}/v1", api_key="none")
    _, body = REQUESTS["v1_stream_usage"]
    chunks = list(client.completions.create(model="tiny", **body))
    assert [c.usage is not None for c in chunks] == [False] * (len(chunks) - 1) + [True]
    got = chunks[-1].usage
    assert (got.prompt_tokens, got.completion_tokens) == (
        want["prompt_tokens"],
        want["completion_tokens"],
    )
    # asked for, OpenAI's way: a chunk of its own with no choices, as before
    asked = list(
        client.completions.create(model="tiny", stream_options={"include_usage": True}, **body)
    )
    assert asked[-1].choices == [] and asked[-1].usage.completion_tokens == 2


def test_chat_takes_n_probs(http, golden):
    want = golden["chat_n_probs"]["body"]["choices"][0]["logprobs"]["content"]
    got = _post(http, "chat_n_probs").json()["choices"][0]["logprobs"]["content"]
    assert len(got) == len(want) == 2
    assert [len(t["top_logprobs"]) for t in got] == [len(t["top_logprobs"]) for t in want]
