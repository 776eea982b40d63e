"""`llamay bench`: llama-bench-like prefill (ppN) and decode (tgN) throughput.

Each test runs once to compile (reported as `compile_s`, the warm-up's extra time),
then `repetitions` timed runs; results are tokens/s mean ± stdev. Batch 1 decode goes
through `Model.generation` (what users get); batch B > 1 decodes B rows in lockstep
through the same jitted steps. `depth` D (llama-bench's `-d`): each test runs after D
tokens already in the cache (untimed), as "pp128 @ d4096": what a long chat or document
costs. Numbers only: nothing here asserts a speed.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import jax
import jax.numpy as jnp
import numpy as np

from llamay.engine.steps import decode_logits, prefill_logits
from llamay.kv import bucket, new_dense_kv
from llamay.sample import GREEDY
from llamay.sample.chain import argmax

# the sampler's greedy pick (two plain reductions): jnp.argmax's paired reduce runs
# unvectorised on XLA CPU, milliseconds per step over Gemma 3's 262k x 8 logits
_greedy = jax.jit(argmax)


@dataclass
class BenchResult:
    model: str
    size_mb: float
    params_m: float
    backend: str
    numerics: str
    test: str
    batch: int
    tokens_per_s: float
    stdev: float
    compile_s: float

    def as_dict(self) -> dict:
        return asdict(self)


def _prompt(n: int, batch: int, vocab: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(100, min(vocab, 30000), (batch, n)).astype(np.int32)


def _prefill(m, ids: np.ndarray, slots: int, kv=None, start: int = 0):
    """ids [b, t] at positions start.. into kv (None: a new cache of `slots`)."""
    cfg = m.config
    b, t = ids.shape
    if kv is None:
        kv = new_dense_kv(cfg.n_layers, b, slots, cfg.n_kv_heads, cfg.head_dim, m.runtime.kv_dtype)
    tb = bucket(t)
    tokens = np.zeros((b, tb), np.int32)
    tokens[:, :t] = ids
    positions = np.full((b, tb), slots, np.int32)
    positions[:, :t] = start + np.arange(t)
    last = jnp.full((b,), t - 1, jnp.int32)
    logits, kv = prefill_logits(
        cfg, m.weights, kv, jnp.asarray(tokens), jnp.asarray(positions), last
    )
    return logits, kv


def _time_pp(m, ids: np.ndarray, depth: int = 0) -> float:
    """Seconds to prefill ids [b, t] after `depth` tokens of each row in the cache."""
    b, t = ids.shape
    kv, slots = None, bucket(depth + t)
    if depth:
        _, kv = _prefill(m, _prompt(depth, b, m.tokenizer.vocab_size, seed=1), slots)
        jax.block_until_ready(kv)
    start = time.perf_counter()
    logits, _ = _prefill(m, ids, slots, kv, depth)
    jax.block_until_ready(logits)
    return time.perf_counter() - start


def _time_tg(m, n: int, batch: int, vocab: int, depth: int = 0) -> float:
    """Seconds for n decode steps (after the first token) of `batch` rows, each after a
    prompt of depth + 8 tokens."""
    ids = _prompt(depth + 8, batch, vocab)
    if batch == 1:
        gen = m.generation(ids[0].tolist(), max_tokens=n + 1, sampler=GREEDY)
        it = iter(gen)
        next(it)
        t = time.perf_counter()
        made = sum(1 for _ in it)
        # a generation that stops early (an end-of-generation token) made fewer than n: the
        # seconds n tokens take at its rate, not the shorter run's
        return (time.perf_counter() - t) * n / max(made, 1)
    slots = bucket(depth + 8 + n + 1, 256)
    logits, kv = _prefill(m, ids, slots)
    tok = _greedy(logits)
    jax.block_until_ready(tok)
    t = time.perf_counter()
    for i in range(n):
        pos = jnp.full((batch,), depth + 8 + i, jnp.int32)
        logits, kv = decode_logits(m.config, m.weights, kv, tok, pos)
        tok = _greedy(logits)
    jax.block_until_ready(tok)
    return time.perf_counter() - t


def run_bench(
    m,
    name: str,
    prompt_tokens: int = 128,
    gen_tokens: int = 128,
    batches: tuple[int, ...] = (1,),
    repetitions: int = 3,
    depth: int = 0,
) -> list[BenchResult]:
    from llamay.errors import RequestError
    from llamay.gguf.inspect import summary

    longest = depth + max(prompt_tokens, 8 + gen_tokens + 1 if gen_tokens else 0)
    if depth < 0 or longest > m.n_ctx:
        raise RequestError(
            f"depth {depth} + the longest test ({longest - depth} tokens) must fit the "
            f"model's context of {m.n_ctx} (load it with a larger n_ctx)"
        )
    info = summary(m.gguf)
    vocab = m.tokenizer.vocab_size
    base = dict(
        model=name,
        size_mb=round(info["file_size"] / 1e6, 1),
        params_m=round(info["parameter_count"] / 1e6, 1),
        backend=jax.default_backend(),
        numerics=m.numerics,
    )
    at = f" @ d{depth}" if depth else ""  # llama-bench's name for a test at a depth
    out = []
    for b in batches:
        tests = []
        if prompt_tokens:
            ids = _prompt(prompt_tokens, b, vocab)
            run_pp = lambda ids=ids: _time_pp(m, ids, depth)  # noqa: E731
            tests.append((f"pp{prompt_tokens}{at}", prompt_tokens * b, run_pp))
        if gen_tokens:
            tests.append(
                (f"tg{gen_tokens}{at}", gen_tokens * b,
                 lambda b=b: _time_tg(m, gen_tokens, b, vocab, depth))
            )  # fmt: skip
        for test, n_tokens, run in tests:
            first = run()
            times = [run() for _ in range(repetitions)]
            rates = [n_tokens / t for t in times]
            out.append(
                BenchResult(
                    **base,
                    test=test,
                    batch=b,
                    tokens_per_s=round(statistics.mean(rates), 2),
                    stdev=round(statistics.pstdev(rates), 2),
                    compile_s=round(max(0.0, first - statistics.mean(times)), 2),
                )
            )
    return out
