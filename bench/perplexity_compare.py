"""Perplexity throughput, llamay against llama.cpp's perplexity tool on the same GGUF files
and text (an evaluation job's cost: every token of a document through the model and the
LM head, the second half of each chunk scored).

    .venv/bin/python bench/perplexity_compare.py [--models smollm2:135m,gemma3:270m]
        [--ctx 512] [--chunks 8] [--batch 4] [--threads N]
        [--numerics exact,llamacpp,llamacpp+fa]
        [--text FILE] [--label run] [--skip-llamacpp]

llama.cpp: `llama-perplexity` as `bench/build_llamacpp.sh` builds it, at its defaults
(`-c CTX -t THREADS --chunks N`: a batch of 2048 tokens, so 4 chunks of 512 a pass,
flash attention "auto", on for CPU), and a second, labelled row with `-fa off`. llamay's
llamacpp numerics reproduce the second row's perplexity, with `+fa` (flash_attn=True) the
first's. Its time:
from its "calculating perplexity" log line to its final estimate (no load, no
tokenisation). llamay: `llamay.eval.perplexity` in this process with `--batch` chunks a
step, after one untimed step of the same shape (programs compiled); the time of the whole
`--chunks`. Each row: tokens/s (chunks x ctx / seconds) and the perplexity. The JSON (with
the load averages) goes to bench/results/perplexity-<label>-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.llamacpp_compare import RESULTS, model_path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TEXT = ROOT / "tests" / "fixtures" / "llamacpp" / "perplexity" / "GPL-3.txt"
BUILD = Path(os.environ.get("LLAMAY_CACHE", Path.home() / ".cache" / "llamay"))
TOOL = BUILD / "llama-server" / "build" / "bin" / "llama-perplexity"
# llama.cpp's log lines start with the time since its start, m.ss.mmm.uuu; the progress
# line before the final estimate has no newline, so the stamps are searched anywhere.
STAMP = r"(\d+)\.(\d+)\.(\d+)\.(\d+) I "


def _stamp_s(log: str, text: str) -> float | None:
    """The time of the log line that starts with `text`, in seconds."""
    m = re.search(STAMP + re.escape(text), log)
    if not m:
        return None
    mi, s, ms, us = map(int, m.groups())
    return mi * 60 + s + ms / 1e3 + us / 1e6


def run_llamacpp(path: Path, text: Path, ctx: int, chunks: int, threads: int, extra=()) -> dict:
    if not TOOL.exists():
        sys.exit(f"no {TOOL}: run bench/build_llamacpp.sh")
    args = [str(TOOL), "-m", str(path), "-f", str(text), "-c", str(ctx), "-t", str(threads)]
    args += ["--chunks", str(chunks), *extra]
    env = dict(os.environ, LD_LIBRARY_PATH=str(TOOL.parent))
    out = subprocess.run(args, capture_output=True, text=True, check=False, env=env)
    log = out.stdout + out.stderr
    if out.returncode != 0:
        sys.exit(f"llama-perplexity failed:\n{log[-2000:]}")
    start = _stamp_s(log, "perplexity: calculating perplexity over")
    end = _stamp_s(log, "Final estimate: PPL = ")
    if start is None or end is None:
        sys.exit(f"llama-perplexity's log lacks its timing lines:\n{log[-2000:]}")
    seconds = end - start
    ppl = float(log.split("Final estimate: PPL = ")[1].split()[0])
    engine = "llama.cpp" + (" " + " ".join(extra) if extra else "")
    return dict(engine=engine, seconds=round(seconds, 3), tokens_per_s=chunks * ctx / seconds,
                ppl=ppl)  # fmt: skip


def run_llamay(path: Path, text: Path, ctx: int, chunks: int, batch: int, label: str) -> dict:
    """llamay with `label`'s numerics: "exact", "llamacpp", "llamacpp+fa" (flash attention)."""
    import llamay
    from llamay.eval import perplexity

    numerics, _, fa = label.partition("+")
    m = llamay.load(path, numerics=numerics, progress=False, flash_attn=fa == "fa")
    body = text.read_text()
    perplexity(m, body, ctx=ctx, batch=batch, max_chunks=batch)  # compile the step
    t = time.perf_counter()
    r = perplexity(m, body, ctx=ctx, batch=batch, max_chunks=chunks)
    seconds = time.perf_counter() - t
    return dict(engine=f"llamay {label}", seconds=round(seconds, 3),
                tokens_per_s=r.n_chunks * ctx / seconds, ppl=round(r.ppl, 4))  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2:135m,gemma3:270m")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4, help="llamay's chunks per step")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--numerics", default="exact,llamacpp,llamacpp+fa")
    ap.add_argument("--text", type=Path, default=TEXT)
    ap.add_argument("--label", default="run")
    ap.add_argument("--skip-llamacpp", action="store_true")
    args = ap.parse_args()

    rows, loads = [], [os.getloadavg()]
    for name in args.models.split(","):
        path = model_path(name)
        runs = []
        if not args.skip_llamacpp:
            for extra in ((), ("-fa", "off")):
                runs.append(run_llamacpp(path, args.text, args.ctx, args.chunks, args.threads,
                                         extra))  # fmt: skip
                loads.append(os.getloadavg())
        for numerics in args.numerics.split(","):
            runs.append(run_llamay(path, args.text, args.ctx, args.chunks, args.batch, numerics))
            loads.append(os.getloadavg())
        base = runs[0]["tokens_per_s"] if not args.skip_llamacpp else None
        for r in runs:
            r |= dict(model=name, vs_llamacpp=round(r["tokens_per_s"] / base, 3) if base else None)
            rows.append(r)
            print("# " + json.dumps(r), flush=True)
    import jax

    meta = dict(
        label=args.label, time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        ctx=args.ctx, chunks=args.chunks, batch=args.batch, threads=args.threads,
        text=args.text.name, cpus=os.cpu_count(), jax=jax.__version__,
        load_averages=[[round(v, 2) for v in la] for la in loads],
    )  # fmt: skip
    print(f"# {meta['time']}  ctx {args.ctx}, {args.chunks} chunks of {args.text.name}; "
          f"load averages during the run: {meta['load_averages']}")  # fmt: skip
    print(f"| {'model':<14} | {'engine':<18} | {'tok/s':>7} | {'vs llama.cpp':>12} | {'ppl':>8} |")
    print("|" + "|".join("-" * w for w in (16, 20, 9, 14, 10)) + "|")
    for r in rows:
        ratio = f"{r['vs_llamacpp']:.2f}" if r["vs_llamacpp"] else ""
        print(f"| {r['model']:<14} | {r['engine']:<18} | {r['tokens_per_s']:>7.0f} "
              f"| {ratio:>12} | {r['ppl']:>8.4f} |")  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M", time.gmtime())
    out = RESULTS / f"perplexity-{args.label}-{stamp}.json"
    out.write_text(json.dumps(dict(meta=meta, runs=rows), indent=1) + "\n")
    print(f"# wrote {out}")


if __name__ == "__main__":
    main()
