"""Scored tokens/s of batched log-likelihood scoring; one JSON line per batch size.

    .venv/bin/python -m bench.score [-m smollm2:135m] [-b 1 8 32] [-t 128] [-r 3]
                                    [--scored N] [--choices N] [--numerics exact]
                                    [--mesh dp=2,tp=2]

Each step scores `batch` rows of `tokens` random tokens: every target (a row of T tokens
scores T - 1), or with `--scored N` the last N of each row (a multiple-choice task's
continuation after its context); with `--choices N` each row becomes N rows that differ in
their last `--scored` tokens (default 1): N answers after one context, one-token as
MMLU's or longer endings as HellaSwag's.
Timings exclude compilation (one warm-up step per batch
size, reported as `compile_s`); `tokens_per_s` counts the rows' tokens (T - 1 each) over
the median of `-r` steps, `rows_per_s` the rows.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default="smollm2:135m")
    ap.add_argument("-b", "--batch", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("-t", "--tokens", type=int, default=128, help="tokens per row")
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("--scored", type=int, default=None, help="targets scored per row")
    ap.add_argument("--choices", type=int, default=1, help="answers per context")
    ap.add_argument("--numerics", default="exact")
    ap.add_argument("--mesh", default=None)
    args = ap.parse_args()

    import llamay
    from llamay.eval.scoring import Row, score_rows
    from llamay.model.sharding import parse_mesh, sharded_model

    t0 = time.perf_counter()
    m = llamay.load(args.model, numerics=args.numerics)
    sizes = parse_mesh(args.mesh)
    m = sharded_model(m, sizes if sizes["data"] * sizes["model"] > 1 else None)
    load_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    default = 1 if args.choices > 1 else args.tokens - 1
    scored = min(args.scored or default, args.tokens - 1)
    for b in args.batch:
        rows = [
            Row(tuple(rng.integers(100, 20000, args.tokens).tolist()), scored) for _ in range(b)
        ]
        if args.choices > 1:  # the same context, different last `scored` tokens each
            rows = [
                Row(r.tokens[:-scored] + tuple(rng.integers(100, 20000, scored).tolist()), scored)
                for r in rows
                for _ in range(args.choices)
            ]

        def step(rows=rows, b=b) -> float:
            t = time.perf_counter()
            score_rows(m, rows, batch=b)
            return time.perf_counter() - t

        first = step()
        times = [step() for _ in range(args.repetitions)]
        med = statistics.median(times)
        print(
            json.dumps(
                {
                    "bench": "score",
                    "model": args.model,
                    "numerics": args.numerics,
                    "mesh": args.mesh,
                    "backend": jax.default_backend(),
                    "devices": jax.device_count(),
                    "batch": b,
                    "tokens_per_row": args.tokens,
                    "scored_per_row": scored,
                    "choices": args.choices,
                    "step_s": med,
                    "tokens_per_s": b * (args.tokens - 1) / med,
                    "rows_per_s": len(rows) / med,
                    "compile_s": max(0.0, first - med),
                    "load_s": load_s,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
