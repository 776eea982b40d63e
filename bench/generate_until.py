"""lm-eval's `generate_until` through llamay's adapter: requests/s and generated tokens/s.

    .venv/bin/python -m bench.generate_until [-m smollm2:135m] [-b 8] [-n 32] [--max-gen-toks 48]

`-n` requests (one-sentence prompts, `until` ["Write one"], up to `--max-gen-toks` tokens,
greedy) through `LlamayLM(batch_size=B).generate_until`, after one untimed call of B
requests (programs compiled); the median of `-r` timed calls. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default="smollm2:135m")
    ap.add_argument("-b", "--batch-size", type=int, default=8)
    ap.add_argument("-n", "--requests", type=int, default=32)
    ap.add_argument("--max-gen-toks", type=int, default=48)
    ap.add_argument("-r", "--repetitions", type=int, default=2)
    args = ap.parse_args()

    from lm_eval.api.instance import Instance

    import llamay
    from llamay.eval.lm_eval_adapter import LlamayLM

    m = llamay.load(args.model, progress=False)
    lm = LlamayLM(llamay_model=m, batch_size=args.batch_size)
    topics = ["the sea", "a cat", "the moon", "bread", "trains", "winter", "music", "a garden"]
    kw = {"until": ["Write one"], "max_gen_toks": args.max_gen_toks}
    reqs = [
        Instance("generate_until", {}, (f"Write one long sentence about {topics[i % 8]}:", kw), i)
        for i in range(args.requests)
    ]
    lm.generate_until(reqs[: args.batch_size])
    times, out = [], []
    for _ in range(args.repetitions):
        t = time.perf_counter()
        out = lm.generate_until(reqs)
        times.append(time.perf_counter() - t)
    med = statistics.median(times)
    tokens = sum(len(m.tokenize(o, add_special=False)) for o in out)
    print(json.dumps({
        "bench": "generate_until", "model": args.model, "batch_size": args.batch_size,
        "requests": args.requests, "seconds": round(med, 3),
        "requests_per_s": round(args.requests / med, 2), "generated_tokens": tokens,
        "tokens_per_s": round(tokens / med, 1), "loadavg": os.getloadavg()[0],
    }))  # fmt: skip


if __name__ == "__main__":
    main()
