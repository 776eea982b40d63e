"""`llamay serve --cache-type-k/--cache-type-v` (llama-server's flags) as a process: the
served model's paged pool has the named types, so its greedy text is the library's with
those types (which differs from the default f32 cache's on this model), and a type that
does not exist is refused at start."""

from __future__ import annotations

import subprocess
import sys

import openai
import pytest
from fixture_data import tiny_model_file
from test_serve_cli import serve_process

import llamay
from llamay.sample import GREEDY

pytestmark = pytest.mark.slow

PROMPT = "Once upon a time"


def greedy_text(path, n: int, **types) -> str:
    m = llamay.load(path, n_ctx=256, **types)
    return m.detokenize(list(m.generation(m.tokenize(PROMPT), n, GREEDY)))


def test_serve_with_quantised_cache_types(serve_home):
    path = tiny_model_file("qwen3")  # head dim 32: block types fit
    want = greedy_text(path, 8, cache_type_k="q4_0", cache_type_v="q4_0")
    assert want != greedy_text(path, 8)  # the flag must matter to be seen
    paths = {"tiny": path}
    args = ("-ctk", "q4_0", "--cache-type-v", "q4_0")
    with serve_process(paths, serve_home, *args) as (_, url):
        c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        r = c.completions.create(model="t", prompt=PROMPT, max_tokens=8, temperature=0)
        assert r.choices[0].text == want


def test_an_unknown_cache_type_is_refused():
    argv = [sys.executable, "-m", "llamay_cli.main", "serve", "--no-store", "-ctk", "q3_k"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "'q3_k' is not a KV cache type" in out.stderr and "--cache-type-k" in out.stderr
