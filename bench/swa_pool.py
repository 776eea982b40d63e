"""Sliding-window layers with their own page pool vs one pool for every layer.

    .venv/bin/python bench/swa_pool.py [--model gemma3:270m] [--tokens 3500] [--new 24]
        [--reps 3] [--chunk 512]

One stream at `tokens` positions (the prompt cached after the first run, so each run
times mostly decode). Two engines in one process, run alternately: "split" (the local
layers' pool, released behind the window: `llamay.kv.pages`) and "single" (every layer
in one pool, as before). Prints one JSON line per engine: pool bytes, decode ms/token
per run, the load average. Numbers only; the CPU is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from unittest import mock

import numpy as np

import llamay
from llamay.engine import scheduler
from llamay.engine.api import Request
from llamay.engine.scheduler import BatchEngine
from llamay.sample import GREEDY
from llamay.store import resolve


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gemma3:270m")
    ap.add_argument("--tokens", type=int, default=3500)
    ap.add_argument("--new", type=int, default=24)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--chunk", type=int, default=512)
    args = ap.parse_args()
    ps = 16
    m = llamay.load(str(resolve(args.model)), n_ctx=args.tokens + args.new + 64)
    text = "The river ran past the old mill, and the miller counted the sacks. " * 400
    toks = m.tokenize(text, add_special=True, parse_special=True)[: args.tokens]
    n_pages = -(-(args.tokens + args.new + 8) // ps) + 8
    kw = dict(slots=1, page_size=ps, chunk=args.chunk, n_pages=n_pages)
    engines = {"split": BatchEngine(m, **kw)}
    with mock.patch.object(scheduler, "local_layers", lambda cfg: np.zeros(cfg.n_layers, bool)):
        engines["single"] = BatchEngine(m, **kw)
    runs: dict[str, list[float]] = {k: [] for k in engines}
    for rep in range(args.reps + 1):  # the first run prefills and compiles: not timed
        for name, e in engines.items():
            it = iter(e.submit(Request(toks + [rep], args.new, GREEDY)))
            next(it)
            start = time.perf_counter()
            n = len(list(it))
            if rep:
                runs[name].append(1000 * (time.perf_counter() - start) / n)
    for name, e in engines.items():
        kv = e.kv
        pool = kv.k.nbytes + kv.v.nbytes
        pool += 0 if kv.local_k is None else kv.local_k.nbytes + kv.local_v.nbytes
        row = {
            "engine": name,
            "model": args.model,
            "tokens": args.tokens,
            "pool_bytes": pool,
            "pages": kv.n_pages,
            "local_pages": kv.n_local_pages,
            "decode_ms_per_token": [round(x, 1) for x in runs[name]],
            "loadavg": os.getloadavg()[0],
        }
        print(json.dumps(row))
        e.close()


if __name__ == "__main__":
    main()
