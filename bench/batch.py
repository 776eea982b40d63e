"""The continuous-batching engine on one model; prints one JSON line.

    .venv/bin/python -m bench.batch [-m smollm2:135m] [--prefix 2000] [--streams 1,4,8,16]

- `ttft_cached_s` / `ttft_uncached_s`: time to the first token of a request whose
  `--prefix`-token prefix is (is not) in the prefix cache (+ 8 new tokens each);
- `decode_tok_s[N]`: aggregate decode tokens/s with N concurrent greedy streams
  (`--gen` tokens each, short distinct prompts), after a warm-up that compiles;
- `serial_tok_s` / `engine_1_stream_tok_s`: the dense single-sequence path
  (`Model.generation`) and one engine stream, three runs each, interleaved.
Compilation is excluded (each shape runs once first). No assertions: numbers for notes.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default="smollm2:135m")
    ap.add_argument("--prefix", type=int, default=2000)
    ap.add_argument("--streams", default="1,4,8,16")
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=256)
    args = ap.parse_args()

    import llamay
    from llamay.engine.api import Request
    from llamay.engine.scheduler import BatchEngine
    from llamay.sample import GREEDY

    m = llamay.load(args.model, n_ctx=max(4096, args.prefix + 256))
    rng = np.random.default_rng(0)
    streams = [int(s) for s in args.streams.split(",")]
    out: dict = {"model": args.model, "page_size": args.page_size, "chunk": args.chunk}
    out["cpu_count"] = os.cpu_count()
    out["loadavg_start"] = os.getloadavg()

    def first_token(e, prompt) -> float:
        t = time.perf_counter()
        h = e.submit(Request(prompt, 1, GREEDY))
        for _ in h:
            break
        dt = time.perf_counter() - t
        list(h)
        return dt

    # TTFT: a long shared prefix, cached vs not (prefix cache off for the uncached run).
    prefix = rng.integers(100, 20000, args.prefix).tolist()
    tails = [rng.integers(100, 20000, 8).tolist() for _ in range(4)]
    slots = max(streams)
    n_pages = slots * -(-(args.prefix + 2 * args.gen + 64) // args.page_size) + 1
    for cache in (False, True):
        e = BatchEngine(
            m,
            slots=slots,
            page_size=args.page_size,
            chunk=args.chunk,
            n_pages=n_pages,
            prefix_cache=cache,
        )
        first_token(e, prefix + tails[0])  # compile (and, with the cache, fill it)
        first_token(e, prefix + tails[1])
        t = first_token(e, prefix + tails[2 + cache])
        out["ttft_cached_s" if cache else "ttft_uncached_s"] = round(t, 4)
        if cache:
            out["ttft_cached_hit_tokens"] = e.stats()["cache_hit_tokens"]
            engine = e
        else:
            e.close()

    # Aggregate decode throughput at N concurrent streams.
    e = engine
    rates = {}
    for n in streams:
        prompts = [rng.integers(100, 20000, 8).tolist() for _ in range(n)]
        for h in [e.submit(Request(p, 4, GREEDY)) for p in prompts]:  # compile this shape
            list(h)
        t = time.perf_counter()
        hs = [e.submit(Request(p, args.gen, GREEDY)) for p in prompts]
        total = sum(len(list(h)) for h in hs)
        rates[n] = round(total / (time.perf_counter() - t), 2)
    out["decode_tok_s"] = rates

    # One stream on the engine vs the dense path, interleaved (the load drifts).
    p = rng.integers(100, 20000, 8).tolist()
    list(m.generation(p, 4, GREEDY))
    serial, single = [], []
    for _ in range(3):
        for rates_, run in (
            (serial, lambda: m.generation(p, args.gen, GREEDY)),
            (single, lambda: e.submit(Request(p, args.gen, GREEDY))),
        ):
            t = time.perf_counter()
            k = len(list(run()))
            rates_.append(round(k / (time.perf_counter() - t), 2))
    out["serial_tok_s"], out["engine_1_stream_tok_s"] = serial, single
    e.close()
    out["loadavg_end"] = os.getloadavg()
    out["note"] = "shared, noisy CPU machine: compare within one run only"
    print(json.dumps(out))


if __name__ == "__main__":
    main()
