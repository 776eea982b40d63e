"""Issue 22's fuzz test: hypothesis over the sampling and request fields of every
generation API (hostile and plausible values alike), while victim streams run on the
same server; no request may get a 5xx (in the status or in-band in a stream) and every
victim must finish with exactly the model's own output.

Seeded and bounded: 100 examples, each asking for at most 3 tokens, over the tiny llama.
"""

from __future__ import annotations

import json
import threading

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from llamay.serve.sampling import EXTRA_FIELDS
from tests.serve.test_hardening import generation_requests
from tests.serve.victims import VICTIM_MSGS, VICTIM_TOKENS, victim_oracle

FIELDS = (*EXTRA_FIELDS, "seed", "logit_bias", "samplers", "n_probs", "stop", "n", "logprobs")
FIELDS += ("top_logprobs", "stream", "n_predict", "dry_sequence_breakers", "ignore_eos")

EDGES = [0, 1, -1, 2, 2**31 - 1, 2**31, -(2**31) - 1, 2**40, 2**63, -(2**64)]
PLAUSIBLE = st.one_of(
    st.integers(0, 64), st.floats(0, 2), st.sampled_from([0, 1, -1, 0.5, 40]), st.booleans()
)
HOSTILE = st.one_of(
    st.none(),
    st.sampled_from(EDGES),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    st.lists(st.one_of(st.integers(-3, 2**33), st.text(max_size=3)), max_size=3),
    st.lists(st.tuples(st.integers(-3, 2**33), st.floats(-200, 200)), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(-3, 100), max_size=2),
)
VALUES = st.one_of(PLAUSIBLE, PLAUSIBLE, HOSTILE)  # one_of picks each branch alike
BUDGET = {"max_tokens": 3, "n_predict": 3, "max_output_tokens": 3}


@pytest.fixture(scope="module")
def fuzz_server(tiny_paths, serve_home):
    from llamay.serve import create_app
    from llamay.serve.models import Models
    from tests.serve.conftest import running

    app = create_app(Models({"tiny": tiny_paths["tiny"]}, use_store=False, default_keep_alive=-1))
    with running(app) as s:
        yield s


class VictimLoop:
    """Greedy chat streams, one after another on a thread, each checked against the
    model's own output, for as long as the fuzzing runs."""

    def __init__(self, url: str, expected: str):
        self.url, self.expected = url, expected
        self.done, self.failures = 0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _one(self, c: httpx.Client) -> str:
        body = {"model": "tiny", "messages": VICTIM_MSGS, "max_tokens": VICTIM_TOKENS}
        body |= {"temperature": 0, "stream": True}
        text = []
        with c.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunk = json.loads(line[6:])
                    assert "error" not in chunk, chunk
                    text += [ch["delta"].get("content") or "" for ch in chunk["choices"]]
        return "".join(text)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=300) as c:
            while not self._stop.is_set():
                try:
                    text = self._one(c)
                    if text != self.expected:
                        self.failures.append(f"victim got {text!r}")
                except Exception as e:  # noqa: BLE001 - every failure is reported
                    self.failures.append(f"victim failed: {type(e).__name__}: {e}")
                self.done += 1

    def __enter__(self) -> VictimLoop:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=300)


def server_error_in_stream(text: str) -> bool:
    """Whether a 200 stream carries an in-band error a 5xx would have been."""
    for line in text.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        try:
            event = json.loads(line[6:])
        except ValueError:
            return True  # not even JSON
        err = event.get("error") if isinstance(event, dict) else None
        if isinstance(err, dict) and (
            err.get("type") in ("server_error", "api_error") or int(err.get("code") or 0) >= 500
        ):
            return True
    return False


@pytest.mark.slow
def test_fuzzed_fields_never_5xx_nor_hurt_a_victim(fuzz_server, tiny):
    apis = sorted(generation_requests({}))
    failures: list[str] = []
    statuses: list[int] = []

    @seed(22)
    @settings(
        max_examples=100,
        deadline=None,
        database=None,
        derandomize=False,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(
        api=st.sampled_from(apis),
        fields=st.dictionaries(st.sampled_from(FIELDS), VALUES, min_size=1, max_size=4),
    )
    def attack(api, fields):
        path, body = generation_requests(fields)[api]
        # a small token budget whatever was drawn, so each example stays short
        if "options" in body:
            body["options"] = {**body["options"], "num_predict": 3}
            body["stream"] = False
        else:
            body |= {k: v for k, v in BUDGET.items() if k in body or k in fields}
        try:
            r = c.post(path, json=body)
        except ValueError:  # a value JSON cannot carry (httpx refuses to send it)
            return
        statuses.append(r.status_code)
        if r.status_code >= 500 or (r.status_code == 200 and server_error_in_stream(r.text)):
            failures.append(f"{api} {json.dumps(body, default=str)[:300]} -> {r.text[:300]}")

    with (
        VictimLoop(fuzz_server.url, victim_oracle(tiny)) as victims,
        httpx.Client(base_url=fuzz_server.url, timeout=120) as c,
    ):
        attack()
    assert not failures, "\n".join(failures[:20])
    assert not victims.failures, "\n".join(victims.failures[:10])
    assert victims.done >= 2  # victims really ran alongside
    assert statuses.count(200) >= 20, statuses  # and so did generations, not only 400s
