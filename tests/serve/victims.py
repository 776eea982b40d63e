"""Victim streams: greedy chat streams over raw HTTP that must finish with exactly what the
model generates on its own while an attacker's requests hit the same server.

    async with Victims(server.url, expected) as v:
        ... attack ...
    # leaving the block awaits the victims and asserts their text
"""

from __future__ import annotations

import asyncio
import json

import httpx

from tests.serve.conftest import chat_prompt, greedy

VICTIM_MSGS = [{"role": "user", "content": "Tell me about the sea."}]
VICTIM_TOKENS = 24


def victim_oracle(tiny) -> str:
    """What a victim must receive: the model's own greedy continuation."""
    return greedy(tiny, chat_prompt(tiny, VICTIM_MSGS), VICTIM_TOKENS)


async def victim_stream(client: httpx.AsyncClient, started: asyncio.Event) -> tuple[str, str]:
    """(text, finish_reason) of one greedy OpenAI chat stream; `started` is set once the
    first content arrives (the victim is then in the engine)."""
    body = {
        "model": "tiny",
        "messages": VICTIM_MSGS,
        "max_tokens": VICTIM_TOKENS,
        "temperature": 0,
        "stream": True,
    }
    text, reason = [], None
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            for c in chunk["choices"]:
                text.append(c["delta"].get("content") or "")
                reason = c["finish_reason"] or reason
                if text[-1]:
                    started.set()
    return "".join(text), reason


class Victims:
    """`n` victim streams running for the block's duration; on leaving, each must have
    produced `expected` and finished for length."""

    def __init__(self, url: str, expected: str, n: int = 2):
        self.url, self.expected, self.n = url, expected, n

    async def __aenter__(self) -> Victims:
        self.client = httpx.AsyncClient(base_url=self.url, timeout=300)
        events = [asyncio.Event() for _ in range(self.n)]
        self.tasks = [asyncio.create_task(victim_stream(self.client, e)) for e in events]
        waits = {asyncio.create_task(e.wait()) for e in events}
        while waits:  # until every victim has its first token (or one has failed)
            done, _ = await asyncio.wait(
                [*waits, *(t for t in self.tasks if not t.done())],
                timeout=120,
                return_when=asyncio.FIRST_COMPLETED,
            )
            assert done, "the victims did not start within 120 s"
            for t in done & set(self.tasks):
                t.result()  # re-raises a victim's failure
            waits -= done
        return self

    async def __aexit__(self, *exc) -> None:
        try:
            results = await asyncio.gather(*self.tasks)
        finally:
            await self.client.aclose()
        if exc[0] is None:
            for text, reason in results:
                assert (text, reason) == (self.expected, "length")
