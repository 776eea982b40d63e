"""Load-test `llamay serve`: C concurrent streaming chat clients; prints one JSON line per
concurrency with requests/s, generated tokens/s and time-to-first-token percentiles.

    .venv/bin/python -m bench.serve [-m PATH_OR_NAME] [-c 8 32] [-r 2] [-n 32] [-p 32]
                                    [--url URL]

Without `--url` it starts a server on 127.0.0.1 (a free port) in this process over the
model (`-p` engine slots; default: the largest concurrency); with it, it drives that
server (model name `-m`). The same workload runs once untimed first (compilation).
No assertions: numbers for notes and comparisons.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from bench.tiny_models import tiny_model


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


async def _one(client, model: str, n: int, i: int) -> tuple[float, int]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"Tell story {i}."}],
        "max_tokens": n,
        "temperature": 0.7,
        "seed": i,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    ttft = None
    tokens = 0
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for c in chunk.get("choices", []):
                if ttft is None and c.get("delta", {}).get("content"):
                    ttft = time.perf_counter() - t0
    return (ttft if ttft is not None else time.perf_counter() - t0), tokens


async def _run(url: str, model: str, concurrency: int, per_client: int, n: int) -> dict:
    import httpx

    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=url, timeout=3600, limits=limits) as client:

        async def worker(w: int, base: int = 0):
            return [await _one(client, model, n, base + w * 1000 + k) for k in range(per_client)]

        # warm-up: the same workload once, so the step shapes the run uses (row counts,
        # prefill chunks, attention views as sequences grow) are compiled before timing
        await asyncio.gather(*(worker(w, 1 << 20) for w in range(concurrency)))
        t0 = time.perf_counter()

        results = [
            x for xs in await asyncio.gather(*(worker(w) for w in range(concurrency))) for x in xs
        ]
        wall = time.perf_counter() - t0
    ttfts = [t for t, _ in results]
    tokens = sum(k for _, k in results)
    return {
        "bench": "serve",
        "model": model,
        "concurrency": concurrency,
        "requests": len(results),
        "max_tokens": n,
        "wall_s": round(wall, 3),
        "requests_per_s": round(len(results) / wall, 3),
        "tokens_per_s": round(tokens / wall, 2),
        "completion_tokens": tokens,
        "ttft_p50_s": round(_pct(ttfts, 0.5), 3),
        "ttft_p99_s": round(_pct(ttfts, 0.99), 3),
        "ttft_mean_s": round(statistics.fmean(ttfts), 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default=None, help="default: the tests' tiny llama")
    ap.add_argument("-c", "--concurrency", type=int, nargs="+", default=[8, 32])
    ap.add_argument("-r", "--requests-per-client", type=int, default=2)
    ap.add_argument("-n", "--max-tokens", type=int, default=32)
    ap.add_argument("-p", "--parallel", type=int, default=None, help="engine slots")
    ap.add_argument("--url", default=None)
    args = ap.parse_args()
    args.model = args.model or str(tiny_model("llama"))

    if args.url:
        for c in args.concurrency:
            print(
                json.dumps(
                    asyncio.run(
                        _run(args.url, args.model, c, args.requests_per_client, args.max_tokens)
                    )
                )
            )
        return

    from llamay.serve import create_app
    from llamay.serve.app import serve_in_thread
    from llamay.serve.models import Models
    from llamay.store import resolve

    parallel = args.parallel or max(args.concurrency)
    models = Models(
        {"bench": resolve(args.model)},
        use_store=False,
        default_keep_alive=-1,
        parallel=parallel,
    )
    with serve_in_thread(create_app(models)) as url:
        for c in args.concurrency:
            out = asyncio.run(_run(url, "bench", c, args.requests_per_client, args.max_tokens))
            print(json.dumps({**out, "parallel": parallel}), flush=True)


if __name__ == "__main__":
    main()
