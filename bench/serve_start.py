"""Time to ready of `llamay serve`: a fresh start (no compiled programs anywhere) and a
second start on the same model (the caches the first one left), each in a new process.

    .venv/bin/python -m bench.serve_start [-m smollm2:135m] [--ctx N] [--runs 2]

Each child serves the model as `llamay serve -m MODEL` does (`create_app(warm_up=True)`
on a loopback port) and polls `/health`: `serving_s` is its first 200 (the first
requests' programs built: `llamay.serve.readiness`), when it sends one short request
(`first_request_s`: an 8-token prompt + 4 tokens, served while the rest still builds),
and `ready_s` the 200 with nothing warming. Its caches live under a
fresh LLAMAY_CACHE (the built native kernels linked in, so "fresh" means no programs,
not a C++ build), from one copy of llamay's sources taken at the start. Prints one
JSON object: per start `start` (fresh / second / ...),
`ready_s` (app start to /health ok), `load_s` (the model load), `programs` (programs
jit traced during start), the seconds JAX reports for `trace` (jaxpr tracing), `lower`
(jaxpr to StableHLO) and `compile` (XLA compile or persistent-cache read, summed over
threads), `cache_hits` (executables read back), the exported-program cache's counts
where llamay has one (`llamay.engine.exported`), `cpu_s` and the load averages (1, 5, 15
minutes) before the start.
Development figures: label them with the load.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRACE = "/jax/core/compile/jaxpr_trace_duration"
LOWER = "/jax/core/compile/jaxpr_to_mlir_module_duration"
COMPILE = "/jax/core/compile/backend_compile_duration"
HITS = "/jax/compilation_cache/cache_hits"


def _loadavg() -> list[float]:
    """uptime's 1, 5 and 15-minute load averages."""
    return [round(v, 2) for v in os.getloadavg()]


def child(model: str, ctx: int | None) -> dict:
    import httpx
    import jax

    sums = {TRACE: 0.0, LOWER: 0.0, COMPILE: 0.0}
    counts = {TRACE: 0, LOWER: 0, COMPILE: 0, HITS: 0}

    def duration(event: str, secs: float, **_) -> None:
        if event in sums:
            sums[event] += secs
            counts[event] += 1

    def event(name: str, **_) -> None:
        if name in counts:
            counts[name] += 1

    jax.monitoring.register_event_duration_secs_listener(duration)
    jax.monitoring.register_event_listener(event)

    from llamay.library import resolve
    from llamay.serve import create_app
    from llamay.serve.app import serve_in_thread
    from llamay.serve.models import Models

    models = Models({model: resolve(model)}, n_ctx=ctx, use_store=False)
    t0 = time.perf_counter()
    app = create_app(models, warm_up=True)
    with serve_in_thread(app) as url:
        while httpx.get(f"{url}/health", timeout=60).status_code != 200:
            time.sleep(0.05)
        serving = time.perf_counter() - t0
        t1 = time.perf_counter()
        r = httpx.post(
            f"{url}/completion",
            json={"prompt": list(range(300, 308)), "n_predict": 4, "temperature": 0},
            timeout=3600,
        )
        r.raise_for_status()
        first = time.perf_counter() - t1
        while "warming" in httpx.get(f"{url}/health", timeout=60).json():
            time.sleep(0.05)
        ready = time.perf_counter() - t0
        lm = models.loaded.get(model)
        out = {
            "serving_s": round(serving, 2),
            "first_request_s": round(first, 3),
            "ready_s": round(ready, 2),
            "load_s": round(lm.load_seconds, 2) if lm else None,
            "n_ctx": lm.engine.n_ctx if lm else None,
            "programs_traced": counts[TRACE],
            "programs_lowered": counts[LOWER],
            "programs_compiled": counts[COMPILE],
            "cache_hits": counts[HITS],
            "trace_s": round(sums[TRACE], 2),
            "lower_s": round(sums[LOWER], 2),
            "compile_s": round(sums[COMPILE], 2),
        }
        try:
            from llamay.engine import programs

            out["programs"] = {k: round(v, 2) for k, v in programs.STATS.items()}
        except ImportError:
            pass
    ru = resource.getrusage(resource.RUSAGE_SELF)
    out["cpu_s"] = round(ru.ru_utime + ru.ru_stime, 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default="smollm2:135m")
    ap.add_argument("--ctx", type=int, default=None)
    ap.add_argument("--runs", type=int, default=2, help="starts: a fresh one, then seconds")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.model, args.ctx)))
        return
    real = Path(os.environ.get("LLAMAY_CACHE", Path.home() / ".cache" / "llamay"))
    starts = []
    with tempfile.TemporaryDirectory(prefix="llamay-serve-start-") as tmp:
        cache, code = Path(tmp) / "cache", Path(tmp) / "code"
        cache.mkdir()
        for name in ("kernels_cpu",):
            if (real / name).exists():
                os.symlink(real / name, cache / name)
        # both starts run one copy of the sources (programs are keyed by them: a tree
        # edited between the two starts is a new install, not a second start)
        repo = Path(__file__).resolve().parents[1]
        for name in ("llamay", "bench"):
            shutil.copytree(repo / name, code / name, ignore=shutil.ignore_patterns("__pycache__"))
        env = {**os.environ, "LLAMAY_CACHE": str(cache), "PYTHONPATH": str(code)}
        for i in range(args.runs):
            load = _loadavg()
            cmd = [sys.executable, "-m", "bench.serve_start", "--child", "-m", args.model]
            if args.ctx:
                cmd += ["--ctx", str(args.ctx)]
            t0 = time.perf_counter()
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=code)
            if p.returncode != 0:
                sys.stderr.write(p.stderr)
                raise SystemExit(f"start {i} failed ({p.returncode})")
            got = json.loads(p.stdout.strip().splitlines()[-1])
            got.update(
                start="fresh" if i == 0 else "second" if i == 1 else f"start {i + 1}",
                process_s=round(time.perf_counter() - t0, 2),
                loadavg=load,
            )
            starts.append(got)
            print(json.dumps(got), file=sys.stderr, flush=True)
    print(json.dumps({"model": args.model, "starts": starts}))


if __name__ == "__main__":
    main()
