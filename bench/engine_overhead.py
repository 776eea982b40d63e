"""What multi-step decode could save: a decode token through `BatchEngine` (planning,
the forward and sampling programs, reading the token back, committing it) against the
bare forward program (`paged_step`) looped at the same rows and context.

    .venv/bin/python bench/engine_overhead.py [--model smollm2:135m] [--rows 1] [--tokens 64]
        [--context 256] [--reps 3] [--decode-steps 4]

Prints per-token CPU seconds of this process (user + system, every thread: on a shared
CPU, wall time measures the neighbours) and wall milliseconds, for both, and the share of
the engine's time that is not the forward pass: the most that several tokens per
dispatch (multi-step decode) could take off. With `--decode-steps K` the engine runs a
third time with K decode steps per dispatch (`BatchEngine(decode_steps=K)`), taking turns
with the other two: what multi-step decode does take off. Note `uptime` beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode_profile import paged_steps  # noqa: E402

import llamay  # noqa: E402
from llamay.engine.api import Request  # noqa: E402
from llamay.engine.scheduler import BatchEngine  # noqa: E402
from llamay.sample import GREEDY  # noqa: E402


def cpu() -> float:
    t = os.times()
    return t.user + t.system


def engine_tokens(
    m, rows: int, context: int, tokens: int, decode_steps: int = 1
) -> tuple[float, float]:
    """(CPU s, wall s) per decode token of `rows` streams decoding from `context` on."""
    n_pages = rows * ((context + tokens) // 16 + 2) + 1
    e = BatchEngine(m, slots=rows, page_size=16, n_pages=n_pages, decode_steps=decode_steps)
    try:

        def run(offset: int, n: int):
            prompts = [
                [(offset + 7 * r + i) % 4000 + 100 for i in range(context)] for r in range(rows)
            ]
            hs = [e.submit(Request(p, n, GREEDY, stop_ids=frozenset())) for p in prompts]
            its = [iter(h) for h in hs]
            for it in its:  # prefilled: time the decode only
                next(it)
            c0, t0 = cpu(), time.perf_counter()
            for it in its:
                for _ in it:
                    pass
            return (cpu() - c0) / (rows * (n - 1)), (time.perf_counter() - t0) / (n - 1)

        run(0, 8)  # compiles
        return run(1000, tokens)
    finally:
        e.close()


def bare_tokens(m, rows: int, context: int, tokens: int) -> tuple[float, float]:
    _, steps = paged_steps(m, rows, context, tokens, positions=context + tokens + 3)
    steps(3)
    c0, t0 = cpu(), time.perf_counter()
    steps(tokens)
    return (cpu() - c0) / (rows * tokens), (time.perf_counter() - t0) / tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2:135m")
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--decode-steps", type=int, default=1, help="also K steps per dispatch")
    args = ap.parse_args()
    m = llamay.load(args.model, progress=False)
    k = args.decode_steps
    runs = {"engine": [], "bare": []} | ({f"engine_k{k}": []} if k > 1 else {})
    for _ in range(args.reps):  # alternated: all see the same neighbours
        runs["engine"].append(engine_tokens(m, args.rows, args.context, args.tokens))
        runs["bare"].append(bare_tokens(m, args.rows, args.context, args.tokens))
        if k > 1:
            got = engine_tokens(m, args.rows, args.context, args.tokens, k)
            runs[f"engine_k{k}"].append(got)
    med = {k: sorted(v)[len(v) // 2] for k, v in runs.items()}
    out = {
        "model": args.model,
        "rows": args.rows,
        "context": args.context,
        "cpu_ms_per_token": {k: round(v[0] * 1e3, 2) for k, v in med.items()},
        "wall_ms_per_step": {k: round(v[1] * 1e3, 2) for k, v in med.items()},
        "not_forward_share_cpu": round(1 - med["bare"][0] / med["engine"][0], 3),
        "runs": {
            k: [[round(c * 1e3, 2), round(w * 1e3, 2)] for c, w in v] for k, v in runs.items()
        },
        "load": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
