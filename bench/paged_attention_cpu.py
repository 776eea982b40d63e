"""CPU cost of the paged decode step's attention: the bare `paged_step` loop (as
`decode_profile.py --paged` builds it) with the native paged attention, with the
reference (the pages gathered into a dense view per layer, the XLA path before the
kernel), or with no attention at all (zeros: the rest of the step), so that
reference - none and native - none are what attention costs.

    .venv/bin/python bench/paged_attention_cpu.py [--model smollm2:135m] [--rows 1]
        [--context 1024] [--steps 20] [--attention native|reference|none]

Prints CPU ms per step (this process, every thread: on a shared CPU wall time measures
the neighbours) and wall ms, with the load average. `--attention reference` also serves
other bench scripts: `python bench/paged_attention_cpu.py --attention reference --run
bench/engine_overhead.py -- --rows 1 --context 1024` runs that script with the kernel off.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def choose(attention: str) -> None:
    """Make the dispatcher's native paged attention return None (reference) or zeros.
    The programs on disk (`llamay.engine.programs`) are keyed by the sources and settings,
    not by this patch: they are kept out, or a step compiled with the kernel would load."""
    import jax.numpy as jnp

    import llamay.kernels_cpu as kc

    if attention != "native":
        os.environ["LLAMAY_NO_PROGRAM_CACHE"] = "1"

    if attention == "reference":
        kc.paged_attention = lambda *a, **k: None
    elif attention == "none":
        kc.paged_attention = lambda q, *a, **k: jnp.zeros(q.shape, jnp.float32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2:135m")
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--attention", default="native", choices=("native", "reference", "none"))
    ap.add_argument("--run", help="run this bench script instead (arguments after --)")
    args, rest = ap.parse_known_args()
    choose(args.attention)
    if args.run:
        sys.argv = [args.run, *[a for a in rest if a != "--"]]
        runpy.run_path(args.run, run_name="__main__")
        return

    from decode_profile import paged_steps

    import llamay

    m = llamay.load(args.model, progress=False)
    n = args.steps
    _, steps = paged_steps(m, args.rows, args.context, n, positions=args.context + 3 * n + 3)
    steps(3)
    runs = []
    for _ in range(2):
        c0, t0 = time.process_time(), time.perf_counter()
        steps(n)
        runs.append(((time.process_time() - c0) / n * 1e3, (time.perf_counter() - t0) / n * 1e3))
    print(json.dumps({
        "model": args.model, "rows": args.rows, "context": args.context,
        "attention": args.attention, "cpu_ms_per_step": round(min(r[0] for r in runs), 2),
        "wall_ms_per_step": round(min(r[1] for r in runs), 2),
        "load": [round(x, 2) for x in os.getloadavg()],
    }))  # fmt: skip


if __name__ == "__main__":
    main()
