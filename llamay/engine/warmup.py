"""Ahead-of-time compilation of an engine's step programs, for the persistent cache.

    from llamay.engine.warmup import warmup
    warmup(model.engine)                             # what `llamay generate` compiles
    warmup(engine, rows=(1, 2, 4, 8), length=2048)   # a server's engine, more buckets

A `BatchEngine` compiles one `paged_step` per (rows R, tokens T, page-table width M):
R is the number of slots stepped together, bucketed to a power of two; T is 1 for a
decode step, else the prefill chunk bucketed (16 ... the engine's chunk); M is the
longest row's pages, bucketed (`planning.table_widths`: at least 256 positions' worth,
then two widths per doubling). `warmup` lowers each of them from the engine's own
inputs (`BatchEngine._blank_plan` / `_step_inputs`: only shapes matter, no forward runs)
and compiles it, so the executables land in the
persistent compilation cache (`llamay.runtime`) and a later process reads them back
instead of compiling (5-7 s each for SmolLM2 on a 2-core CPU). It also runs the small
per-request program (`set_rows`, seeding the starting requests' sampler state) at each
row bucket.

Programs depend on the engine's shapes: `Model.engine` (`llamay generate`: 4 slots,
prefill chunk 256) and a server's engine (`llamay serve --parallel 8`: 8 slots, chunk
128) share none, so each is warmed up with its own engine, on the same context size
(`n_ctx`) and numerics. The engine must be idle (warm it up before submitting work).
Sequences longer than the engine's starting pool grow the pool, a new shape: `length`
is capped there. `warmup` compiles the default sampler's program; constrained
generation (token masks) and top-N log-probabilities vary only the sampling program.

`prime` is a server's warm-up: it loads from disk, or builds and stores, every step
program (`llamay.engine.programs`: a second process reads them back without tracing,
lowering or compiling) from the inputs' shapes on a thread pool, without running them,
then runs on the engine's own worker the sampling program for each row count with and
without token masks and at each log-probability width, so a request's first step
neither compiles nor traces; an engine taking several decode steps per dispatch
(`BatchEngine.decode_steps`) gets its `paged_decode` program per decode shape too.
With the program cache off it runs every step program once
over padding rows (which write nothing) instead, for jit's in-memory caches.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass

import jax
import numpy as np

from llamay.engine.drafts import _greedy
from llamay.engine.paged_steps import (
    PAD_POSITION,
    paged_decode,
    paged_sample,
    paged_step,
    set_rows,
)
from llamay.engine.planning import table_widths
from llamay.engine.programs import Program, abstract
from llamay.engine.programs import enabled as programs_enabled
from llamay.engine.scheduler import LOGPROB_WIDTH, LOGPROB_WIDTH_MAX, MIN_VIEW, BatchEngine
from llamay.engine.speculative import VERIFY_MIN_T, fit_bucket, paged_verify, verify_sample
from llamay.errors import RequestError
from llamay.kv import bucket
from llamay.sample import Sampler, SamplerState, SamplingParams
from llamay.sample.constraint import mask_words

# Sequences (prompt + generated tokens) covered by default: `llamay generate`'s default
# 128 new tokens after a prompt of a few hundred.
DEFAULT_LENGTH = 512
PREFILL_MIN = 16  # the smallest prefill bucket (`BatchEngine._plan`)
_REQUESTS = "/jax/compilation_cache/compile_requests_use_cache"
_HITS = "/jax/compilation_cache/cache_hits"


@dataclass(frozen=True)
class StepShape:
    """One compiled step: R rows of T tokens each, page tables M pages wide."""

    rows: int
    tokens: int
    pages: int

    def __str__(self) -> str:
        kind = "decode" if self.tokens == 1 else f"prefill {self.tokens}"
        return f"{kind}, {self.rows} row(s), {self.pages} pages"


@dataclass
class WarmupReport:
    """What `warmup` did: each step shape with its seconds (lowering + compiling), the
    programs it asked the persistent cache for, how many of them the cache already held,
    and the wall time."""

    steps: list[tuple[StepShape, float]]
    cache_hits: int
    requests: int
    seconds: float


def step_shapes(
    engine: BatchEngine,
    rows: Iterable[int] = (1,),
    length: int = DEFAULT_LENGTH,
    prefill: Iterable[int] | None = None,
) -> list[StepShape]:
    """The step shapes `engine` compiles for `rows` concurrent sequences of up to
    `length` positions (capped at its context and starting pool), prefilled in the
    buckets `prefill` (default: every bucket up to the engine's chunk)."""
    top = bucket(engine.chunk, PREFILL_MIN)
    buckets = _powers(PREFILL_MIN, top)
    if prefill is not None:
        asked = sorted({bucket(int(t), PREFILL_MIN) for t in prefill})
        if not asked or asked[-1] > top:
            raise RequestError(
                f"prefill buckets must be within 1..{engine.chunk} (the engine's chunk), "
                f"not {sorted(prefill)}"
            )
        buckets = asked
    if length < 1:
        raise RequestError(f"length must be >= 1, not {length}")
    ladder = _ladder(engine, length)
    n_rows = sorted({bucket(min(max(1, int(r)), engine.n_slots), 1) for r in rows})
    return [
        StepShape(r, t, m)
        for r in n_rows
        for t in [1, *buckets]
        for m in sorted({engine._table_width(t, w) for w in ladder})
    ]


def _ladder(owner, length: int) -> list[int]:
    """The page-table widths (`planning.table_widths`) of sequences of up to `length`
    positions in `owner`'s pool (an engine's, or its draft model's)."""
    ps = owner.page_size
    pool = (owner.mgr.alloc.n_pages - 1) * ps  # page 0 is the null page
    pages = -(-min(length, owner.n_ctx, pool) // ps)
    return table_widths(max(1, MIN_VIEW // ps), pages)


def verify_shapes(
    engine: BatchEngine, rows: Iterable[int] = (1,), length: int = DEFAULT_LENGTH
) -> list[StepShape]:
    """The verify steps (`llamay.engine.speculative`: k+1 tokens per row) `engine`
    dispatches with its configured draft length for `rows` concurrent sequences of up
    to `length` positions: T from VERIFY_MIN_T (16 with sliding windows, whose plans keep
    the prefill's buckets) up to its longest draft's bucket. [] when it does not
    speculate. A request asking a longer draft (`draft_max`) compiles its T then."""
    spec = engine.spec
    if spec is None:
        return []
    k = max(0, min(spec.draft_max, engine.chunk - 1, engine.n_ctx - 2))
    if k and jax.default_backend() == "cpu" and fit_bucket(k) >= spec.draft_min:
        k = fit_bucket(k)  # as `Speculating._draft_len` cuts it
    if k <= 0:
        return []
    lo = PREFILL_MIN if engine.mgr.local is not None else VERIFY_MIN_T
    ladder = _ladder(engine, length)
    n_rows = sorted({bucket(min(max(1, int(r)), engine.n_slots), 1) for r in rows})
    return [
        StepShape(r, t, m)
        for r in n_rows
        for t in _powers(lo, bucket(k + 1, lo))
        # the plan's width is chosen at its prefill bucket (`Speculating._speculate`)
        for m in sorted({engine._table_width(max(t, PREFILL_MIN), w) for w in ladder})
    ]


def draft_shapes(
    engine: BatchEngine, rows: Iterable[int] = (1,), length: int = DEFAULT_LENGTH
) -> list[StepShape]:
    """The draft model's steps (`drafts.ModelDrafter`: catching up in chunks, then one
    token at a time) for `rows` concurrent sequences of up to `length` positions; []
    without a draft model."""
    d = engine._drafter
    if d is None:
        return []
    ladder = _ladder(d, length)
    n_rows = sorted({bucket(min(max(1, int(r)), engine.n_slots), 1) for r in rows})
    buckets = _powers(PREFILL_MIN, bucket(d.chunk, PREFILL_MIN))
    return [
        StepShape(r, t, m)
        for r in n_rows
        for t in [1, *buckets]
        for m in sorted({d.table_width(t, w) for w in ladder})
    ]


def _powers(lo: int, hi: int) -> list[int]:
    out = [lo]
    while out[-1] < hi:
        out.append(out[-1] * 2)
    return out


def warmup(
    engine: BatchEngine,
    rows: Iterable[int] = (1,),
    length: int = DEFAULT_LENGTH,
    prefill: Iterable[int] | None = None,
    workers: int | None = None,
    progress: Callable[[StepShape, float], None] | None = None,
) -> WarmupReport:
    """Compile every step `engine` runs for `rows` concurrent sequences of up to
    `length` positions (see `step_shapes`): into the step programs' disk cache
    (`llamay.engine.programs`) when it is on, else JAX's persistent compilation cache.
    Lowering runs here; compiling on `workers` threads (default: the CPU count, at most
    4). `progress(shape, seconds)` is called as each one finishes."""
    shapes = step_shapes(engine, rows, length, prefill)
    sampler = dataclasses.replace(Sampler(), n_probs=0)  # the plan of a default request
    samplers = [sampler] * engine.n_slots
    params = SamplingParams.stack(samplers, engine._vocab)
    state = SamplerState.init(samplers, history=engine.n_ctx)
    counts = {_REQUESTS: 0, _HITS: 0}

    def count(event: str, **_) -> None:
        if event in counts:
            counts[event] += 1

    jax.monitoring.register_event_listener(count)
    t0 = time.perf_counter()
    done: list[tuple[StepShape, float]] = []
    try:
        for k in _powers(1, max(s.rows for s in shapes)):
            # the requests' sampler seeding (bucketed counts), and the pipelined decode's
            # `nxt[:, None]`
            set_rows(state, list(range(k)), SamplerState.init(samplers[:k], history=engine.n_ctx))
            jax.device_put(np.zeros(bucket(k, 1), np.int32))[:, None].block_until_ready()
        if isinstance(paged_step, Program) and programs_enabled():
            return _warmup_programs(engine, shapes, workers, progress, t0)
        n = workers or min(4, os.cpu_count() or 1)
        with ThreadPoolExecutor(max_workers=n, thread_name_prefix="llamay-warmup") as pool:
            futures = []
            sampled = set()
            for shape in shapes:  # lowering holds the GIL: here; compiling releases it
                start = time.perf_counter()
                plan = engine._blank_plan(shape.rows, shape.tokens, shape.pages)
                step, sampling = engine._step_inputs(plan, None, params, state)
                lowered = paged_step.lower(*step)
                if shape.rows not in sampled:  # the sampling program, per row count
                    sampled.add(shape.rows)
                    logits = lowered.out_info[0]
                    pool.submit(_timed, paged_sample.lower(logits, *sampling))
                futures.append((shape, time.perf_counter() - start, pool.submit(_timed, lowered)))
                if _decode_jobs(engine, [shape]):  # multi-step decode (`decode_steps`)
                    pool.submit(_timed, paged_decode.lower(*_decode_args(engine, shape)))
            for shape, lowering, fut in futures:
                seconds = lowering + fut.result()
                done.append((shape, seconds))
                if progress is not None:
                    progress(shape, seconds)
    finally:
        jax.monitoring.unregister_event_listener(count)
    return WarmupReport(done, counts[_HITS], counts[_REQUESTS], time.perf_counter() - t0)


def _warmup_programs(engine, shapes, workers, progress, t0: float) -> WarmupReport:
    """`warmup` into the step programs' own disk cache (`llamay.engine.programs`, what a
    later process loads; JAX's cache never holds them): each step program loaded or
    built from its inputs' shapes, then the sampling programs run as `prime` runs them.
    A program loaded from disk (or already in memory) counts as cached."""
    args = engine.on_worker(lambda e: [abstract(_step_args(e, s)) for s in shapes])

    def one(shape: StepShape, a: tuple) -> tuple[StepShape, float, str]:
        start = time.perf_counter()
        got = paged_step.prepare(*a)
        return shape, time.perf_counter() - start, got

    results = [one(shapes[0], args[0])] if shapes else []  # alone: the native kernels
    n = workers or min(4, os.cpu_count() or 1)  # register themselves once
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="llamay-warmup") as pool:
        futures = [pool.submit(one, s, a) for s, a in zip(shapes[1:], args[1:], strict=True)]
        results += [f.result() for f in futures]
    for shape, seconds, _ in results:
        if progress is not None:
            progress(shape, seconds)
    _prepare(engine.on_worker(lambda e: _decode_jobs(e, shapes)), None, workers)
    _prime_samplers(engine, shapes)
    cached = sum(got in ("disk", "memory") for *_, got in results)
    done = [(shape, seconds) for shape, seconds, _ in results]
    return WarmupReport(done, cached, len(results), time.perf_counter() - t0)


def _timed(lowered) -> float:
    start = time.perf_counter()
    lowered.compile()
    return time.perf_counter() - start


def prime(
    engine: BatchEngine,
    rows: Iterable[int] | None = None,
    length: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    workers: int | None = None,
    part: str = "all",
) -> float:
    """Make ready each program `engine` dispatches for `rows` concurrent sequences
    (default: every row bucket up to its slots) of up to `length` positions (default:
    its context), prefill buckets included (see the module docstring), and, when it
    speculates, its verify steps and its draft model's steps (`verify_shapes`,
    `draft_shapes`). The step programs, kept on disk (`llamay.engine.programs`), are
    loaded or built on `workers` threads (default: the CPU count, at most 4) from their
    inputs' shapes, without running; with the program cache off each is run once on the
    worker instead, one per worker call so requests and `close` are served in between.
    The sampling programs run once on the worker. `progress(done, total)` is called
    after each program of the part. `part`: "first", the programs a server's first
    requests need (`first_shapes`: one row, the narrowest tables; its sampling with
    masks and log-probabilities); "rest", every other one, in the order requests are
    likely to need them (narrow tables and few rows first); "all", both. With the
    program cache off "first" does everything and "rest" nothing. Returns the seconds."""
    if part not in ("all", "first", "rest"):
        raise ValueError(f'part is "all", "first" or "rest", not {part!r}')
    t0 = time.perf_counter()
    rows = list(rows) if rows is not None else _powers(1, bucket(engine.n_slots, 1))
    length = length or engine.n_ctx
    shapes = step_shapes(engine, rows, length)
    logits: dict[int, jax.Array] = {}
    if isinstance(paged_step, Program) and programs_enabled():
        first = first_shapes(shapes)
        if part != "rest":
            jobs = engine.on_worker(lambda e: _step_jobs(e, first) + _decode_jobs(e, first))
            _prepare(jobs, progress, workers)
            _prime_samplers(engine, first)
        if part != "first":
            rest = sorted(
                (s for s in shapes if s not in set(first)),
                key=lambda s: (s.pages, s.rows, s.tokens),
            )
            jobs = engine.on_worker(lambda e: _step_jobs(e, rest) + _decode_jobs(e, rest))
            jobs += _speculative_jobs(engine, rows, length)
            _prepare(jobs, progress, workers)
            _prime_samplers(engine, [s for s in rest if s.rows != 1])
        return time.perf_counter() - t0
    if part == "rest":
        return 0.0
    for i, shape in enumerate(shapes):
        logits[shape.rows] = engine.on_worker(lambda e, shape=shape: _prime_step(e, shape))
        engine.on_worker(lambda e, shape=shape: _prime_decode(e, shape))
        if progress is not None:
            progress(i + 1, len(shapes))
    for R, out in logits.items():
        engine.on_worker(lambda e, R=R, out=out: _prime_sampling(e, R, out))
    return time.perf_counter() - t0


def first_shapes(shapes: list[StepShape]) -> list[StepShape]:
    """Of `shapes`, what a server's first request runs: one row, and per T the narrowest
    table (a short prompt's prefill chunks and its decode)."""
    one = [s for s in shapes if s.rows == 1]
    narrowest = {}
    for s in one:
        narrowest[s.tokens] = min(narrowest.get(s.tokens, s.pages), s.pages)
    return [s for s in one if s.pages == narrowest[s.tokens]]


def _prime_samplers(engine: BatchEngine, shapes: list[StepShape]) -> None:
    """Run each row count's sampling programs once on the worker, over the logits of its
    narrowest decode step (run over padding rows: the pool is unchanged)."""
    for R in sorted({s.rows for s in shapes}):
        first = min((s for s in shapes if s.rows == R), key=lambda s: (s.tokens, s.pages))
        out = engine.on_worker(lambda e, s=first: _prime_step(e, s))
        engine.on_worker(lambda e, R=R, out=out: _prime_sampling(e, R, out))


def _prepare(jobs: list[tuple[Program, tuple]], progress, workers) -> None:
    """Load or build every (program, abstract arguments) of `jobs` on a thread pool
    (tracing holds the GIL, XLA's compiling and loading do not)."""
    total = len(jobs)
    if not total:
        return
    jobs[0][0].prepare(*jobs[0][1])  # alone: the native kernels register themselves once
    if progress is not None:
        progress(1, total)
    n = workers or min(4, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="llamay-prime") as pool:
        futures = [pool.submit(program.prepare, *args) for program, args in jobs[1:]]
        for i, fut in enumerate(as_completed(futures), 2):
            fut.result()
            if progress is not None:
                progress(i, total)


def _step_jobs(engine: BatchEngine, shapes: list[StepShape]) -> list[tuple[Program, tuple]]:
    """The step programs of `shapes`, their inputs read on the worker (which owns the
    pool) as shapes only."""
    return [(paged_step, abstract(_step_args(engine, s))) for s in shapes]


def _decode_jobs(engine: BatchEngine, shapes: list[StepShape]) -> list[tuple[Program, tuple]]:
    """The multi-step decode programs (`paged_decode`) of `shapes`' decode steps, when
    the engine takes several per dispatch (`BatchEngine.decode_steps`, no sliding-window
    pool: `StepWorker._decode_steps`), over the default sampler's parameters."""
    if engine.decode_steps <= 1 or engine.mgr.local is not None:
        return []
    return [(paged_decode, abstract(_decode_args(engine, s))) for s in shapes if s.tokens == 1]


def _decode_args(engine: BatchEngine, shape: StepShape) -> tuple:
    samplers = [dataclasses.replace(Sampler(), n_probs=0)] * engine.n_slots
    params = SamplingParams.stack(samplers, engine._vocab)
    state = SamplerState.init(samplers, history=engine.n_ctx)
    plan = engine._blank_plan(shape.rows, 1, shape.pages)
    plan.steps = engine.decode_steps
    step, sampling = engine._step_inputs(plan, None, params, state)
    return engine._decode_inputs(plan, step, sampling)


def _prime_decode(engine: BatchEngine, shape: StepShape) -> None:
    """Run a decode shape's `paged_decode` once over padding rows (the pool is unchanged)."""
    if _decode_jobs(engine, [shape]):
        *_, engine.kv, _ = paged_decode(*_decode_args(engine, shape))


def _speculative_jobs(engine: BatchEngine, rows, length: int) -> list[tuple[Program, tuple]]:
    """The programs a speculating engine adds: each verify step (`paged_verify`), its
    sampling (`verify_sample`, per rows and T, with and without per-position token
    masks), and with a draft model its steps and its greedy pick (with and without
    masks). The pools' shapes are read on the worker; the one trace each needs for its
    output's shape runs here, off the worker, which serves requests meanwhile."""

    def read(e: BatchEngine):
        verify = []
        for shape in verify_shapes(e, rows, length):
            plan = e._blank_plan(shape.rows, shape.tokens, shape.pages)
            step, (sampling, slots, *_) = abstract(e._step_inputs(plan, None, None, None))
            verify.append((shape, step, sampling, slots))
        d = e._drafter
        draft = []
        if d is not None:
            for shape in draft_shapes(e, rows, length):
                R, T, M = shape.rows, shape.tokens, shape.pages
                host = (
                    np.zeros((R, T), np.int32),
                    np.full((R, T), PAD_POSITION, np.int32),
                    np.zeros((R, M), np.int32),
                    np.zeros(R, np.int32),
                )
                draft.append(
                    (
                        shape,
                        (
                            d.cfg,
                            abstract(d.weights),
                            abstract(d.kv),
                            *abstract(jax.device_put(host)),
                        ),
                    )
                )
        return verify, draft

    verify, draft = engine.on_worker(read)
    jobs: list[tuple[Program, tuple]] = []
    words = mask_words(engine._vocab or 0)
    on = jax.device_put(np.zeros(1, np.int32)).sharding  # a program's outputs' placement
    if verify:
        samplers = [dataclasses.replace(Sampler(), n_probs=0)] * engine.n_slots
        params = abstract(SamplingParams.stack(samplers, engine._vocab))
        state = abstract(SamplerState.init(samplers, history=engine.n_ctx))
        sampled = set()
        hidden = None
        for shape, step, sampling, slots in verify:
            args = (*step[:6], *step[7:])  # as `Speculating._verify` calls it
            jobs.append((paged_verify, args))
            if hidden is None:  # [R, T, E]: its width and type (traced once)
                hidden = paged_verify.eval_shape(*args)[0]
            R, T = shape.rows, shape.tokens
            if (R, T) in sampled:
                continue
            sampled.add((R, T))
            x = jax.ShapeDtypeStruct((R, T, *hidden.shape[2:]), hidden.dtype, sharding=on)
            drafts, n_draft = abstract(
                jax.device_put((np.zeros((R, T), np.int32), np.zeros(R, np.int32)))
            )
            for masks in (None, abstract(jax.device_put(np.zeros((R, T, words), np.uint32)))):
                rest = (drafts, n_draft, sampling, slots, params, state, masks)
                jobs.append((verify_sample, (engine.cfg, step[1], x, *rest)))
    if draft:
        logits = paged_step.eval_shape(*draft[0][1])[0]  # [R, V]: its type (traced once)
        jobs += [(paged_step, args) for _, args in draft]
        for R in sorted({shape.rows for shape, _ in draft}):
            lg = jax.ShapeDtypeStruct((R, *logits.shape[1:]), logits.dtype, sharding=on)
            mask = abstract(jax.device_put(np.zeros((R, words), np.uint32)))
            jobs += [(_greedy, (lg,)), (_greedy, (lg, mask))]
    return jobs


def _step_args(engine: BatchEngine, shape: StepShape) -> tuple:
    plan = engine._blank_plan(shape.rows, shape.tokens, shape.pages)
    return engine._step_inputs(plan, None, None, None)[0]


def _prime_step(engine: BatchEngine, shape: StepShape) -> jax.Array:
    logits, engine.kv = paged_step(
        *_step_args(engine, shape)
    )  # padding rows: the pool is unchanged
    return logits


def _prime_sampling(engine: BatchEngine, R: int, logits: jax.Array) -> None:
    """The sampling program over R rows with and without token masks, at each top-N
    width, with the programs seeding starting requests and feeding pipelined steps."""
    plan = engine._blank_plan(R, 1, 1)
    _, (sampling, slots, *_) = engine._step_inputs(plan, None, None, None)
    words = mask_words(engine._vocab or 0)
    for width in (0, LOGPROB_WIDTH, LOGPROB_WIDTH_MAX):
        samplers = [dataclasses.replace(Sampler(), n_probs=width)] * engine.n_slots
        params = SamplingParams.stack(samplers, engine._vocab)
        state = SamplerState.init(samplers, history=engine.n_ctx)
        for mask in (None, jax.device_put(np.full((R, words), 0xFFFFFFFF, np.uint32))):
            nxt, _ = paged_sample(logits, sampling, slots, params, state, mask)
        set_rows(state, list(range(R)), SamplerState.init(samplers[:R], history=engine.n_ctx))
    nxt[:, None].block_until_ready()
