"""A server ready before its first request: at start it loads each configured model and
primes its engine's programs in the background (`llamay.engine.warmup.prime`: every step
shape the engine can dispatch for sequences up to WARM_LENGTH, prefix hits'
narrow-prefill-over-wide-tables among them, and the sampling program with token masks
and top-N log-probabilities; a second start reads the step programs back from disk,
`llamay.engine.programs`), logging its progress; `/health` answers 503 with
llama-server's "Loading model" body until then.
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


def ready(st: ServerState) -> bool:
    return not st.extra.get(_KEY)


def _log(text: str) -> None:
    print(f"[llamay] {text}", file=sys.stderr, flush=True)


async def warm_up(st: ServerState, log=_log) -> None:
    """Load and prime every configured model; the server is ready when this returns
    (or fails: a model that cannot load is reported, and the others still warm up)."""
    st.extra[_KEY] = True
    loop = asyncio.get_running_loop()
    try:
        for name in list(st.models.configured):
            t0, before = time.perf_counter(), programs.STATS.copy()
            try:
                lm = await st.models.get(name)
                lm.busy += 1  # not reaped while it warms up
                try:
                    shown = [0]

                    def progress(done: int, total: int, name=name, shown=shown) -> None:
                        if done == total or done - shown[0] >= max(1, total // 10):
                            shown[0] = done
                            log(f"warming up {name}: {done}/{total} step programs")

                    await loop.run_in_executor(
                        None,
                        lambda lm=lm, p=progress: prime(
                            lm.engine, length=min(lm.engine.n_ctx, WARM_LENGTH), progress=p
                        ),
                    )
                finally:
                    lm.busy -= 1
            except Exception as exc:  # noqa: BLE001 - reported; the server still serves
                log(f"warming up {name} failed: {type(exc).__name__}: {exc}")
                continue
            got = programs.STATS - before
            log(
                f"{name} ready in {time.perf_counter() - t0:.1f}s ({got['disk']} programs "
                f"read from disk, {got['compiled'] + got['unstored']} built)"
            )
    finally:
        st.extra[_KEY] = False
