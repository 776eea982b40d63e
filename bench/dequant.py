"""Dequantisation throughput per GGML type: numpy and jitted jnp, printed as JSON.

    .venv/bin/python bench/dequant.py [--rows 2048] [--cols 4096] [--reps 5] [--types Q4_K,Q8_0]

For each type: `in_gbps` = packed bytes read per second, `out_gbps` = f32 bytes written
per second, best of `reps` runs (after one warm-up / compile run). Blocks hold random
quants with every scale field set to 1.0, so no NaN or subnormal slows the arithmetic.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from llamay.gguf.constants import GGMLType
from llamay.quant import LAYOUTS, dequantize, dequantize_jnp

ONE = {"float16": np.float16(1.0), "float32": np.float32(1.0)}


def blocks(t: GGMLType, rows: int, cols: int) -> np.ndarray:
    lay = LAYOUTS[t]
    n = cols // lay.block_elems
    raw = np.random.default_rng(0).integers(0, 256, (rows, n, lay.block_bytes), dtype=np.uint8)
    if t in (GGMLType.F32, GGMLType.F16, GGMLType.BF16):
        raw[...] = np.float32(0.5).astype(lay.fields[0].dtype).tobytes()[0]
    pos = 0
    for f in lay.fields:
        if f.dtype in ONE and t not in (GGMLType.F32, GGMLType.F16):
            raw[..., pos : pos + f.nbytes] = np.frombuffer(ONE[f.dtype].tobytes(), np.uint8)
        pos += f.nbytes
    return raw.reshape(rows, -1)


def best_seconds(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--types", default=",".join(t.name for t in LAYOUTS))
    args = ap.parse_args()

    jitted = jax.jit(dequantize_jnp, static_argnums=1)
    results = {}
    for name in args.types.split(","):
        t = GGMLType[name]
        raw = blocks(t, args.rows, args.cols)
        dev = jnp.asarray(raw)
        out_bytes = args.rows * args.cols * 4
        np_s = best_seconds(lambda raw=raw, t=t: dequantize(raw, t), args.reps)
        jnp_s = best_seconds(lambda dev=dev, t=t: jitted(dev, t).block_until_ready(), args.reps)
        results[name] = {
            impl: {
                "seconds": round(s, 6),
                "in_gbps": round(raw.nbytes / s / 1e9, 3),
                "out_gbps": round(out_bytes / s / 1e9, 3),
            }
            for impl, s in (("numpy", np_s), ("jnp_jit", jnp_s))
        }
    print(
        json.dumps(
            {
                "bench": "dequant",
                "backend": jax.default_backend(),
                "device": str(jax.devices()[0]),
                "shape": [args.rows, args.cols],
                "results": results,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
