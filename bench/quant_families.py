"""`llamay bench` on real models in each family of GGUF types (issue 20), beside llama.cpp.

    .venv/bin/python bench/quant_families.py [--only smollm2-IQ4_XS,kv-q8_0] [--reps 1]
        [--pp 128] [--tg 64] [--threads 2] [--make-only] [--out bench/results/x.md]

1. Makes the files with llama.cpp itself (llama-cpp-python's `llama_model_quantize`, through
   tests/fixtures/quant-types/make_quant_types.py `--quantize`, allow_requantize) from the
   store's SmolLM2-135M-Instruct Q4_1 and gemma3:270m (Q4_K_M) into
   ~/.cache/llamay/bench-models/ (cached: a file already there is not remade). Their rows
   (576, 640) are not multiples of 256, so llama.cpp falls back for some tensors (IQ4_XS ->
   IQ4_NL, IQ3_S -> IQ4_NL, TQ* -> Q4_0 where a row does not fit the 256-block): the types each
   file really holds are read back with gguf-py and printed/recorded per file.
   MXFP4: llama.cpp's MXFP4_MOE ftype quantises only MoE expert tensors; on these dense models
   it writes every matrix as Q8_0, so there is no dense MXFP4 file llama.cpp makes (not run).
2. For each file: pp/tg at batch 1 through `llamay.bench.run_bench` (what `llamay bench`
   runs) in exact and llamacpp numerics, and llama.cpp on the same file (bench/llamacpp_compare's
   runner, at its defaults), with the load average (`os.getloadavg`) beside each row. The KV
   families run the SmolLM2 Q4_1 file with K and V caches f16, q8_0, q4_0 (llamay's
   `kv_dtype`, llama.cpp's type_k/type_v). A sanity line per file: greedy tokens of a short
   prompt in llamay numerics="llamacpp" against llama.cpp's (its logits' argmax, same ids).
3. Writes the markdown table to --out (default bench/results/quant-families-<date>.md).

Needs the llama.cpp venv of bench/llamacpp_compare.py. Numbers only: nothing asserts a speed.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.llamacpp_compare import VENV, run_llamacpp  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MODELS_DIR = Path.home() / ".cache" / "llamay" / "bench-models"
QUANTIZE = ROOT / "tests" / "fixtures" / "quant-types" / "make_quant_types.py"
SOURCES = {"smollm2": "smollm2:135m", "gemma3": "gemma3:270m"}
FTYPES = {"IQ4_NL": 25, "IQ4_XS": 30, "IQ3_S": 26, "TQ2_0": 37, "TQ1_0": 36}
# (name, source, weight ftype or None = the source file as it is, KV cache type)
WEIGHT_RUNS = [(f"smollm2-{t}", "smollm2", t, None) for t in FTYPES]
WEIGHT_RUNS += [(f"gemma3-{t}", "gemma3", t, None) for t in ("IQ4_XS", "TQ2_0")]
KV_RUNS = [(f"kv-{t}", "smollm2", None, t) for t in ("f16", "q8_0", "q4_0")]
GGML_KV = {"f16": 1, "q4_0": 2, "q8_0": 8}
PROMPT = "The capital of France is"
GREEDY_N = 16

# Runs in the llama.cpp venv: argv = path type_k type_v n ids-json; prints the greedy ids.
GREEDY_RUNNER = r"""
import json, sys
import numpy as np
import llama_cpp as L

path, (tk, tv, n), ids = sys.argv[1], map(int, sys.argv[2:5]), json.loads(sys.argv[5])
kw = dict(type_k=tk, type_v=tv, flash_attn=tv != 1)  # a quantised V needs flash attention
llm = L.Llama(path, n_ctx=256, n_threads=2, logits_all=True, verbose=False, **kw)
llm.eval(ids)
out = []
for _ in range(n):
    tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    out.append(tok)
    llm.eval([tok])
