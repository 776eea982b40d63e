"""`llamay warmup`: after it, a new `llamay generate` process compiles nothing (every
program it asks for is in the persistent compilation cache) and prints what a plain run
prints. Each command runs in its own process with its own fresh LLAMAY_CACHE; a listener
on JAX's compilation-cache events counts the programs asked for and the cache hits."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.model, pytest.mark.slow]

# Runs the CLI in this process after hooking JAX's cache events; prints the counts last.
DRIVER = """
import json, sys
import jax
counts = {"requests": 0, "hits": 0}
names = {"/jax/compilation_cache/compile_requests_use_cache": "requests",
         "/jax/compilation_cache/cache_hits": "hits"}
def count(event, **_):
    if event in names:
        counts[names[event]] += 1
jax.monitoring.register_event_listener(count)
from llamay_cli.main import app
try:
    app(sys.argv[1:], prog_name="llamay", standalone_mode=False)
finally:
    print("COUNTS " + json.dumps(counts), file=sys.stderr)
"""


def _llamay(cache, *args) -> tuple[str, dict]:
    env = {**os.environ, "LLAMAY_CACHE": str(cache)}
    env.pop("LLAMAY_NO_COMPILE_CACHE", None)
    p = subprocess.run(
        [sys.executable, "-c", DRIVER, *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    counts = json.loads(p.stderr.rsplit("COUNTS ", 1)[1].splitlines()[0])
    return p.stdout, counts


def test_generate_after_warmup_compiles_nothing(smollm2_path, tmp_path):
    generate = ("generate", "-m", smollm2_path, "-n", 4, "--temperature", 0, "Once upon a time")

    plain_out, plain = _llamay(tmp_path / "plain", *generate)
    assert plain["requests"] - plain["hits"] > 0  # a cold cache: the counter sees compiles

    warm = tmp_path / "warm"
    _llamay(warm, "warmup", smollm2_path, "--length", 64, "--prefill-buckets", 16)
    out, counts = _llamay(warm, *generate)

    assert counts["requests"] > 0
    assert counts["hits"] == counts["requests"], counts
    assert out == plain_out
    assert len(out.strip()) > 0
