"""Ollama's context window through the official `ollama` client: `options.num_ctx` bounds a
request, and a prompt that does not fit it is truncated as Ollama truncates one (a chat
drops its oldest turns, keeping the system message and the last turn, never a tool result
without its call; a generate prompt keeps its first `num_keep` tokens and its end), unless
`truncate` is false. A truncated prompt leaves the reply `num_predict` tokens, at most
half the window after the kept ones; with `shift: false` it fills the window but one
token. A reply that fills the window goes on over the context shifted as Ollama's runner
shifts it (the first `num_keep` tokens, then the later half of the rest), up to
`num_predict` tokens, or ten windows without one.

The oracle for every reply is the tiny model run directly on the prompt those rules
define, written here as Ollama's own loops (drop a message at a time from the front;
shift a full window)."""

from __future__ import annotations

import httpx
import numpy as np
import ollama
import pytest

from llamay.sample import GREEDY
from tests.serve.conftest import chat_prompt

GREEDY_OPTS = {"temperature": 0}


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=server.url)


def _ids(tiny, messages) -> list[int]:
    return tiny.tokenize(chat_prompt(tiny, messages), add_special=True, parse_special=True)


def _reply(tiny, ids: list[int], n: int) -> str:
    return tiny.tokenizer.decode(list(tiny.generation(ids, n, GREEDY)))


def _shifting_reply(tiny, ids: list[int], size: int, n: int, keep: int = 4) -> str:
    """Ollama's runner: `n` tokens after `ids` in a window of `size`, a full window
    keeping its first `keep` tokens and the later half of the rest."""
    context, out = list(ids), []
    while len(out) < n:
        room = min(n - len(out), size - len(context))
        got = list(tiny.generation(context, room, GREEDY))
        out, context = out + got, context + got
        if len(got) < room:  # the end of generation
            break
        if len(context) >= size:
            drop = (len(context) - keep) // 2
            context = context[:keep] + context[keep + drop :]
    return tiny.tokenizer.decode(out)


def _history(turns: int) -> list[dict]:
    msgs = [{"role": "system", "content": "Answer in one word."}]
    for i in range(turns):
        msgs += [
            {"role": "user", "content": f"Question {i}: what is {i} plus {i}?"},
            {"role": "assistant", "content": f"It is {2 * i}."},
        ]
    return [*msgs, {"role": "user", "content": "And the last one?"}]


def _ollama_chat_cut(tiny, msgs: list[dict], budget: int) -> list[dict]:
    """Ollama's chatPrompt loop: drop from the front until the prompt fits, keeping the
    system messages (here starting at user turns, as llamay's templates need)."""
    for i, m in enumerate(msgs):
        if i and m["role"] != "user":
            continue
        kept = [x for x in msgs[:i] if x["role"] == "system"] + msgs[i:]
        if len(_ids(tiny, kept)) <= budget:
            return kept
    raise AssertionError("the last turn alone does not fit")


def test_a_chat_longer_than_num_ctx_keeps_the_system_message_and_the_latest_turns(client, tiny):
    msgs = _history(12)
    assert len(_ids(tiny, msgs)) > 128  # the whole chat does not fit the window
    # num_predict 8 fits in half the window, so the prompt may use 128 - 8 tokens
    want = _ollama_chat_cut(tiny, msgs, 128 - 8)
    assert want[0] == msgs[0] and want[-1] == msgs[-1] and len(want) < len(msgs)
    ids = _ids(tiny, want)
    r = client.chat(
        model="tiny", messages=msgs, options={**GREEDY_OPTS, "num_ctx": 128, "num_predict": 8}
    )
    assert r.prompt_eval_count == len(ids)
    assert r.message.content == _reply(tiny, ids, 8)

    # a longer reply: the prompt leaves it half the window after num_keep, and the reply
    # goes on past the window's end over the shifted context
    budget = 128 - (128 - 4) // 2
    ids = _ids(tiny, _ollama_chat_cut(tiny, msgs, budget))
    opts = {**GREEDY_OPTS, "num_ctx": 128, "num_predict": 100}
    r = client.chat(model="tiny", messages=msgs, options=opts)
    assert r.prompt_eval_count == len(ids)
    assert r.eval_count == 100 > 128 - len(ids) and r.done_reason == "length"
    assert r.message.content == _shifting_reply(tiny, ids, 128, 100)


def test_a_chat_that_fits_is_not_cut_and_its_reply_goes_on_past_the_window(client, tiny):
    msgs = _history(2)
    ids = _ids(tiny, msgs)
    assert len(ids) < 100
    opts = {**GREEDY_OPTS, "num_ctx": 100, "num_predict": 150}
    r = client.chat(model="tiny", messages=msgs, options=opts)
    assert r.prompt_eval_count == len(ids)
    assert r.eval_count == 150 and r.done_reason == "length"
    assert r.message.content == _shifting_reply(tiny, ids, 100, 150)
    # num_keep -1 keeps the whole prompt through every shift
    r = client.chat(model="tiny", messages=msgs, options={**opts, "num_keep": -1})
    assert r.message.content == _shifting_reply(tiny, ids, 100, 150, keep=len(ids))


