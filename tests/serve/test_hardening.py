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
    assert len(lat_tok) >= 3 and max(lat_tok) < 1.0, lat_tok
