"""A server that warms up at start (issue 18): `/health` answers llama-server's 503
"Loading model" body while its configured model loads and the programs of its first
requests are built, then 200 `{"status": "ok", "warming": {...}}` while the rest build
in the background, then `{"status": "ok"}`; after that, the first request of every shape
class (a short prompt, a long one, a prefix-cache hit on it, a constrained one, one with
top-N log-probabilities, 8 at once; with speculative decoding, drafted and verified
ones) compiles nothing and asks the persistent cache for nothing: listeners on JAX's
backend-compile and cache-request events count every XLA compilation in the process and
every program traced and lowered anew."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import jax
import numpy as np
import pytest
from fixture_data import tiny_model_file

from llamay.serve import create_app
from llamay.serve.app import serve_in_thread
from llamay.serve.models import Models

pytestmark = pytest.mark.slow

BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"  # jax._src.dispatch
CACHE_REQUEST = "/jax/compilation_cache/compile_requests_use_cache"
LOADING = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}


class Compiles:
    """Counts XLA compilations, and programs asked of the persistent cache (a program
    read back from it was traced and lowered all the same), inside `with Compiles()`."""

    def __init__(self):
        self.n = self.cache_requests = 0

    def __call__(self, event: str, duration: float, **_) -> None:
        if event == BACKEND_COMPILE:
            self.n += 1

    def request(self, event: str, **_) -> None:
        if event == CACHE_REQUEST:
            self.cache_requests += 1

    def __enter__(self) -> Compiles:
        jax.monitoring.register_event_duration_secs_listener(self)
        jax.monitoring.register_event_listener(self.request)
        return self

    def __exit__(self, *exc) -> None:
        jax.monitoring.unregister_event_duration_listener(self)
        jax.monitoring.unregister_event_listener(self.request)


def completion(url: str, **body) -> dict:
    r = httpx.post(f"{url}/completion", json={"temperature": 0, **body}, timeout=600)
    assert r.status_code == 200, r.text
    return r.json()


def wait_ready(url: str) -> list[dict]:
    """Poll /health from the start until it says ok with nothing warming; the bodies of
    the 200s seen before that (the serving phase)."""
    first = httpx.get(f"{url}/health", timeout=30)
    assert first.status_code == 503 and first.json() == LOADING
    deadline = time.monotonic() + 1200
    serving = []
    while (health := httpx.get(f"{url}/health", timeout=30)).json() != {"status": "ok"}:
        if health.status_code == 503:
            assert health.json() == LOADING and not serving  # never loading again
        else:
            body = health.json()
            assert health.status_code == 200 and set(body) == {"status", "warming"}, body
            assert body["status"] == "ok" and body["warming"]["model"] == "tiny"
            assert 0 <= body["warming"]["done"] <= body["warming"]["total"]
            serving.append(body)
        assert time.monotonic() < deadline, "the server never became ready"
        time.sleep(0.5)
    assert health.status_code == 200
    return serving


def test_health_loading_then_ok_and_first_requests_compile_nothing():
    # a small context keeps the programs few: page tables of 16 and 32 pages
    models = Models({"tiny": tiny_model_file("llama")}, n_ctx=512, use_store=False)
    app = create_app(models, warm_up=True)
    with serve_in_thread(app) as url:
        wait_ready(url)

        with Compiles() as compiles:
            long_prompt = [(7 * i) % 4000 + 100 for i in range(300)]
            completion(url, prompt=[1, 2, 3, 4], n_predict=4)  # short
            completion(url, prompt=long_prompt, n_predict=4)  # long: prefill chunks
            hit = completion(url, prompt=long_prompt + [42, 43], n_predict=4)  # prefix hit
            assert hit["timings"]["cache_n"] >= 288
            completion(url, prompt="Code:", n_predict=6, grammar="root ::= [a-z]+")
            probs = completion(url, prompt=[9, 10, 11], n_predict=3, n_probs=5)
            assert len(probs["completion_probabilities"][0]["top_logprobs"]) == 5
            prompts = [[50 + k, 60 + k, 70 + k] for k in range(8)]
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda p: completion(url, prompt=p, n_predict=6), prompts))
            assert (compiles.n, compiles.cache_requests) == (0, 0)
            # the counter does see a compile (a constant of its own: never in a cache)
            c = int(np.random.default_rng().integers(1 << 30))
            jax.jit(lambda x: x * 3 + c)(np.arange(5))
            assert compiles.n == 1


def test_speculative_requests_compile_nothing_after_ready():
    # --model-draft: the tiny llama drafting for itself (its verify steps, the draft
    # model's own steps and greedy picks are primed); two slots and a 256-token context
    # keep the programs few
    path = tiny_model_file("llama")
    models = Models({"tiny": path}, n_ctx=256, use_store=False, parallel=2)
    models.speculative = {"draft": path, "draft_max": 4, "p_min": 0.0}
    app = create_app(models, warm_up=True)
    with serve_in_thread(app) as url:
        wait_ready(url)
        with Compiles() as compiles:
            prompt = [1, *range(400, 420)]
            one = completion(url, prompt=prompt, n_predict=10)
            assert one["timings"]["draft_n"] > 0  # drafted and verified
            with ThreadPoolExecutor(2) as pool:  # two rows verify in one step
                got = list(
                    pool.map(
                        lambda p: completion(url, prompt=p, n_predict=8), [prompt[:12], [1, 7, 8]]
                    )
                )
            assert all(g["timings"]["draft_n"] > 0 for g in got)
            constrained = completion(url, prompt="Code:", n_predict=6, grammar="root ::= [a-z]+")
            assert constrained["content"].isalpha()
            assert (compiles.n, compiles.cache_requests) == (0, 0)
