"""Where a decode step's time goes: XLA ops of `decode_logits` under jax.profiler, summed.

    .venv/bin/python bench/decode_profile.py [--model smollm2:135m] [--batch 1] [--steps 5]
        [--slots 256] [--top 25] [--numerics exact|llamacpp] [--paged] [--json] [--prefill T]

`--prefill T`: a T-token prefill (`prefill_logits`, batch 1) instead of decode steps.

`--paged`: the continuous-batching engine's forward instead (`paged_step` over a page pool,
`--slots` positions of context per row in 16-position pages, page tables bucketed as the
engine does), to compare with the dense step at the same context.

Runs `steps` decode steps (after warm-up) under a trace, then prints the ops by total
time per step (ms), with how often each runs per step and its HLO shape, and a share
per kind: dequantisation fusions (f32 [N, K] weights), dots, KV-cache traffic
(dynamic-slice / update-slice / copies / broadcasts of the cache), the rest.
Numbers only; note `uptime` beside them (the CPU is shared).
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

import llamay
from llamay.engine.steps import decode_logits
from llamay.kv import new_dense_kv


def hlo_shapes(hlo: str) -> dict[str, str]:
    """op name -> its result shape, from the optimised HLO text."""
    out = {}
    for m in re.finditer(r"^\s*(?:ROOT )?%([\w.\-]+) = (\S+\[[^\]]*\])", hlo, re.M):
        out[m.group(1)] = m.group(2)
    return out


def kind(name: str, shape: str) -> str:
    if name.startswith("dot"):
        return "dot"
    if "dynamic" in name or name.startswith(("copy", "wrapped_broadcast")):
        return "kv/copies"
    if shape.startswith("f32[") and name.startswith(("add_", "multiply_", "convert_")):
        return "dequant"
    return "other"


def dense_steps(m, b: int, slots: int):
    cfg = m.config
    kv = new_dense_kv(cfg.n_layers, b, slots, cfg.n_kv_heads, cfg.head_dim, m.runtime.kv_dtype)
    tok = jnp.ones((b,), jnp.int32)
    shapes = hlo_shapes(
        decode_logits.lower(cfg, m.weights, kv, tok, jnp.zeros((b,), jnp.int32)).compile().as_text()
    )
    pos = 0

    def steps(n: int):
        nonlocal kv, pos
        for _ in range(n):
            logits, kv = decode_logits(cfg, m.weights, kv, tok, jnp.full((b,), pos, jnp.int32))
            pos += 1
        logits.block_until_ready()

    return shapes, steps


def paged_steps(m, b: int, context: int, n_steps: int, ps: int = 16, positions=None):
    """Decode steps of `paged_step` for b rows `context` positions in (the pool's pages
    filled with zeros: the time does not depend on the values), page tables as wide as
    the engine's for `positions` (default: what 3 + 2 `n_steps` steps reach)."""
    from llamay.arch.decoder import local_layers
    from llamay.engine.paged_steps import paged_step
    from llamay.engine.planning import MIN_VIEW, table_width
    from llamay.kv.pages import new_paged_kv

    cfg = m.config
    if local_layers(cfg).any():
        raise SystemExit("--paged: a model without sliding-window layers (one page pool)")
    P = -(-(positions or context + 3 + 2 * n_steps) // ps)
    M = table_width(P, max(1, MIN_VIEW // ps))
    kv = new_paged_kv(cfg.n_layers, b * P + 1, ps, cfg.n_kv_heads, cfg.head_dim,
                      m.runtime.kv_dtype, 0, 0)  # fmt: skip
    table = np.zeros((b, M), np.int32)
    for j in range(b):
        table[j, :P] = 1 + j * P + np.arange(P)
    fixed = jax.device_put((np.ones((b, 1), np.int32), table, np.zeros(b, np.int32)))
    tok, table_d, last = fixed
    pos = context

    def args(p: int):
        return cfg, m.weights, kv, tok, jax.device_put(np.full((b, 1), p, np.int32)), table_d, last

    shapes = hlo_shapes(paged_step.lower(*args(pos)).compile().as_text())

    def steps(n: int):
        nonlocal kv, pos
        for _ in range(n):
            logits, kv = paged_step(*args(pos))
            pos += 1
        logits.block_until_ready()

    return shapes, steps


def prefill_steps(m, t: int):
    """Prefill steps of `prefill_logits` over a t-token prompt (dense cache of t slots,
    as `llamay bench -p t` runs it)."""
    from llamay.engine.steps import prefill_logits

    cfg = m.config
    tok = jnp.asarray(np.random.default_rng(0).integers(100, 30000, (1, t)), jnp.int32)
    pos = jnp.arange(t, dtype=jnp.int32)[None]
    last = jnp.full((1,), t - 1, jnp.int32)

    def new_kv():
        return new_dense_kv(cfg.n_layers, 1, t, cfg.n_kv_heads, cfg.head_dim, m.runtime.kv_dtype)

    compiled = prefill_logits.lower(cfg, m.weights, new_kv(), tok, pos, last).compile()
    shapes = hlo_shapes(compiled.as_text())

    def steps(n: int):
        for _ in range(n):
            logits, _ = prefill_logits(cfg, m.weights, new_kv(), tok, pos, last)
        logits.block_until_ready()

    return shapes, steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2:135m")
    ap.add_argument("--numerics", default="exact", choices=("exact", "llamacpp"))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--slots", type=int, default=256)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--paged", action="store_true", help="the engine's paged forward")
    ap.add_argument("--prefill", type=int, default=0, help="profile a prefill of this many tokens")
    args = ap.parse_args()

    m = llamay.load(args.model, numerics=args.numerics, progress=False)
    b = args.batch
    if args.prefill:
        shapes, steps = prefill_steps(m, args.prefill)
    elif args.paged:
        shapes, steps = paged_steps(m, b, args.slots, args.steps)
    else:
        shapes, steps = dense_steps(m, b, args.slots)

    steps(3)
    t0 = time.perf_counter()
    steps(args.steps)
    step_ms = (time.perf_counter() - t0) / args.steps * 1e3
    with tempfile.TemporaryDirectory() as d:
        jax.profiler.start_trace(d)
        steps(args.steps)
        jax.profiler.stop_trace()
        trace = json.load(gzip.open(glob.glob(f"{d}/plugins/profile/*/*.trace.json.gz")[0]))
    total, count = collections.Counter(), collections.Counter()
    for e in trace["traceEvents"]:
        name = e.get("name", "")
        if e.get("ph") == "X" and name in shapes:
            total[name] += e["dur"] / 1e3 / args.steps
            count[name] += 1 / args.steps
    kinds = collections.Counter()
    for name, ms in total.items():
        kinds[kind(name, shapes[name])] += ms
    ops_ms = sum(total.values())
    result = dict(
        model=args.model,
        numerics=args.numerics,
        step=f"prefill{args.prefill}" if args.prefill else "paged" if args.paged else "dense",
        context=args.slots,
        batch=b,
        step_ms=round(step_ms, 2),
        ops_ms=round(ops_ms, 2),
        load=round(os.getloadavg()[0], 2),
        kinds={k: round(v, 2) for k, v in kinds.most_common()},
        ops=[
            dict(op=n, ms=round(v, 3), per_step=round(count[n]), shape=shapes[n])
            for n, v in total.most_common(args.top)
        ],
    )
    if args.json:
        print(json.dumps(result))
        return
    print(f"# {args.model} ({args.numerics}, {result['step']}, context {args.slots}) "
          f"batch {b}: {step_ms:.2f} ms/step wall, "
          f"{ops_ms:.2f} ms in XLA ops (load average {result['load']})")  # fmt: skip
    for k, v in kinds.most_common():
        print(f"#   {k:<10} {v:8.2f} ms  {100 * v / ops_ms:5.1f} %")
    print(f"| {'op':<40} | {'ms/step':>8} | {'n':>4} | shape")
    for r in result["ops"]:
        print(f"| {r['op'][:40]:<40} | {r['ms']:>8.3f} | {r['per_step']:>4} | {r['shape']}")


if __name__ == "__main__":
    main()
