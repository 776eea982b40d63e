"""A server ready before its first request: at start it loads each configured model and
primes its engine's programs in the background (`llamay.engine.warmup.prime`: every step
shape the engine can dispatch for sequences up to WARM_LENGTH, prefix hits'
narrow-prefill-over-wide-tables among them, the sampling program with token masks and
top-N log-probabilities, and with speculative decoding the verify and draft steps; a
second start reads the step programs back from disk, `llamay.engine.programs`), logging
its progress, in two phases:

1. loading: each model loaded and the programs its first requests need built (one row,
   short prompts: `warmup.first_shapes`); `/health` answers 503 with llama-server's
   "Loading model" body;
2. serving: `/health` answers 200 `{"status": "ok", "warming": {"model", "done",
   "total"}}` while the other programs build in the background (a request whose shape
   is not built yet builds it then, or waits for the build under way), then
   `{"status": "ok"}`: from then on no request compiles anything (within WARM_LENGTH).

Requests that arrive meanwhile are served (between programs), only not yet fast.
"""

from __future__ import annotations

import asyncio
import sys
import time

from llamay.engine import programs
from llamay.engine.warmup import prime
from llamay.serve.state import ServerState

#: llama-server's /health body while its model loads.
LOADING = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
#: Sequences primed up to this many positions (or the context, when shorter): a model's
#: whole context (32,768 for Gemma 3) would be ~300 programs, half an hour of compiling
#: on a small CPU; longer sequences compile their widths when they first reach them.
WARM_LENGTH = 4096
_KEY = "warming_up"
_PROGRESS = "warming"


def ready(st: ServerState) -> bool:
    """Whether the server serves (phase 2 on; `warming` says whether it is still
    building programs)."""
    return not st.extra.get(_KEY)


def warming(st: ServerState) -> dict | None:
    """{"model", "done", "total"} while programs build in the background, else None."""
    return st.extra.get(_PROGRESS)


def health(st: ServerState) -> tuple[int, dict]:
    """`/health`'s status code and body (the module docstring)."""
    if not ready(st):
        return 503, LOADING
    got = warming(st)
    return 200, {"status": "ok", "warming": dict(got)} if got else {"status": "ok"}


def _log(text: str) -> None:
    print(f"[llamay] {text}", file=sys.stderr, flush=True)


async def warm_up(st: ServerState, log=_log) -> None:
    """Load every configured model and build its first requests' programs (the server
    serves once that is done), then build the rest; returns when all are (or failed: a
    model that cannot load is reported, and the others still warm up)."""
    st.extra[_KEY] = True
    st.extra[_PROGRESS] = {"model": None, "done": 0, "total": 0}
    loop = asyncio.get_running_loop()
    started = time.perf_counter()
    warm: list[tuple[str, object, float]] = []
    try:
        for name in list(st.models.configured):
            t0, before = time.perf_counter(), programs.STATS.copy()
            try:
                lm = await st.models.get(name)
                lm.busy += 1  # not reaped while it warms up
                try:
                    await loop.run_in_executor(None, lambda lm=lm: _prime(lm, "first"))
                except BaseException:
                    lm.busy -= 1
                    raise
            except Exception as exc:  # noqa: BLE001 - reported; the server still serves
                log(f"warming up {name} failed: {type(exc).__name__}: {exc}")
                continue
            warm.append((name, lm, t0))
            log(f"{name} serving in {time.perf_counter() - t0:.1f}s ({_counts(before)})")
        if warm:
            st.extra[_PROGRESS] = {"model": warm[0][0], "done": 0, "total": 0}
        else:
            st.extra.pop(_PROGRESS, None)
        st.extra[_KEY] = False  # serving: the rest builds in the background
        if warm:
            log(f"serving after {time.perf_counter() - started:.1f}s; warming up the rest")
        for name, lm, t0 in warm:
            st.extra[_PROGRESS] = {"model": name, "done": 0, "total": 0}
            before = programs.STATS.copy()
            shown = [0]

            def progress(done: int, total: int, name=name, shown=shown) -> None:
                st.extra[_PROGRESS] = {"model": name, "done": done, "total": total}
                if done == total or done - shown[0] >= max(1, total // 10):
                    shown[0] = done
                    log(f"warming up {name}: {done}/{total} programs")

            try:
                await loop.run_in_executor(None, lambda lm=lm, p=progress: _prime(lm, "rest", p))
            except Exception as exc:  # noqa: BLE001 - reported; the server still serves
                log(f"warming up {name} failed: {type(exc).__name__}: {exc}")
                continue
            finally:
                lm.busy -= 1
            log(f"{name} ready in {time.perf_counter() - t0:.1f}s ({_counts(before)})")
    finally:
        st.extra[_KEY] = False
        st.extra.pop(_PROGRESS, None)


def _prime(lm, part: str, progress=None) -> float:
    e = lm.engine
    return prime(e, length=min(e.n_ctx, WARM_LENGTH), progress=progress, part=part)


def _counts(before) -> str:
    got = programs.STATS - before
    return f"{got['disk']} programs read from disk, {got['compiled'] + got['unstored']} built"
