"""What the on-device sampler costs a token: `llamay.sample.sample` alone, jit-compiled, on
one row of random logits at a model's vocabulary size, for the greedy sampler and the
default one (llama.cpp's chain: top-k 40, top-p 0.95, min-p 0.05, temperature 0.8).

    .venv/bin/python bench/sampler.py [--vocab 262144,49152] [--rows 1] [--reps 50]

Prints ms per call (min and median of `reps` after a warm-up). Every decode step of
`llamay generate` / `llamay serve` runs it after the forward pass, in the same program.
Numbers only; note `uptime` beside them (the CPU is shared). An older checkout's numbers:
PYTHONPATH pointing at it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from llamay.sample import GREEDY, Sampler, SamplerState, SamplingParams, sample


def time_sampler(s: Sampler, vocab: int, rows: int, reps: int) -> tuple[float, float]:
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.standard_normal((rows, vocab)).astype(np.float32) * 3)
    p = SamplingParams.stack([s] * rows, vocab, None, None)
    state = SamplerState.init([s] * rows, [[1, 2, 3]] * rows, history=4096)
    f = jax.jit(sample)
    tok, state = f(logits, p, state)
    tok.block_until_ready()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        tok, state = f(logits, p, state)
        tok.block_until_ready()
        times.append(time.perf_counter() - t0)
    return min(times) * 1e3, statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", default="262144,49152")
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    print(f"# load average {os.getloadavg()[0]:.2f}, rows {args.rows}")
    print("| vocab | sampler | min ms | median ms |\n|---:|---|---:|---:|")
    for vocab in (int(v) for v in args.vocab.split(",")):
        for name, s in (("greedy", GREEDY), ("default", Sampler())):
            lo, med = time_sampler(s, vocab, args.rows, args.reps)
            print(f"| {vocab} | {name} | {lo:.3f} | {med:.3f} |")


if __name__ == "__main__":
    main()
