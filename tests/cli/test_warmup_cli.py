"""`llamay warmup`: after it, a new `llamay generate` process compiles nothing (every
program it asks for is in the persistent compilation cache) and prints what a plain run
prints; with --serve, the same holds for a server's engine. Each command runs in its own
process with its own fresh LLAMAY_CACHE; a listener on JAX's compilation-cache events
counts the programs asked for and the cache hits."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from llamay.runtime import cache_root

pytestmark = [pytest.mark.model, pytest.mark.slow]

# Hooks JAX's cache events, then runs the CLI (argv: "cli", args...) or serves one greedy
# request on `llamay serve --parallel 8`'s engine (argv: "serve", model); prints the
# counts last.
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
try:
    if sys.argv[1] == "cli":
        from llamay_cli.main import app
        app(sys.argv[2:], prog_name="llamay", standalone_mode=False)
    else:
        import llamay
        from llamay.engine.api import Request
        from llamay.sample import GREEDY
        from llamay.serve.models import make_engine
        m = llamay.load(sys.argv[2])
        engine = make_engine(m, 8)
        h = engine.submit(Request(m.tokenize("Once upon a time"), 4, GREEDY))
        print(m.detokenize([ev.token_id for ev in h]))
        engine.close()
finally:
    print("COUNTS " + json.dumps(counts), file=sys.stderr)
"""


def _run(cache, *args) -> tuple[str, dict]:
    # the native kernels this session built, shared: else each fresh cache compiles them
    # again (minutes a process) and they are not what this test is about
    kernels = cache_root() / "kernels_cpu"
    if kernels.is_dir() and not (cache / "kernels_cpu").exists():
        cache.mkdir(parents=True, exist_ok=True)
        (cache / "kernels_cpu").symlink_to(kernels, target_is_directory=True)
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


def _compiles(counts: dict) -> int:
    return counts["requests"] - counts["hits"]


@pytest.mark.parametrize("numerics", ["exact", "llamacpp"])
def test_generate_after_warmup_compiles_nothing(smollm2_path, tmp_path, numerics):
    generate = ("generate", "-m", smollm2_path, "-n", 4, "--temperature", 0,
                "--numerics", numerics, "Once upon a time")  # fmt: skip

    plain_out, plain = _run(tmp_path / "plain", "cli", *generate)
    assert _compiles(plain) > 0  # a cold cache: the counter sees compiles

    warm = tmp_path / "warm"
    _run(warm, "cli", "warmup", smollm2_path, "--length", 64, "--prefill-buckets", 16,
         "--numerics", numerics)  # fmt: skip
    out, counts = _run(warm, "cli", *generate)

    assert counts["requests"] > 0
    assert _compiles(counts) == 0, counts
    assert out == plain_out
    assert len(out.strip()) > 0


def test_serve_engine_after_warmup_compiles_nothing(smollm2_path, tmp_path):
    warm = tmp_path / "warm"
    _run(warm, "cli", "warmup", smollm2_path, "--serve", "--length", 64, "-p", 16)
    out, counts = _run(warm, "serve", smollm2_path)
    assert counts["requests"] > 0
    assert _compiles(counts) == 0, counts
    assert len(out.strip()) > 0
