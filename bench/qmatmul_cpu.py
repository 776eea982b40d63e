"""Exact-numerics matmul formulations on XLA CPU, per GGML type, at SmolLM2 / Gemma 3 shapes.

    .venv/bin/python bench/qmatmul_cpu.py [--m 1,2,8,128] [--cases smollm2] [--reps 5] [--json]
    .venv/bin/python bench/qmatmul_cpu.py --native [--cases smollm2,gemma3,types] [--m 1,8]

Each case is x [M, K] @ W.T for W [N, K] of one GGML type, stacked L times and run under
`lax.scan` as a model's layers are (so the weights come from memory, not from cache,
and the scan's per-layer slicing is included); embeddings / LM heads run once (L = 1).
Formulations (all exact math: f32 products of the dequantised values, f32 sums):

- gguf-whole: the GGUF blocks dequantised whole, then one dot (qmatmul before cpu_dot);
- gguf-chunked: `cpu_dot.blocks_matmul` (row chunks that stay in cache);
- affine: `cpu_dot.affine_matmul` over the load-time repack (int8 q + f32 scales);
  what `qmatmul` runs on CPU;
- f32-dense: a plain f32 weight (no dequantisation: the bandwidth-bound reference);
- block-reduce: Σ_b s_b (x_b·q_b) + o_b Σ x_b as a dot with the group as batch dim;
- col-reduce: q transposed [K, N], dequantised and reduced over K in one fusion;
- affine-t: the affine repack stored transposed ([K, N] quants, [K/g, N] scales),
  dequantised to f32 [K, N] and multiplied as x @ W (no row chunks: layer shapes);
- w8a8: llama.cpp's way, not exact numerics (its rel err is the activations' int8
  rounding): x quantised per group to int8, an int8 x int8 -> int32 dot with the
  group as batch dim, per-group scales applied to the int32 sums. XLA CPU (jax 0.12)
  converts both sides to s32 and runs a generic dot: no VNNI kernel.

`--native`: instead, the native kernels (`llamay.kernels_cpu`) in both numerics,
"native-exact" and "native-llamacpp", each layer read in place from the stacked weight
(as the layer scan does); the "types" cases cover every type both numerics take.

Printed per case: µs per matmul (median of `reps` timed runs after a compile run,
interleaved across formulations), G MAC/s and the max error relative to float64.
Numbers only; the CPU is shared, so note `uptime` beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from llamay.gguf.constants import GGMLType
from llamay.quant import AffineQTensor, QTensor, cpu_dot, dequantize
from llamay.quant.formulas import affine_values
from llamay.quant.layouts import jax_backend
from llamay.quant.quantize import random_blocks

T = GGMLType
# name: (type, N, K, L): weights as in the two reference files.
CASES = {
    "smollm2": [
        ("attn_q", T.Q4_1, 576, 576, 30),
        ("ffn_up", T.Q4_1, 1536, 576, 30),
        ("ffn_down", T.Q4_1, 576, 1536, 30),
        ("head", T.Q8_0, 49152, 576, 1),
    ],
    "gemma3": [
        ("ffn_up", T.Q5_0, 2048, 640, 18),
        ("ffn_down", T.Q4_K, 640, 2048, 9),
        ("ffn_down", T.Q6_K, 640, 2048, 9),
        ("attn_v", T.Q8_0, 256, 640, 9),
        ("head", T.Q8_0, 262144, 640, 1),
    ],
    "types": [
        *((f"ffn_up_{t.name}", t, 1536, 576, 30) for t in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1)),
        ("ffn_up_Q8_0", T.Q8_0, 1536, 576, 30),
        *((f"ffn_down_{t.name}", t, 576, 1536, 30) for t in (T.Q2_K, T.Q3_K, T.Q4_K)),
        *((f"ffn_down_{t.name}", t, 576, 1536, 30) for t in (T.Q5_K, T.Q6_K)),
        *((f"ffn_up_{t.name}", t, 1536, 576, 30) for t in (T.F16, T.BF16, T.F32)),
        ("attn_k", T.Q4_1, 192, 576, 30),
    ],
    "other": [
        ("ffn_up", T.Q4_0, 1536, 576, 30),
        ("head", T.F16, 49152, 576, 1),
        ("head", T.F32, 49152, 576, 1),
    ],
}


def random_weight(t: GGMLType, n: int, k: int, seed: int = 0) -> np.ndarray:
    """GGUF bytes [n, row_bytes] of a weight of ~0.02 scale: random quants, small scales."""
    return random_blocks(t, n, k, seed, scales=(0.001, 0.002))


def formulations(t: GGMLType, raw: np.ndarray, n: int, k: int) -> dict[str, tuple]:
    """name -> (fn(x, *weights) for ONE layer, host weights (numpy, stacked later))."""
    bk = jax_backend()

    def gguf_whole(x, data):
        w = QTensor(data, t, k).dequantize()
        return jnp.einsum("mk,nk->mn", x, w, precision="highest")

    def gguf_chunked(x, data):
        return cpu_dot.blocks_matmul(x, data, t, k)

    def f32_dense(x, w):
        return jnp.einsum("mk,nk->mn", x, w, precision="highest")

    out = {
        "gguf-whole": (gguf_whole, (raw,)),
        "gguf-chunked": (gguf_chunked, (raw,)),
        "f32-dense": (f32_dense, (dequantize(raw, t),)),
    }
    if not cpu_dot.repackable(t):
        return out
    q, s, o = cpu_dot.repack(raw, t)
    g = k // s.shape[-1]
    parts = (q, s) if o is None else (q, s, o)

    def affine(x, q, s, o=None):
        return cpu_dot.affine_matmul(x, AffineQTensor(q, s, o, t))

    def block_reduce(x, q, s, o=None):
        xb = x.reshape(x.shape[0], -1, g)
        qb = q.reshape(n, -1, g).astype(jnp.float32)
        y = (jnp.einsum("mbk,nbk->mnb", xb, qb, precision="highest") * s[None]).sum(-1)
        if o is not None:
            y = y + jnp.einsum("mb,nb->mn", xb.sum(-1), o, precision="highest")
        return y

    def col_reduce(x, qt, st, ot=None):  # qt [K, N], st/ot [K // g, N]
        w = affine_values(bk, qt.T, st.T, None if ot is None else ot.T).T
        return (x[:, :, None] * w[None]).sum(1)

    def affine_t(x, qt, st, ot=None):  # qt [K, N], st/ot [K // g, N]
        w = qt.reshape(-1, g, n).astype(jnp.float32) * st[:, None]
        if ot is not None:
            w = w + ot[:, None]
        return jnp.einsum("mk,kn->mn", x, w.reshape(k, n), precision="highest")

    def w8a8(x, q, s, o=None):
        xb = x.reshape(x.shape[0], -1, g)
        d = jnp.max(jnp.abs(xb), -1) / 127
        qa = jnp.round(xb / jnp.where(d == 0, 1, d)[..., None]).astype(jnp.int8)
        isum = jax.lax.dot_general(  # [blocks, M, N]
            qa, q.reshape(n, -1, g), (((2,), (2,)), ((1,), (1,))),
            preferred_element_type=jnp.int32,
        )  # fmt: skip
        y = jnp.einsum("bmn,mb,nb->mn", isum.astype(jnp.float32), d, s)
        if o is not None:
            y = y + jnp.einsum("mb,nb->mn", xb.sum(-1), o, precision="highest")
        return y

    transposed = tuple(np.ascontiguousarray(a.T) for a in parts)
    out |= {
        "affine-t": (affine_t, transposed),
        "w8a8": (w8a8, parts),
        "affine": (affine, parts),
        "block-reduce": (block_reduce, parts),
        "col-reduce": (col_reduce, transposed),
    }
    return out


def scanned(fn: Callable, m: int, n: int) -> Callable:
    """jit(x, stacked weights): Σ over the L layers of fn(x, layer's weights)."""

    def run(x, *stacked):
        def body(acc, layer):
            return acc + fn(x, *layer), None

        return jax.lax.scan(body, jnp.zeros((m, n), jnp.float32), stacked)[0]

    return jax.jit(run)


def run_case(role, t, n, k, layers, m, reps, only) -> list[dict]:
    raw = random_weight(t, n, k)
    w64 = dequantize(raw, t).astype(np.float64)
    x = np.random.default_rng(1).standard_normal((m, k)).astype(np.float32)
    want = layers * (x.astype(np.float64) @ w64.T)
    forms = formulations(t, raw, n, k)
    if only:
        forms = {name: f for name, f in forms.items() if name in only}
    if n * k > (1 << 23):  # the heads: these take seconds there (no row chunks)
        skip = ("-reduce", "affine-t", "w8a8")
        forms = {name: f for name, f in forms.items() if not name.endswith(skip)}
    jitted, args, errors = {}, {}, {}
    xj = jnp.asarray(x)
    for name, (fn, host) in forms.items():
        stacked = tuple(jnp.asarray(np.broadcast_to(a, (layers, *a.shape))) for a in host)
        jitted[name], args[name] = scanned(fn, m, n), stacked
        got = np.asarray(jitted[name](xj, *stacked))
        errors[name] = float(np.abs(got - want).max() / np.abs(want).max())
    times: dict[str, list[float]] = {name: [] for name in jitted}
    for _ in range(reps):
        for name, f in jitted.items():
            t0 = time.perf_counter()
            f(xj, *args[name]).block_until_ready()
            times[name].append((time.perf_counter() - t0) / layers)
    rows = []
    for name, ts in times.items():
        sec = float(np.median(ts))
        rows.append(
            dict(role=role, type=t.name, n=n, k=k, layers=layers, m=m, formulation=name,
                 us=round(sec * 1e6, 1), gmacs=round(n * k * m / sec / 1e9, 2),
                 rel_err=float(f"{errors[name]:.2e}"))
        )  # fmt: skip
    return rows


def run_native(role, t, n, k, layers, m, reps) -> list[dict]:
    """native-exact and native-llamacpp (where the kernels take the type), layer by layer
    under a scan that indexes the stacked weight (no per-layer copy)."""
    from llamay.kernels_cpu.qmatmul import qmatmul_native

    if t in (T.BF16,):
        vals = np.random.default_rng(0).standard_normal((n, k)).astype(np.float32) * 0.02
        raw = (vals.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(n, -1)
    else:
        raw = random_weight(t, n, k)
    stack = np.broadcast_to(raw, (layers, *raw.shape))
    x = jnp.asarray(np.random.default_rng(1).standard_normal((m, k)).astype(np.float32))
    rows, jitted, args = [], {}, {}
    for numerics in ("exact", "llamacpp"):
        w = QTensor.from_raw(np.ascontiguousarray(stack), t, numerics)
        probe = qmatmul_native(x, QTensor(w.data[0], t, k, numerics), numerics)
        if probe is None:
            continue

        def run(x, data, numerics=numerics):
            def body(acc, i):
                y = qmatmul_native(x, QTensor(data, t, k, numerics), numerics, layer=i)
                return acc + y, None

            idx = jnp.arange(layers, dtype=jnp.int32)
            return jax.lax.scan(body, jnp.zeros((m, n), jnp.float32), idx)[0]

        jitted[numerics], args[numerics] = jax.jit(run), w.data
        jitted[numerics](x, w.data).block_until_ready()
    times: dict[str, list[float]] = {name: [] for name in jitted}
    for _ in range(reps):
        for name, f in jitted.items():
            t0 = time.perf_counter()
            f(x, args[name]).block_until_ready()
            times[name].append((time.perf_counter() - t0) / layers)
    for name, ts in times.items():
        sec = float(np.median(ts))
        rows.append(
            dict(role=role, type=t.name, n=n, k=k, layers=layers, m=m,
                 formulation=f"native-{name}", us=round(sec * 1e6, 1),
                 gmacs=round(n * k * m / sec / 1e9, 2), rel_err=float("nan"))
        )  # fmt: skip
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", default="1,2,8,128", help="activation rows (batch x tokens)")
    ap.add_argument("--cases", default="smollm2,gemma3,other", help=",".join(CASES))
    ap.add_argument("--only", default="", help="comma-separated formulations (default all)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    ap.add_argument("--native", action="store_true", help="the native kernels, both numerics")
    args = ap.parse_args()
    only = {f for f in args.only.split(",") if f}
    load = os.getloadavg()[0]
    if not args.json:
        print(f"# backend {jax.default_backend()}, load average {load:.2f}")
        print(
            f"| {'case':<16} | {'M':>4} | {'formulation':<13} | {'µs':>9} "
            f"| {'GMAC/s':>7} | rel err |"
        )
        print("|" + "|".join("-" * w for w in (18, 6, 15, 11, 9, 9)) + "|")
    for case in args.cases.split(","):
        for role, t, n, k, layers in CASES[case]:
            for m in (int(v) for v in args.m.split(",")):
                if args.native:
                    results = run_native(role, t, n, k, layers, m, args.reps)
                else:
                    results = run_case(role, t, n, k, layers, m, args.reps, only)
                for r in results:
                    if args.json:
                        print(json.dumps(r | {"load": round(load, 2)}), flush=True)
                        continue
                    name = f"{t.name} {n}x{k}"
                    print(
                        f"| {name:<16} | {m:>4} | {r['formulation']:<13} | {r['us']:>9.1f} "
                        f"| {r['gmacs']:>7.2f} | {r['rel_err']:.1e} |",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
