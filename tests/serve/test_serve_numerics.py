"""`llamay serve --numerics llamacpp -fa on` as a process: the served SmolLM2 answers
llama.cpp's native /completion with llama.cpp's own greedy tokens and log-probabilities
(tests/fixtures/flash-attn: llama-cpp-python at -fa on over an F16 cache; exact numerics
are 0.1-0.7 away in logits). The server's engine prefills in llama.cpp's ubatches of 512,
as `Model.generate`'s does: the 131-token prompt in chunks of 128 (the server's exact
numerics chunk) left its last 3 tokens to kernels of another batch size: 0.26 off."""

from __future__ import annotations

import httpx
import pytest
from test_serve_cli import serve_process

from tests.model.test_flash_attn import goldens, logprob_error

pytestmark = [pytest.mark.model, pytest.mark.slow]

# Decoding over fewer than 512 cells takes one pass a row whatever llama.cpp's thread
# count (the split path, which follows it, is held to the goldens in test_flash_attn).
RUNS = ("short", "tiled")


def test_llamacpp_numerics_serve_llamacpps_log_probabilities(smollm2_path, serve_home):
    runs = goldens()["models"]["smollm2"]["runs"]
    args = ("--numerics", "llamacpp", "--flash-attn", "on", "-c", "1024")
    with serve_process({"tiny": smollm2_path}, serve_home, *args) as (_, url):
        for name in RUNS:
            run = runs[name]
            want = run["greedy_ids"]
            body = {"prompt": run["prompt_ids"], "n_predict": len(want), "n_probs": 10,
                    "temperature": 0}  # fmt: skip
            r = httpx.post(url + "/completion", json=body, timeout=600)
            assert r.status_code == 200, r.text
            probs = r.json()["completion_probabilities"]
            got = [p["id"] for p in probs]
            assert got == want[: len(got)] and len(want) - len(got) <= 1, name
            tops = [[(a["id"], a["logprob"]) for a in p["top_logprobs"]] for p in probs]
            worst = logprob_error(tops, run)
            print(f"{name}: {len(got)} tokens, logprob max |d| {worst:.2e}")
            assert worst <= 1e-5, name
