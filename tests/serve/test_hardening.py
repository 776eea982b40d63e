"""One bad request never hurts another (issue 22): the exact hostile requests, on every
generation API, get a clear 4xx naming what was wrong while victim streams on the same
server finish with exactly the model's own output."""

from __future__ import annotations

import asyncio

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
