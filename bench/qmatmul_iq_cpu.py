"""llamacpp numerics for the i-quants, TQ1_0/TQ2_0 and MXFP4 on CPU: the native kernel
(src/qmatmul_ggml_iq.cc) vs the XLA emulation of ggml's kernels (quant.ggml_iq_dot).

    .venv/bin/python bench/qmatmul_iq_cpu.py [--n 2048] [--k 2048] [--m 1,8] [--layers 4]

x [M, K] @ W.T for W [N, K] of each type, L layers stacked and run under `lax.scan`
(the native kernel reads each layer in place). Printed per type and M: µs per matmul
(median of `reps` interleaved timed runs after a compile run) for "native" and
"emulation", their ratio, and max |native - emulation| (0: bit-identical). Numbers only;
the CPU is shared, so note `uptime` beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from llamay.gguf.constants import GGMLType
from llamay.kernels_cpu.qmatmul import qmatmul_native
from llamay.quant import QTensor, qtensor
from llamay.quant.ggml_iq_dot import IQ_DOT_TYPES
from llamay.quant.quantize import random_blocks

T = GGMLType


def weight(t: GGMLType, n: int, k: int) -> np.ndarray:
    raw = random_blocks(t, n, k, 0, scales=(0.001, 0.002))
    rng = np.random.default_rng(0)
    if t == T.MXFP4:  # e8m0 exponents near 2^-5 (random ones overflow f32)
        raw[:, ::17] = rng.integers(118, 124, raw[:, ::17].shape)
    if t == T.IQ1_M:  # its f16 d (the scale words' top nibbles): finite, ~0.002
        blocks = raw.reshape(n, -1, 56)
        d = rng.uniform(0.001, 0.003, blocks.shape[:2]).astype(np.float16).view(np.uint16)
        for i in range(4):
            nib = ((d >> (4 * i)) & 0xF).astype(np.uint8)
            blocks[..., 49 + 2 * i] = (blocks[..., 49 + 2 * i] & 0x0F) | (nib << 4)
    return raw


def run(t: GGMLType, n: int, k: int, layers: int, m: int, reps: int) -> dict:
    raw = weight(t, n, k)
    data = jnp.asarray(np.ascontiguousarray(np.broadcast_to(raw, (layers, *raw.shape))))
    x = jnp.asarray(np.random.default_rng(1).standard_normal((m, k)).astype(np.float32))
    zeros = jnp.zeros((m, n), jnp.float32)

    def native(x, data):
        def body(acc, i):
            y = qmatmul_native(x, QTensor(data, t, k, "llamacpp"), "llamacpp", layer=i)
            return acc + y, None

        return jax.lax.scan(body, zeros, jnp.arange(layers, dtype=jnp.int32))[0]

    def emulation(x, data):
        def body(acc, d):
            return acc + qtensor.ggml_matmul(x, QTensor(d, t, k, "llamacpp")), None

        return jax.lax.scan(body, zeros, data)[0]

    fns = {"native": jax.jit(native), "emulation": jax.jit(emulation)}
    outs = {name: np.asarray(f(x, data)) for name, f in fns.items()}
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, f in fns.items():
            t0 = time.perf_counter()
            f(x, data).block_until_ready()
            times[name].append((time.perf_counter() - t0) / layers)
    us = {name: float(np.median(ts)) * 1e6 for name, ts in times.items()}
    diff = float(np.abs(outs["native"] - outs["emulation"]).max())
    return dict(type=t.name, n=n, k=k, m=m, layers=layers, native_us=round(us["native"], 1),
                emulation_us=round(us["emulation"], 1),
                speedup=round(us["emulation"] / us["native"], 1), max_diff=diff)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--m", default="1,8", help="activation rows")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--types", default=",".join(t.name for t in IQ_DOT_TYPES))
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    args = ap.parse_args()
    print(f"# backend {jax.default_backend()}, load average {os.getloadavg()[0]:.2f}")
    if not args.json:
        print("| type | M | native µs | emulation µs | emulation / native | max diff |")
        print("|---|---|---|---|---|---|")
    for name in args.types.split(","):
        for m in (int(v) for v in args.m.split(",")):
            r = run(T[name], args.n, args.k, args.layers, m, args.reps)
            if args.json:
                print(json.dumps(r), flush=True)
            else:
                print(f"| {r['type']} | {m} | {r['native_us']} | {r['emulation_us']} "
                      f"| {r['speedup']} | {r['max_diff']:g} |", flush=True)  # fmt: skip
    print(f"# load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
