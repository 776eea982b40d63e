"""One process of the two-process (multi-host) test: run by test_eval_multihost.py.

    python multihost_worker.py MODEL OUT.npz   (env: JAX_COORDINATOR_ADDRESS,
                                               JAX_NUM_PROCESSES, JAX_PROCESS_ID, XLA_FLAGS)

Joins the cluster through `initialize_distributed`, shards MODEL over a dp=2,tp=2 mesh
spanning both processes, and (process 0) saves the sharded logits and scores with their
inputs, for the test to compare against the unsharded model in its own process.
"""

from __future__ import annotations

import json
import sys

import jax
import numpy as np

from llamay.model.sharding import initialize_distributed

CONTEXTS = ["The capital of France is", "Once upon a time", "", "A B C "]
CONTINUATIONS = [" Paris", " there was a princess", "Hello world", "D"]


def main(model_path: str, out: str) -> None:
    initialize_distributed()  # before anything touches a device
    import llamay
    from llamay.model.score import batch_logits
    from llamay.model.sharding import fetch, make_mesh, put_batch, sharded_model

    assert jax.process_count() == 2 and jax.local_device_count() == 2, jax.devices()
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 1000, (4, 32)).astype(np.int32)
    positions = np.tile(np.arange(32, dtype=np.int32), (4, 1))
    positions[1, 20:] = 32  # a padded row

    m = llamay.load(model_path)
    mesh = make_mesh("dp=2,tp=2")
    # one mesh over both processes' devices (not two local meshes)
    assert {d.process_index for d in mesh.devices.flat} == {0, 1}
    sm = sharded_model(m, mesh)
    logits = batch_logits(
        m.config, sm.weights, put_batch(tokens, mesh), put_batch(positions, mesh), mesh=mesh
    )
    logits = fetch(logits)
    scores = sm.score(CONTEXTS, CONTINUATIONS, batch=4)
    if jax.process_index() == 0:
        np.savez(
            out,
            tokens=tokens,
            positions=positions,
            logits=logits,
            logprobs=np.array([s[0] for s in scores], np.float64),
            greedy=np.array([s[1] for s in scores]),
            texts=json.dumps([CONTEXTS, CONTINUATIONS]),
        )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
