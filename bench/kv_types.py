"""KV cache bytes per token for each KV cache type (`llamay.kv.types`), measured on the
arrays of a real paged pool (`llamay.engine.BatchEngine`'s), and decode speed per type.

    .venv/bin/python bench/kv_types.py [MODEL] [--decode N] [--repeat R] [--context C]

Prints one JSON object: per type the pool's bytes per token (K + V of every layer, from
the device arrays' nbytes / pool positions), its ratio to f16, and with --decode the
greedy decode rate of a generation through the paged engine (tok/s, CPU): the best of
R timed runs (`decode_tok_s`; all runs in `decode_runs`; the best is the least disturbed
on a shared machine) after a prompt of about C tokens (default: a short one).
"""

from __future__ import annotations

import argparse
import json
import os
import time

TYPES = ["f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0"]


def main() -> None:
    import llamay
    from llamay.engine.api import Request
    from llamay.engine.scheduler import BatchEngine
    from llamay.kv.types import kv_bytes_per_token
    from llamay.sample import GREEDY

    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="smollm2:135m")
    ap.add_argument("--decode", type=int, default=0, help="tokens to decode per type (0: none)")
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--repeat", type=int, default=1, help="timed decode runs per type (best)")
    ap.add_argument("--context", type=int, default=0, help="prompt tokens (0: a short one)")
    a = ap.parse_args()
    out = {"model": a.model, "load_average": os.getloadavg(), "types": {}}
    for t in a.types.split(","):
        n_ctx = max(1024, a.context + a.decode + 64)
        m = llamay.load(a.model, kv_dtype=t, n_ctx=n_ctx, progress=False)
        cfg = m.config
        e = BatchEngine(m, slots=1, page_size=16, n_pages=max(64, n_ctx // 16 + 2))
        try:
            kv = e.kv
            positions = kv.k.shape[1] * kv.k.shape[2]
            measured = (kv.k.nbytes + kv.v.nbytes) / positions
            row = {
                "bytes_per_token": measured,
                "expected": kv_bytes_per_token(t, cfg.n_layers, cfg.n_kv_heads, cfg.head_dim),
                "pool_k": [list(kv.k.shape), str(kv.k.dtype)],
            }
            if a.decode:
                prompt = m.tokenize("Once upon a time")
                while len(prompt) < a.context:
                    prompt = prompt + m.tokenize(" there was a story about a time, once.")
                if a.context:
                    prompt = prompt[: a.context]
                list(e.submit(Request(prompt, 4, GREEDY)))  # compile
                runs = []
                for _ in range(a.repeat):
                    t0 = time.perf_counter()
                    n = len(list(e.submit(Request(prompt, a.decode, GREEDY))))
                    runs.append(n / (time.perf_counter() - t0))
                row["decode_tok_s"] = max(runs)
                row["decode_runs"] = runs
                row["prompt_tokens"] = len(prompt)
        finally:
            e.close()
        out["types"][t] = row
    f16 = out["types"].get("f16", {}).get("bytes_per_token")
    for row in out["types"].values():
        if f16:
            row["vs_f16"] = row["bytes_per_token"] / f16
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
