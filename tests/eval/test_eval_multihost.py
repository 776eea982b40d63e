"""Multi-host through jax.distributed: two processes on localhost, 2 CPU devices each,
one dp=2,tp=2 mesh across both; their sharded logits and scores equal this process's
unsharded ones."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from llamay.model.score import batch_logits

WORKER = Path(__file__).with_name("multihost_worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two_processes(model: Path, out: Path, timeout: float = 600) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    env |= {
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
        "JAX_PLATFORMS": "cpu",
        "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{free_port()}",
        "JAX_NUM_PROCESSES": "2",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(model), str(out)],
            env={**env, "JAX_PROCESS_ID": str(i)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    try:
        logs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    for i, (p, log) in enumerate(zip(procs, logs, strict=True)):
        assert p.returncode == 0, f"process {i} failed:\n{log[-3000:]}"


def test_two_processes_equal_one(tiny_llama_model, fixtures_dir, tmp_path):
    m = tiny_llama_model
    out = tmp_path / "sharded.npz"
    run_two_processes(fixtures_dir / "tiny" / "llama.gguf", out)
    got = np.load(out)
    tokens, positions = got["tokens"], got["positions"]
    ref = np.asarray(batch_logits(m.config, m.weights, jnp.asarray(tokens), jnp.asarray(positions)))
    real = positions < tokens.shape[1]
    np.testing.assert_allclose(got["logits"][real], ref[real], atol=1e-4, rtol=0)
    contexts, continuations = json.loads(str(got["texts"]))
    want = m.score(contexts, continuations, batch=4)
    np.testing.assert_allclose(got["logprobs"], [w[0] for w in want], atol=1e-4, rtol=1e-5)
    assert got["greedy"].tolist() == [w[1] for w in want]