print(json.dumps(out))
"""


def source_path(src: str) -> Path:
    from llamay.store import resolve

    return Path(resolve(SOURCES[src], progress=False))


def make(src: str, ftype: str | None) -> Path:
    """The GGUF of `src` quantised to `ftype` (cached in MODELS_DIR); None: the source."""
    if ftype is None:
        return source_path(src)
    dst = MODELS_DIR / f"{src}-{ftype}.gguf"
    if not dst.is_file():
        MODELS_DIR.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_suffix(".part")
        cmd = [str(VENV / "bin" / "python"), str(QUANTIZE), "--quantize"]
        args = [*cmd, str(source_path(src)), str(tmp), str(FTYPES[ftype])]
        out = subprocess.run(args, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"quantising {dst.name} failed:\n{out.stderr[-2000:]}")
        tmp.rename(dst)
    return dst


def tensor_types(path: Path) -> dict[str, int]:
    """Matrix (2-D+) tensor type -> count, read with gguf-py (the oracle, not llamay)."""
    import gguf

    r = gguf.GGUFReader(str(path))
    c = collections.Counter(t.tensor_type.name for t in r.tensors if len(t.shape) > 1)
    return dict(c.most_common())


def llamay_rows(path: Path, name: str, numerics: str, kv: str | None, a) -> tuple[list, list]:
    """(pp/tg rows, greedy ids) of llamay in `numerics`; greedy only for llamacpp numerics."""
    import llamay
    from llamay.bench import run_bench
    from llamay.sample import GREEDY

    kw = {"kv_dtype": kv} if kv else {}
    m = llamay.load(path, numerics=numerics, n_ctx=512, progress=False, **kw)
    rows = []
    for r in run_bench(m, name, a.pp, a.tg, (1,), a.reps):
        d = r.as_dict()
        rows.append(
            dict(
                engine=f"llamay {numerics}",
                test=d["test"],
                tokens_per_s=d["tokens_per_s"],
                stdev=d["stdev"],
                load=os.getloadavg()[0],
            )
        )
    greedy = None
    if numerics == "llamacpp":
        ids = m.tokenizer.encode(PROMPT)
        greedy = (
            list(ids),
            [int(t) for t in m.generation(ids, max_tokens=GREEDY_N, sampler=GREEDY)],
        )
    return rows, greedy


def llamacpp_greedy(path: Path, kv: str | None, ids: list[int]) -> list[int]:
    t = GGML_KV[kv or "f16"]
    cmd = [str(VENV / "bin" / "python"), "-c", GREEDY_RUNNER, str(path), str(t), str(t)]
    out = subprocess.run([*cmd, str(GREEDY_N), json.dumps(ids)], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"llama.cpp greedy failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated run names (default: all)")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--pp", type=int, default=128)
    ap.add_argument("--tg", type=int, default=64)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument(
        "--omp-wait",
        default="PASSIVE",
        help="llama.cpp's OMP_WAIT_POLICY ('' = its default; spinning threads crawl under load)",
    )
    ap.add_argument("--make-only", action="store_true", help="make the files, print their types")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    runs = WEIGHT_RUNS + KV_RUNS
    if a.only:
        runs = [r for r in runs if r[0] in a.only.split(",")]
    files = {}
    for name, src, ftype, _kv in runs:
        path = make(src, ftype)
        files[name] = (path, tensor_types(path))
        print(f"{name}: {path.name} {files[name][1]}", flush=True)
    if a.make_only:
        return
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    table, sanity, loads = [], [], []
    for name, _src, _ftype, kv in runs:
        path, types = files[name]
        rows = []
        greedy = None
        for numerics in ("exact", "llamacpp"):
            r, g = llamay_rows(path, name, numerics, kv, a)
            rows += r
            greedy = g or greedy
        kv_ids = (GGML_KV[kv], GGML_KV[kv]) if kv else None
        for r in run_llamacpp(
            path, a.threads, a.reps, a.pp, a.tg, a.omp_wait or None, batches="1", kv_types=kv_ids
        ):
            rows.append(dict(r, engine="llama.cpp", load=os.getloadavg()[0]))
        ids, ours = greedy
        theirs = llamacpp_greedy(path, kv, ids)
        same = ours == theirs[: len(ours)]
        sanity.append(
            f"{name}: greedy {len(ours)} tokens {'agree' if same else 'DIFFER'}"
            + ("" if same else f" (llamay {ours}, llama.cpp {theirs})")
        )
        print(sanity[-1], flush=True)
        by = {(r["engine"], r["test"]): r for r in rows}
        for test in (f"pp{a.pp}", f"tg{a.tg}"):
            cells = [by.get((e, test)) for e in ("llamay exact", "llamay llamacpp", "llama.cpp")]
            loads += [c["load"] for c in cells if c]
            table.append((name, kv or "f16", types, test, cells))
            print(name, test, [c and c["tokens_per_s"] for c in cells], flush=True)
        write(a, started, table, sanity, loads)  # after every file: a cut-short run keeps its rows


def write(a, started, table, sanity, loads) -> None:
    lo, hi = min(loads), max(loads)
    out = a.out or ROOT / "bench" / "results" / f"quant-families-{time.strftime('%Y%m%d')}.md"
    lines = [
        f"# Weight and KV cache type families: llamay vs llama.cpp ({started})",
        "",
        f"**Development figures, loaded machine (load {lo:.1f}-{hi:.1f})**: 2 shared cores, other",
        "helpers running tests; compare rows only within this run. Made by",
        f"`.venv/bin/python bench/quant_families.py --reps {a.reps} --pp {a.pp} --tg {a.tg}`",
        f"(threads {a.threads}, batch 1, tokens/s mean of {a.reps} after a warm-up; llama.cpp",
        "through llama-cpp-python 0.3.36 with OMP_WAIT_POLICY="
        f"{a.omp_wait or '(its default)'}; load = 1-min load average after each engine's rows).",
        "Types: the matrix tensors each file really holds (gguf-py), count per type.",
        "",
        "| file | KV | tensor types | test | llamay exact | llamay llamacpp | llama.cpp | load |",
        "|---|---|---|---|---:|---:|---:|---|",
    ]
    for name, kv, types, test, cells in table:
        ty = ", ".join(f"{k} {v}" for k, v in types.items())
        vals = [f"{c['tokens_per_s']:.1f}" if c else "-" for c in cells]
        ld = "/".join(f"{c['load']:.1f}" for c in cells if c)
        lines.append(f"| {name} | {kv} | {ty} | {test} | {' | '.join(vals)} | {ld} |")
    lines += [
        "",
        "Sanity (not a benchmark): greedy ids of "
        f"{PROMPT!r}, llamay numerics=llamacpp vs llama.cpp on the same file:",
        "",
    ]
    lines += [f"- {s}" for s in sanity]
    lines += [
        "",
        "MXFP4: llama.cpp's MXFP4_MOE ftype quantises only MoE expert tensors; on",
        "these dense models it writes every matrix as Q8_0, so no dense MXFP4 file is",
        "made by llama.cpp and the family is not in this table (MXFP4 is covered by the",
        "random-block fixtures of tests/fixtures/quant-types and bench/qmatmul_iq_cpu.py).",
    ]
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
