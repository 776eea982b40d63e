"""Multi-host through jax.distributed: two processes on localhost, 2 CPU devices each,
one dp=2,tp=2 mesh across both; their sharded logits, scores and perplexity equal this
process's unsharded ones."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from fixture_data import tiny_model_file

from llamay.model.score import batch_logits

WORKER = Path(__file__).with_name("multihost_worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two_processes(argv: list[str], timeout: float = 600) -> list[str]:
    """Run `python *argv` as processes 0 and 1 of one cluster; their outputs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    env |= {
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
        "JAX_PLATFORMS": "cpu",
        "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{free_port()}",
        "JAX_NUM_PROCESSES": "2",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, *argv],
            env={**env, "JAX_PROCESS_ID": str(i)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for i, (p, (_, err)) in enumerate(zip(procs, outs, strict=True)):
        assert p.returncode == 0, f"process {i} failed:\n{err[-3000:]}"
    return [out for out, _ in outs]


def test_two_processes_equal_one(tiny_llama_model, tmp_path):
    m = tiny_llama_model
    out = tmp_path / "sharded.npz"
    run_two_processes([str(WORKER), str(tiny_model_file("llama")), str(out)])
    got = np.load(out)
    tokens, positions = got["tokens"], got["positions"]
    ref = np.asarray(batch_logits(m.config, m.weights, jnp.asarray(tokens), jnp.asarray(positions)))
    real = positions < tokens.shape[1]
    np.testing.assert_allclose(got["logits"][real], ref[real], atol=1e-4, rtol=0)
    contexts, continuations = json.loads(str(got["texts"]))
    want = m.score(contexts, continuations, batch=4)
    np.testing.assert_allclose(got["logprobs"], [w[0] for w in want], atol=1e-4, rtol=1e-5)
    assert got["greedy"].tolist() == [w[1] for w in want]


def test_cli_perplexity_on_two_processes(tiny_llama_model, tmp_path):
    """The documented launch: `llamay eval perplexity --mesh dp=2,tp=2 --distributed` on
    each process gives the single-process perplexity."""
    from llamay.eval import perplexity

    text = tmp_path / "text.txt"
    text.write_text("It was the best of times, it was the worst of times. " * 30)
    cmd = ["-m", "llamay_cli.main", "eval", "perplexity", str(text), "--ctx", "32"]
    cmd += ["-m", str(tiny_model_file("llama")), "--chunks", "4", "--batch", "2"]
    cmd += ["--mesh", "dp=2,tp=2", "--distributed", "--json"]
    outs = [json.loads(o.strip().splitlines()[-1]) for o in run_two_processes(cmd)]
    want = perplexity(tiny_llama_model, text.read_text(), ctx=32, batch=2, max_chunks=4)
    for got in outs:
        assert got["n_chunks"] == want.n_chunks == 4
        assert got["ppl"] == pytest.approx(want.ppl, rel=1e-5)
