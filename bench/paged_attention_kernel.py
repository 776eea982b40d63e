"""The native paged-attention kernel alone: one decoding row over L layers of random f32 (or
f16) pages in a `lax.scan`, as the step runs it (each layer's pages from memory, not cache,
unless `--distinct 1`), CPU µs per layer (this process, every thread).

    .venv/bin/python bench/paged_attention_kernel.py [--heads 9] [--kv-heads 3] [--dim 64]
        [--context 16,240,1000] [--layers 30] [--distinct 30] [--dtype float32]

Defaults: SmolLM2-135M's attention shape. Numbers only; note `uptime` beside them.
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from llamay.kernels_cpu.attention import paged_attention_native

PAGE = 16


def layer_us(h, kv, d, ctx, layers, distinct, dtype, reps=200) -> float:
    m = -(-ctx // PAGE)
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((1, 1, h, d)), jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((layers, m + 2, PAGE, kv, d)), dtype) for _ in "kv")
    table = jnp.arange(m, dtype=jnp.int32)[None]
    pos = jnp.asarray([[ctx - 1]], jnp.int32)

    @jax.jit
    def run(q, k, v):
        def body(q, layer):
            out = paged_attention_native(q, k, v, table, pos, layer % distinct, scale=d**-0.5)
            return out * 0.5, None

        return jax.lax.scan(body, q, jnp.arange(layers))[0]

    if paged_attention_native(q, k, v, table, pos, 0, scale=1.0) is None:
        raise SystemExit("the native kernels are not built or do not take this case")
    run(q, k, v).block_until_ready()
    best = float("inf")
    for _ in range(5):
        c0 = time.process_time()
        for _ in range(reps):
            out = run(q, k, v)
        out.block_until_ready()
        best = min(best, (time.process_time() - c0) / reps / layers * 1e6)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--context", default="16,240,1000")
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--distinct", type=int, default=30, help="distinct layers (1: in cache)")
    ap.add_argument("--dtype", default="float32")
    a = ap.parse_args()
    dtype = jnp.dtype(a.dtype)
    print(f"# load average {os.getloadavg()[0]:.2f}")
    for ctx in map(int, a.context.split(",")):
        us = layer_us(a.heads, a.kv_heads, a.dim, ctx, a.layers, a.distinct, dtype)
        shape = f"{a.heads}/{a.kv_heads} heads, D {a.dim}, {dtype.name}"
        print(f"context {ctx}: {us:.1f} CPU us per layer ({shape})")


if __name__ == "__main__":
    main()
