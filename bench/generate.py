"""Measure load, prefill and decode speed of `llamay` on one model; prints one JSON line.

    .venv/bin/python -m bench.generate [-m smollm2:135m] [-p 128] [-n 128] [-r 3]

Prefill (pp) and decode (tg) tokens/s exclude compilation (one warm-up run first);
`compile_s` is the warm-up's extra time. No assertions: numbers for notes and comparisons.
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
    ap.add_argument("-p", "--prompt-tokens", type=int, default=128)
    ap.add_argument("-n", "--gen-tokens", type=int, default=128)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    args = ap.parse_args()

    import llamay
    from llamay.sample import GREEDY

    t0 = time.perf_counter()
    m = llamay.load(args.model)
    load_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    prompt = rng.integers(100, 20000, args.prompt_tokens).tolist()

    def prefill_once() -> float:
        t = time.perf_counter()
        jax.block_until_ready(m.logits(prompt)[-1])
        return time.perf_counter() - t

    def decode_once() -> tuple[float, float]:
        gen = m.generation(prompt[:8], max_tokens=args.gen_tokens, sampler=GREEDY)
        t = time.perf_counter()
        first = None
        n = 0
        for _ in gen:
            n += 1
            if first is None:
                first = time.perf_counter()
        end = time.perf_counter()
        return first - t, (n - 1) / (end - first)

    warm_pp = prefill_once()
    t = time.perf_counter()
    decode_once()
    warm_tg = time.perf_counter() - t
    pp = [args.prompt_tokens / prefill_once() for _ in range(args.repetitions)]
    tg = [decode_once()[1] for _ in range(args.repetitions)]
    out = {
        "model": args.model,
        "backend": jax.default_backend(),
        "load_s": round(load_s, 3),
        "warmup_prefill_s": round(warm_pp, 3),
        "warmup_decode_s": round(warm_tg, 3),
        f"pp{args.prompt_tokens}_tokens_per_s": round(statistics.mean(pp), 2),
        "pp_stdev": round(statistics.pstdev(pp), 2),
        f"tg{args.gen_tokens}_tokens_per_s": round(statistics.mean(tg), 2),
        "tg_stdev": round(statistics.pstdev(tg), 2),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
