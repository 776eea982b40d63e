"""Decode attention alone over a paged pool of each KV cache type: the dispatcher's choice
(`llamay.kernels.attention`: on CPU the native kernel, which reads quantised rows in
place) against the reference it replaces (pages gathered, dequantised, dense attention),
SmolLM2-135M's shape by default (30 layers, 9 query heads over 3 kv heads of 64).

    .venv/bin/python bench/kv_attention.py [--context 512] [--rows 1] [--types f16,q8_0,q4_0]

Prints one JSON object: per type, ms per decode step (all layers; the best and the
median of --repeat timed calls) for "dispatch" and "reference".
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np


def main() -> None:
    import jax
    import jax.numpy as jnp

    from llamay import kernels
    from llamay.kernels.attention import paged_reference
    from llamay.kv.types import KV_TYPES
    from llamay.quant import kv_cache

    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--heads", default="9,3,64", help="query heads, kv heads, head dim")
    ap.add_argument("--types", default="f16,q8_0,q4_0")
    ap.add_argument("--repeat", type=int, default=20)
    a = ap.parse_args()
    H, K, D = map(int, a.heads.split(","))
    L, B, ps = a.layers, a.rows, 16
    M = -(-a.context // ps)
    P = B * M + 1
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((B, 1, H, D)), jnp.float32)
    table = jnp.asarray(np.arange(1, P).reshape(B, M), jnp.int32)
    pos = jnp.full((B, 1), a.context - 1, jnp.int32)
    x = jnp.asarray(rng.standard_normal((L, P, ps, K, D)), jnp.float32)
    out = {"load_average": os.getloadavg(), "context": a.context, "rows": B, "types": {}}
    for name in a.types.split(","):
        t = KV_TYPES[name]
        pool = kv_cache.encode(x, jnp.zeros((1, t.row_width(D)), t.dtype))

        def step(attn, q, k, v):
            def layer(c, i):
                y = attn(q, k, v, i)
                return c + y.sum(), None

            return jax.lax.scan(layer, jnp.float32(0), jnp.arange(L, dtype=jnp.int32))[0]

        def dispatch(q, k, v, i):
            return kernels.attention(q, k, v, pos, page_table=table, layer=i, scale=D**-0.5)

        def reference(q, k, v, i):
            return paged_reference(q, k, v, table, pos, i, scale=D**-0.5)

        row = {}
        for label, fn in (("dispatch", dispatch), ("reference", reference)):
            f = jax.jit(lambda q, k, v, fn=fn: step(fn, q, k, v))
            f(q, pool, pool).block_until_ready()
            times = []
            for _ in range(a.repeat):
                t0 = time.perf_counter()
                f(q, pool, pool).block_until_ready()
                times.append((time.perf_counter() - t0) * 1e3)
            row[label] = {"best_ms": min(times), "median_ms": float(np.median(times))}
        out["types"][name] = row
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
