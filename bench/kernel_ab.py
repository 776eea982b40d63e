"""A native-kernel change measured against the same sources built another way, in one
process, the two builds' runs interleaved: the matmul of one weight type and shape, layer
by layer under a scan (weights from memory, as the model reads them).

    .venv/bin/python bench/kernel_ab.py --flags="-DOLD_PATH" --type Q6_K --n 640 --k 2048 \\
        [--m 1,8] [--numerics exact] [--reps 40]

`--flags`: extra compiler flags of build "a" (e.g. a -D that selects the code before a
change, kept under #if while it is measured); build "b" is the library as built for
llamay. Prints per M the 25th-percentile µs per matmul of each, a / b, and the largest
difference of their outputs (relative to the largest output).

Why interleaved: on the shared VMs these sessions run on, a kernel's speed moved by up to
2x between runs minutes apart (session 10: the same build gave 117 and 195 µs), so
numbers from separate runs cannot tell a 10 % change; runs taking turns in one process see
the same machine.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from qmatmul_cpu import random_weight

from llamay.gguf.constants import GGMLType
from llamay.kernels_cpu import build
from llamay.kernels_cpu.qmatmul import qmatmul_native
from llamay.quant import QTensor


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flags", required=True, help="extra compiler flags of build a")
    ap.add_argument("--type", default="Q8_0")
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--k", type=int, default=640)
    ap.add_argument("--m", default="1,8")
    ap.add_argument("--numerics", default="exact", choices=("exact", "llamacpp"))
    ap.add_argument("--reps", type=int, default=40)
    args = ap.parse_args()

    native = build.VARIANTS["native"]
    build.VARIANTS["a"] = build.Variant("a", (*native.flags, *args.flags.split()))
    t, n, k = GGMLType[args.type], args.n, args.k
    layers = max(1, int(2.4e7 // (n * k)))  # some 15 MB of weights or more: not in cache
    raw = random_weight(t, n, k)
    stack = np.ascontiguousarray(np.broadcast_to(raw, (layers, *raw.shape)))
    w = QTensor.from_raw(stack, t, args.numerics)
    print(f"# {t.name} {n}x{k}, {layers} layers, {args.numerics}; a: {args.flags}")
    for m in (int(v) for v in args.m.split(",")):
        x = jnp.asarray(np.random.default_rng(1).standard_normal((m, k)).astype(np.float32))
        runs = {}
        for variant in ("a", "native"):

            def run(x, data, variant=variant):
                rows = x.shape[0]

                def body(acc, i):
                    y = qmatmul_native(
                        x, QTensor(data, t, k, args.numerics), args.numerics, layer=i,
                        variant=variant,
                    )  # fmt: skip
                    return acc + y, None

                idx = jnp.arange(layers, dtype=jnp.int32)
                return jax.lax.scan(body, jnp.zeros((rows, n), jnp.float32), idx)[0]

            runs[variant] = jax.jit(run)
        outs = {v: np.asarray(f(x, w.data)) for v, f in runs.items()}
        times: dict[str, list[float]] = {v: [] for v in runs}
        for _ in range(args.reps):
            for v, f in runs.items():
                t0 = time.perf_counter()
                f(x, w.data).block_until_ready()
                times[v].append((time.perf_counter() - t0) / layers)
        p25 = {v: sorted(ts)[len(ts) // 4] * 1e6 for v, ts in times.items()}
        diff = np.abs(outs["a"] - outs["native"]).max() / max(np.abs(outs["native"]).max(), 1e-30)
        a, b = p25["a"], p25["native"]
        print(f"M={m}: a {a:.1f} µs, b {b:.1f} µs, a/b {a / b:.2f}, max diff {diff:.1e}")


if __name__ == "__main__":
    main()
