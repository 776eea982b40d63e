"""A burst of N requests on the continuous-batching engine, as a server sees it; prints
one JSON line.

    .venv/bin/python -m bench.burst [-m smollm2:135m] [--streams 16] [--tokens 64]
        [--gap-ms 2] [--prompt 8] [--chunk 128] [--trace]

N requests (distinct `--prompt`-token prompts, greedy, `--tokens` new tokens each) are
submitted `--gap-ms` apart (requests reach the engine one by one through an HTTP
server), once untimed on other prompts (compiles), then timed. Reports TTFT p50/max from
each request's submission, aggregate decode tok/s (as `bench.llamaserver_compare`), the
engine's steps and the tokens they fed, programs compiled during the timed burst, and
with `--trace` every step of it: kind, rows (real / bucketed), tokens per row, page-table
width, wall ms. No assertions: numbers for notes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default="smollm2:135m")
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=8)
    ap.add_argument("--gap-ms", type=float, default=2.0)
    ap.add_argument("--ctx", type=int, default=2128)
    ap.add_argument("--trace", action="store_true")
    args = ap.parse_args()

    import jax

    import llamay
    from llamay.engine.api import Request
    from llamay.engine.scheduler import BatchEngine
    from llamay.sample import GREEDY
    from llamay.serve.models import make_engine

    m = llamay.load(args.model, n_ctx=args.ctx)
    e: BatchEngine = make_engine(m, parallel=args.streams)
    rng = np.random.default_rng(0)
    trace: list[dict] = []
    compiles = [0]

    def on_event(name: str, **_) -> None:
        if name == "/jax/compilation_cache/compile_requests_use_cache":
            compiles[0] += 1

    jax.monitoring.register_event_listener(on_event)
    dispatch = e._dispatch

    def traced(plan, tokens=None):
        t = time.perf_counter()
        out = dispatch(plan, tokens)
        if args.trace:  # wall per step; costs the overlap of dispatch and readback
            out.block_until_ready()
        trace.append(
            {
                "t": round(t - t0[0], 3),
                "kind": "decode" if plan.tokens.shape[1] == 1 else "prefill",
                "rows": len(plan.idx),
                "R": plan.tokens.shape[0],
                "T": plan.tokens.shape[1],
                "M": plan.table.shape[1],
                "fed": int(sum(plan.feed)),
                "ms": round(1e3 * (time.perf_counter() - t), 1),
            }
        )
        return out

    e._dispatch = traced
    t0 = [time.perf_counter()]

    def burst(prompts) -> dict:
        first: list[float] = [0.0] * len(prompts)
        last: list[float] = [0.0] * len(prompts)
        counts: list[int] = [0] * len(prompts)

        def drain(i, h, t_sub) -> None:
            for _ in h:
                now = time.perf_counter()
                if counts[i] == 0:
                    first[i] = now - t_sub
                    first_abs[i] = now
                counts[i] += 1
                last[i] = now

        first_abs = [0.0] * len(prompts)
        threads = []
        t0[0] = time.perf_counter()
        for i, p in enumerate(prompts):
            t_sub = time.perf_counter()
            h = e.submit(Request(p, args.tokens, GREEDY, stop_ids=()))
            th = threading.Thread(target=drain, args=(i, h, t_sub))
            th.start()
            threads.append(th)
            time.sleep(args.gap_ms / 1e3)
        for th in threads:
            th.join()
        span = max(last) - min(first_abs)
        return {
            "ttft_p50_s": round(statistics.median(first), 3),
            "ttft_max_s": round(max(first), 3),
            "decode_tok_s": round(sum(c - 1 for c in counts) / span, 2),
            "tokens": sum(counts),
        }

    def prompts(n):
        return [rng.integers(100, 20000, args.prompt).tolist() for _ in range(n)]

    out: dict = {"model": args.model, "streams": args.streams, "gap_ms": args.gap_ms}
    out["loadavg_start"] = [round(x, 2) for x in os.getloadavg()]
    burst(prompts(args.streams))  # compiles what this arrival pattern needs
    trace.clear()
    compiles[0] = 0
    steps = e.counters["steps"]
    out.update(burst(prompts(args.streams)))
    out["steps"] = e.counters["steps"] - steps
    out["prefill_steps"] = sum(s["kind"] == "prefill" for s in trace)
    out["prefill_ms"] = round(sum(s["ms"] for s in trace if s["kind"] == "prefill"))
    out["compiles"] = compiles[0]
    out["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    if args.trace:
        out["trace"] = trace[:40]
    e.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
