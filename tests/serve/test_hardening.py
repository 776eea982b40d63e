"""One bad request never hurts another (issue 22): the exact hostile requests, on every
generation API, get a clear 4xx naming what was wrong while victim streams on the same
server finish with exactly the model's own output."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.serve.victims import Victims, victim_oracle

MSGS = [{"role": "user", "content": "Hi"}]


def generation_requests(fields: dict) -> dict[str, tuple[str, dict]]:
    """{API: (path, body)}: a 4-token request with `fields` as each API's users send
    sampling fields (top level, or Ollama's `options`)."""
    return {
        "openai chat": (
            "/v1/chat/completions",
            {"model": "tiny", "messages": MSGS, "max_tokens": 4, **fields},
        ),
        "openai completions": (
            "/v1/completions",
            {"model": "tiny", "prompt": "Hi", "max_tokens": 4, **fields},
        ),
        "openai responses": (
            "/v1/responses",
            {"model": "tiny", "input": "Hi", "max_output_tokens": 4, **fields},
        ),
        "anthropic messages": (
            "/v1/messages",
            {"model": "tiny", "messages": MSGS, "max_tokens": 4, **fields},
        ),
        "ollama generate": (
            "/api/generate",
            {
                "model": "tiny",
                "prompt": "Hi",
                "stream": False,
                "options": {"num_predict": 4, **fields},
            },
        ),
        "ollama chat": (
            "/api/chat",
            {
                "model": "tiny",
                "messages": MSGS,
                "stream": False,
                "options": {"num_predict": 4, **fields},
            },
        ),
        "llama.cpp completion": (
            "/completion",
            {"model": "tiny", "prompt": "Hi", "n_predict": 4, **fields},
        ),
    }


def error_message(body: dict) -> str:
    """The message of any family's error body."""
    err = body.get("error")
    return err if isinstance(err, str) else err["message"]


# issue 22 item 1: each of these sent the scheduler's parameter refresh an int32 overflow
# (or a str) that failed every request in flight.
HOSTILE = [
    ("top_k", 2**40),
    ("repeat_last_n", 2**40),
    ("dry_allowed_length", 2**40),
    ("min_keep", 2**40),
    ("dry_penalty_last_n", 2**40),
    ("xtc_threshold", "a"),
]


@pytest.fixture(scope="module")
def expected(tiny):
    return victim_oracle(tiny)


def test_hostile_sampler_fields_fail_alone(server, expected):
    async def main():
        async with (
            Victims(server.url, expected),
            httpx.AsyncClient(base_url=server.url, timeout=120) as client,
        ):
            sent = [
                (api, field, path, body)
                for field, value in HOSTILE
                for api, (path, body) in generation_requests({field: value}).items()
            ]
            answers = await asyncio.gather(*(client.post(p, json=b) for _, _, p, b in sent))
            return [(api, field, r) for (api, field, _, _), r in zip(sent, answers, strict=True)]

    for api, field, r in asyncio.run(main()):
        assert r.status_code == 400, (api, field, r.status_code, r.text)
        body = r.json()
        assert field in error_message(body), (api, field, r.text)
        if isinstance(body["error"], dict) and "param" in body["error"]:  # OpenAI's shape
            assert body["error"]["param"] == field, (api, r.text)


# --- CPU work off the event loop (issue 22 items 3 and 6) -------------------------------

#: Rendering never ends: 10^10 loop steps (the sandbox's time budget must stop it).
NESTED_RANGE = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


@pytest.fixture(scope="module")
def hostile_server(tiny_paths, serve_home, tmp_path_factory):
    """The tiny llama twice: as itself, and as "hostile" with a chat template that loops."""
    from llamay.gguf.writer import copy_gguf
    from llamay.serve import create_app
    from llamay.serve.models import Models
    from tests.serve.conftest import running

    hostile = tmp_path_factory.mktemp("hostile") / "hostile.gguf"
    copy_gguf(tiny_paths["tiny"], hostile, metadata={"tokenizer.chat_template": NESTED_RANGE})
    paths = {"tiny": tiny_paths["tiny"], "hostile": hostile}
    app = create_app(Models(paths, use_store=False, default_keep_alive=-1), max_tokens_limit=64)
    with running(app) as s:
        yield s


async def health_while(url: str, work) -> tuple[list[float], object]:
    """(latencies of /health polled every 50 ms while `work` runs, work's result)."""
    latencies: list[float] = []
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        task = asyncio.create_task(work)
        while not task.done():
            t0 = time.perf_counter()
            assert (await client.get("/health")).status_code == 200
            latencies.append(time.perf_counter() - t0)
            await asyncio.sleep(0.05)
        return latencies, task.result()


def test_hostile_template_renders_off_the_loop(hostile_server, tiny):
    body = {"model": "hostile", "messages": MSGS, "max_tokens": 4}

    async def main():
        async with (
            Victims(hostile_server.url, victim_oracle(tiny)),
            httpx.AsyncClient(base_url=hostile_server.url, timeout=120) as client,
        ):

            async def attack():
                return await asyncio.gather(
                    *(client.post("/v1/chat/completions", json=body) for _ in range(4))
                )

            return await health_while(hostile_server.url, attack())

    latencies, answers = asyncio.run(main())
    assert len(latencies) >= 3 and max(latencies) < 1.0, latencies
    for r in answers:
        assert r.status_code == 400, r.text
        assert "chat template" in error_message(r.json())


def test_ten_megabyte_prompt_tokenises_off_the_loop(hostile_server, tiny):
    """A 10 MB prompt is refused at once (more bytes than the context's tokens could
    spell); 2 MB sent to /tokenize (no context limit there) is tokenised while /health
    keeps answering."""
    unit = "the sea is wide and deep "
    big = {"model": "tiny", "prompt": unit * (10_000_000 // len(unit)), "max_tokens": 1}
    text = unit * (2_000_000 // len(unit))

    async def main():
        async with httpx.AsyncClient(base_url=hostile_server.url, timeout=300) as client:
            refused = await health_while(
                hostile_server.url, client.post("/v1/completions", json=big)
            )
            tokenised = await health_while(
                hostile_server.url, client.post("/tokenize", json={"content": text})
            )
            return refused, tokenised

    (lat_refused, r), (lat_tok, t) = asyncio.run(main())
    assert r.status_code == 400, r.text
    message = error_message(r.json())
    assert "tokens" in message and "context holds 2048" in message
    assert max(lat_refused) < 1.0, lat_refused
    assert t.status_code == 200
    assert t.json()["tokens"] == tiny.tokenize(text, add_special=False)
    # holding the GIL, tokenising 2 MB blocked /health for 2.6 s at once; now the longest
    # wait is the tokenizer's own Python (0.4 s alone at load 14) plus a loaded machine's
    # scheduling: 1.02 s seen at load 14 on 2 cores, so the bound leaves room for that
    assert len(lat_tok) >= 3 and max(lat_tok) < 1.5, lat_tok
    assert sorted(lat_tok)[len(lat_tok) // 2] < 0.5, lat_tok


# --- abandoned requests (issue 22 item 5) ------------------------------------------------

LONG = 1500  # tokens each abandoned request asks for (most of the tiny llama's 2048)


def abandoned_requests() -> dict[str, tuple[str, dict]]:
    """The non-streaming generation endpoints, each asked for LONG tokens."""
    return {
        api: (path, body)
        for api, (path, body) in generation_requests({"temperature": 0}).items()
        for body in [_with_budget(path, body, LONG)]
    }


def _with_budget(path: str, body: dict, n: int) -> dict:
    body = {**body, "messages": [{"role": "user", "content": "Count to a thousand."}]}
    if path.startswith("/api/"):
        body["options"] = {**body["options"], "num_predict": n}
    elif path == "/completion":
        body["n_predict"] = n
    elif path == "/v1/responses":
        body["max_output_tokens"] = n
    else:
        body["max_tokens"] = n
    if "prompt" in body or "input" in body:
        del body["messages"]
    return body


@pytest.fixture(scope="module")
def long_server(tiny_paths, serve_home):
    """A server without a token cap, so an abandoned request would run for long."""
    from llamay.serve import create_app
    from llamay.serve.models import Models
    from tests.serve.conftest import running

    app = create_app(Models({"tiny": tiny_paths["tiny"]}, use_store=False, default_keep_alive=-1))
    with running(app) as s:
        yield s


def test_abandoned_requests_are_cancelled_and_free_their_pages(long_server):
    from tests.serve.conftest import wait_idle

    st = long_server.state
    with httpx.Client(base_url=long_server.url, timeout=60) as c:  # load the model
        assert c.post("/completion", json={"prompt": "Hi", "n_predict": 1}).status_code == 200
    baseline = wait_idle(st)["tiny"]

    async def give_up(client: httpx.AsyncClient, path: str, body: dict) -> None:
        with pytest.raises(httpx.ReadTimeout):  # the client stops waiting and hangs up
            await client.post(path, json=body, timeout=httpx.Timeout(60, read=1.5))

    async def main():
        async with httpx.AsyncClient(base_url=long_server.url) as client:
            reqs = abandoned_requests()
            await asyncio.gather(*(give_up(client, p, b) for p, b in reqs.values()))
            return len(reqs)

    before = st.metrics.completion_tokens
    n = asyncio.run(main())
    t0 = time.monotonic()
    stats = wait_idle(st, timeout=30)["tiny"]
    idle_after = time.monotonic() - t0
    generated = st.metrics.completion_tokens - before
    # each stopped within moments of its client leaving, far short of LONG tokens
    assert idle_after < 5.0, idle_after
    assert generated < n * LONG / 4, generated
    assert stats["pages_held"] == baseline["pages_held"] == 0
    assert stats["pages_used"] - stats.get("pages_cached", 0) == 0


# --- malformed history (issue 22 item 8) ------------------------------------------------

BAD_CALLS = [
    [{"function": "notadict"}],
    [{"function": {"name": 7, "arguments": "{}"}}],
    [{"function": {"name": "f", "arguments": [1, 2]}}],
    [{"type": "function"}],
    ["notadict"],
]


def malformed_histories() -> list[tuple[str, str, dict]]:
    """(API, path, body) of chats whose history holds a malformed tool call."""
    out = []
    for calls in BAD_CALLS:
        history = [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "user", "content": "Well?"},
        ]
        out.append(("openai chat", "/v1/chat/completions", {"messages": history, "max_tokens": 2}))
        ollama = [{**m, "content": m["content"] or ""} for m in history]
        body = {"messages": ollama, "stream": False, "options": {"num_predict": 2}}
        out.append(("ollama chat", "/api/chat", body))
    for block in [
        {"type": "tool_use", "id": "t1", "name": "f", "input": "notadict"},
        {"type": "tool_use", "id": "t1", "name": 7, "input": {}},
        {"type": "tool_result", "tool_use_id": 5, "content": "x"},
        {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "image"}]},
        "notadict",
    ]:
        msgs = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": [block]}]
        msgs.append({"role": "user", "content": "Well?"})
        out.append(("anthropic", "/v1/messages", {"messages": msgs, "max_tokens": 2}))
    for item in [
        {"type": "function_call", "call_id": "c1", "name": 7, "arguments": "{}"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": [1]},
        {"type": "function_call_output", "call_id": 3, "output": "x"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": 5}]},
        {"type": "message", "role": "wizard", "content": "hi"},
    ]:
        out.append(("responses", "/v1/responses", {"input": [item], "max_output_tokens": 2}))
    return [(api, path, {"model": "tiny", **body}) for api, path, body in out]


def test_malformed_tool_history_is_a_400(server, expected):
    async def main():
        async with (
            Victims(server.url, expected),
            httpx.AsyncClient(base_url=server.url, timeout=120) as client,
        ):
            cases = malformed_histories()
            answers = await asyncio.gather(*(client.post(p, json=b) for _, p, b in cases))
            return list(zip(cases, answers, strict=True))

    wrong = [
        (api, body["messages"] if "messages" in body else body["input"], r.status_code, r.text)
        for (api, _, body), r in asyncio.run(main())
        if r.status_code != 400
    ]
    assert not wrong, "\n".join(map(str, wrong))
