"""A server that warms up at start (issue 18): `/health` answers llama-server's 503
"Loading model" body while its configured model loads and its engine's programs are
primed, then `{"status": "ok"}`; after that, the first request of every shape class (a
short prompt, a long one, a prefix-cache hit on it, a constrained one, one with top-N
log-probabilities, 8 at once) compiles nothing and asks the persistent cache for
nothing: listeners on JAX's backend-compile and cache-request events count every XLA
compilation in the process and every program traced and lowered anew."""

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
    read back from it was traced and lowered all the same), while registered."""

    def __init__(self):
        self.n = self.cache_requests = 0

    def __call__(self, event: str, duration: float, **_) -> None:
        if event == BACKEND_COMPILE:
            self.n += 1

    def request(self, event: str, **_) -> None:
        if event == CACHE_REQUEST:
            self.cache_requests += 1


def completion(url: str, **body) -> dict:
    r = httpx.post(f"{url}/completion", json={"temperature": 0, **body}, timeout=600)
    assert r.status_code == 200, r.text
    return r.json()


def test_health_loading_then_ok_and_first_requests_compile_nothing():
    # a small context keeps the programs few: page tables of 16 and 32 pages
    models = Models({"tiny": tiny_model_file("llama")}, n_ctx=512, use_store=False)
    app = create_app(models, warm_up=True)
    with serve_in_thread(app) as url:
        first = httpx.get(f"{url}/health", timeout=30)
        assert first.status_code == 503 and first.json() == LOADING
        deadline = time.monotonic() + 900
        while (health := httpx.get(f"{url}/health", timeout=30)).status_code == 503:
            assert health.json() == LOADING
            assert time.monotonic() < deadline, "the server never became ready"
            time.sleep(0.5)
        assert health.status_code == 200 and health.json() == {"status": "ok"}

        compiles = Compiles()
        jax.monitoring.register_event_duration_secs_listener(compiles)
        jax.monitoring.register_event_listener(compiles.request)
        try:
            long_prompt = [(7 * i) % 4000 + 100 for i in range(300)]
            completion(url, prompt=[1, 2, 3, 4], n_predict=4)  # short
            completion(url, prompt=long_prompt, n_predict=4)  # long: prefill chunks
            hit = completion(url, prompt=long_prompt + [42, 43], n_predict=4)  # prefix hit
            assert hit["tokens_cached"] >= 288
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
        finally:
            jax.monitoring.unregister_event_duration_listener(compiles)
            jax.monitoring.unregister_event_listener(compiles.request)
