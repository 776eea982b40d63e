"""The native llama.cpp-numerics attention alone (`ggml_attention_native`, the kernel
numerics="llamacpp" runs over an f16 page pool, or with `--flash` its flash-attention
form `ggml_flash_attention_native`, llama.cpp's 2 threads): one layer's call, prefill chunks and
decode steps of the reference models' attention shapes after a depth, ms per call (a
median of `--reps`, each the mean of 10 calls in one `fori_loop` program, so that Python
dispatch stays out).

    .venv/bin/python bench/ggml_attention_cpu.py [--depth 4096] [--tokens 512] [--rows 1,4]
        [--reps 5] [--flash]

Numbers only; note `uptime` beside them. A/B two builds by running this from each tree.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from llamay.kernels_cpu.ggml_attention import ggml_attention_native, ggml_flash_attention_native

PAGE = 16
CALLS = 10
SHAPES = {"smollm2": (9, 3, 64), "gemma3": (4, 1, 256)}  # q heads, kv heads, head dim


def call_ms(rows: int, tokens: int, heads: int, kv: int, dim: int, depth: int, reps: int,
            flash: bool = False) -> float:  # fmt: skip
    """Median ms of one call: `tokens` query tokens a row ending at depth + tokens."""
    n = depth + tokens
    m = -(-n // PAGE)
    rng = np.random.default_rng(0)
    k, v = (
        jnp.asarray(rng.standard_normal((rows * m + 1, PAGE, kv, dim)), jnp.float16) for _ in "kv"
    )
    q = jnp.asarray(rng.standard_normal((rows, tokens, heads, dim)) * 2, jnp.float32)
    table = jnp.asarray(1 + np.arange(rows * m).reshape(rows, m), jnp.int32)
    pos = jnp.asarray(np.tile(np.arange(n - tokens, n), (rows, 1)), jnp.int32)

    def attend(q):
        if flash:
            return ggml_flash_attention_native(q, k, v, pos, table, scale=dim**-0.5, threads=2)
        return ggml_attention_native(q, k, v, pos, table, scale=dim**-0.5)

    def body(_, acc):  # the carry feeds q, so that no call is hoisted or merged
        return acc + attend(q + acc[:1, :1, :1, :1] * 0)

    run = jax.jit(lambda: jax.lax.fori_loop(0, CALLS, body, jnp.zeros(q.shape, jnp.float32)))
    run().block_until_ready()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        run().block_until_ready()
        times.append((time.perf_counter() - t0) / CALLS)
    return float(np.median(times)) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depth", type=int, default=4096)
    ap.add_argument("--tokens", type=int, default=512, help="a prefill chunk's tokens")
    ap.add_argument("--rows", default="1,4", help="decoding rows, comma-separated")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--flash", action="store_true", help="the flash-attention kernel")
    args = ap.parse_args()
    for name, (h, kv, d) in SHAPES.items():
        ms = call_ms(1, args.tokens, h, kv, d, args.depth, max(2, args.reps // 2), args.flash)
        print(f"{name:8s} pp{args.tokens} @ d{args.depth}: {ms:8.2f} ms a layer", flush=True)
        for rows in (int(r) for r in args.rows.split(",")):
            ms = call_ms(rows, 1, h, kv, d, args.depth, args.reps, args.flash)
            print(f"{name:8s} tg, {rows} row(s) @ d{args.depth}: {ms:8.3f} ms a layer", flush=True)


if __name__ == "__main__":
    main()
