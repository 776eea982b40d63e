"""Bad input and bad clients: schemathesis over /openapi.json finds no 5xx (a bounded
number of examples per operation), an API key is enforced, and 16 concurrent streams with
half of them dropped mid-way leave the engine idle."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from llamay.serve import create_app
from llamay.serve.models import Models
from tests.serve.conftest import running, wait_idle


@pytest.fixture(scope="module")
def fuzz_server(tiny_paths, serve_home):
    # A server of its own, so generated requests stay short (4 tokens at most).
    app = create_app(Models(tiny_paths, use_store=False, default_keep_alive=-1), max_tokens_limit=4)
    with running(app) as s:
        yield s


# pulling reaches the network; creating, deleting and copying change the store
SKIP = re.compile(r"^/api/(pull|delete|copy|create)$")


def _declined(response) -> bool:
    """llama-server's deliberate 501, not_supported_error (/infill on a model without FIM
    tokens, slot actions without --slot-save-path): a refusal, not a server error."""
    try:
        err = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return response.status_code == 501 and err.get("type") == "not_supported_error"


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_no_server_errors(fuzz_server, mode):
    """Every operation, a bounded number of generated requests each: no 5xx (but
    llama-server's deliberate 501s)."""
    spec = httpx.get(fuzz_server.url + "/openapi.json").json()
    schema = schemathesis.openapi.from_dict(spec)
    failures = []
    n_ops = 0
    for result in schema.get_all_operations():
        op = result.ok()
        if SKIP.match(op.path):
            continue
        n_ops += 1

        @given(case=op.as_strategy(generation_mode=GenerationMode(mode)))
        @settings(
            max_examples=8,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
            phases=[Phase.generate],
        )
        def check(case):
            if isinstance(case.body, dict) and "model" in case.body and mode == "positive":
                case.body["model"] = "tiny"  # reach the model, not just the 404
            response = case.call(base_url=fuzz_server.url, timeout=120)
            if response.status_code >= 500 and not _declined(response):
                body = json.dumps(case.body, default=str)[:300] if case.body is not None else ""
                failures.append(
                    f"{case.method} {case.formatted_path} -> "
                    f"{response.status_code}: {response.text[:300]} | {body}"
                )

        try:
            check()
        except Unsatisfiable:  # nothing to break (e.g. a GET without parameters)
            pass
    assert n_ops > 25
    assert not failures, "\n".join(failures[:20])


def test_api_key(tiny_paths, serve_home):
    app = create_app(Models(tiny_paths, use_store=False), api_key="s3cret")
    with running(app) as s:
        assert httpx.get(s.url + "/api/tags").status_code == 401
        assert (
            httpx.get(s.url + "/api/tags", headers={"Authorization": "Bearer s3cret"}).status_code
            == 200
        )
        assert httpx.get(s.url + "/api/tags", headers={"x-api-key": "s3cret"}).status_code == 200
        body = httpx.post(s.url + "/v1/completions", headers={"x-api-key": "wrong"}).json()
        assert body["error"]["type"] == "authentication_error"
        # both headers sent (a client holding a key and a token): either may carry it
        for key, token in (("s3cret", "other"), ("other", "s3cret")):
            both = {"x-api-key": key, "Authorization": f"Bearer {token}"}
            assert httpx.get(s.url + "/api/tags", headers=both).status_code == 200
        wrong = {"x-api-key": "other", "Authorization": "Bearer wrong"}
        assert httpx.get(s.url + "/api/tags", headers=wrong).status_code == 401
        # open, as llama-server leaves them (issue 19 defect 7): probes and model lists
        for path in ("/health", "/v1/models", "/models"):
            assert httpx.get(s.url + path).status_code == 200, path


def test_disconnects_cancel_and_the_engine_goes_idle(server):
    st = server.state
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Count."}],
        "max_tokens": 40,
        "temperature": 0,
        "stream": True,
    }

    async def one(client: httpx.AsyncClient, drop: bool) -> int:
        n = 0
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    n += 1
                    if drop and n == 3:
                        break  # leaving the block closes the connection mid-stream
        return n

    async def main():
        async with httpx.AsyncClient(base_url=server.url, timeout=300) as client:
            return await asyncio.gather(*(one(client, i % 2 == 0) for i in range(16)))

    before = st.metrics.completion_tokens
    counts = asyncio.run(main())
    stats = wait_idle(st)
    tiny = stats["tiny"]
    assert tiny.get("queued", 0) == 0 and tiny.get("active", 0) == 0
    # no page is held by a sequence any more (the prefix cache may keep finished prompts)
    assert tiny.get("pages_held", 0) == 0
    if "pages_used" in tiny:
        assert tiny["pages_used"] == tiny.get("pages_cached", 0)
    assert counts[0::2] == [3] * 8
    # role chunk + 40 tokens + finish chunk (+ maybe none) for those that stayed
    assert all(c == 42 for c in counts[1::2])
    generated = st.metrics.completion_tokens - before
    assert 8 * 40 <= generated < 16 * 40  # the dropped ones stopped early