def test_a_reply_without_num_predict_ends_after_ten_windows(client):
    # Ollama's bound on a reply "running on forever" (llm/server.go); this server's own
    # limit (--max-tokens 256) is more than ten windows of 16
    r = client.generate(model="tiny", prompt="The sea is", options={**GREEDY_OPTS, "num_ctx": 16})
    assert r.eval_count == 160 and r.done_reason == "length"


def test_a_tool_result_is_never_kept_without_the_call_it_answers(client, tiny):
    call = {"function": {"name": "add", "arguments": {"a": 2, "b": 2}}}
    msgs = [
        {"role": "system", "content": "Use the tools."},
        *_history(6)[1:-1],
        {"role": "user", "content": "What is 2 plus 2? Use add."},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "4", "tool_name": "add"},
    ]
    tail = [msgs[0], *msgs[-2:]]  # the system message, the call and its result
    as_template = [
        {**m, "tool_calls": [{**call, "type": "function"}]} if m.get("tool_calls") else m
        for m in tail
    ]
    as_template[-1] = {"role": "tool", "content": "4", "name": "add"}
    ids = _ids(tiny, as_template)
    # a window the call and its result fit, but not the user turn before them
    size = len(ids) + 4
    r = client.chat(
        model="tiny", messages=msgs, options={**GREEDY_OPTS, "num_ctx": size, "num_predict": 4}
    )
    assert r.prompt_eval_count == len(ids)
    assert r.message.content == _reply(tiny, ids, 4)


def test_a_generate_prompt_keeps_num_keep_tokens_and_its_end(client, tiny):
    prompt = " ".join(f"w{i}" for i in range(200))
    full = _ids(tiny, [{"role": "user", "content": prompt}])
    assert len(full) > 100
    r = client.generate(
        model="tiny",
        prompt=prompt,
        options={**GREEDY_OPTS, "num_ctx": 100, "num_predict": 6},
    )
    ids = full[:4] + full[len(full) - (100 - 6 - 4) :]
    assert r.context[: r.prompt_eval_count] == ids
    assert r.response == _reply(tiny, ids, 6)

    r = client.generate(
        model="tiny",
        prompt=prompt,
        options={**GREEDY_OPTS, "num_ctx": 100, "num_keep": 10, "num_predict": 6},
    )
    assert r.context[: r.prompt_eval_count] == full[:10] + full[len(full) - (100 - 6 - 10) :]


def test_shift_false_fills_the_window_and_truncate_false_refuses(client, tiny, server):
    # The Python client sends neither field (Ollama's Go API and other wrappers do): raw JSON
    prompt = " ".join(f"w{i}" for i in range(200))
    full = _ids(tiny, [{"role": "user", "content": prompt}])
    body = {"model": "tiny", "prompt": prompt, "stream": False}
    with httpx.Client(base_url=server.url, timeout=300) as http:
        opts = {**GREEDY_OPTS, "num_ctx": 100}
        r = http.post("/api/generate", json={**body, "options": opts, "shift": False}).json()
        assert r["context"][: r["prompt_eval_count"]] == full[:4] + full[len(full) - 95 :]
        assert r["eval_count"] == 1 and r["done_reason"] == "length"

        r = http.post("/api/generate", json={**body, "options": opts, "truncate": False})
        assert r.status_code == 400 and "context length" in r.json()["error"]
        chat = {"model": "tiny", "messages": _history(12), "options": {"num_ctx": 128}}
        r = http.post("/api/chat", json={**chat, "stream": False, "truncate": False})
        assert r.status_code == 400 and "context length" in r.json()["error"]
    # the same server answers the next request as before
    r = client.generate(
        model="tiny", prompt="Hi", raw=True, options={**GREEDY_OPTS, "num_predict": 3}
    )
    assert r.response == _reply(tiny, tiny.tokenize("Hi", add_special=True, parse_special=True), 3)


def test_embed_cuts_an_input_to_num_ctx(client, tiny_paths):
    import llamay

    bert = llamay.load(tiny_paths["bert"])
    text = " ".join(["cat"] * 80)
    ids = bert.tokenize(text)
    assert len(ids) > 32
    r = client.embed(model="bert", input=text, options={"num_ctx": 32})
    want = np.asarray(bert.embed(ids[:32], normalize=2))
    assert r.prompt_eval_count == 32
    np.testing.assert_allclose(r.embeddings[0], want, atol=1e-5)
    with pytest.raises(ollama.ResponseError) as err:
        client.embed(model="bert", input=text, options={"num_ctx": 32}, truncate=False)
    assert err.value.status_code == 400
