"""llamay against llama.cpp on the same GGUF files: pp128 and tg128 at batch 1, tg128 at batch 8.

    .venv/bin/python bench/llamacpp_compare.py [--models smollm2:135m,gemma3:270m]
        [--threads N] [--reps 3] [--rounds 1] [--label after] [--skip-llamacpp]
        [--numerics exact,llamacpp] [--no-passive-row] [--pp 128] [--tg 128]
        [--batches 1,8] [--depth D]

llama.cpp runs through llama-cpp-python's low-level API in a separate virtual
environment (it is never a llamay dependency), at its defaults (what a user gets: the
default OpenMP wait policy), plus a second, labelled row "llama.cpp PASSIVE" with
OMP_WAIT_POLICY=PASSIVE (what it gets on a loaded machine; `--no-passive-row` leaves it
out). llamay runs through `llamay.bench.run_bench` (what `llamay bench` runs) in each of
`--numerics` (default both: "llamay exact", "llamay llamacpp"; "llamacpp+fa": llamacpp
numerics with flash_attn, as llama.cpp's default context computes). All measure the same:

- pp128: one 128-token prompt from an empty cache, tokens/s;
- tg128 batch 1: 128 decode steps of one sequence after an 8-token prompt;
- tg128 batch 8: 128 decode steps of 8 sequences in lockstep (llama.cpp: 8 sequences
  in one llama_batch per step, a unified KV cache), aggregate tokens/s;
- with `--depth D` (llama-bench's -d), each test after D tokens already in each
  sequence's cache (filled untimed), named as llama-bench does, "pp512 @ d4096": a long
  chat's or document's cost (`--batches 1` keeps the untimed fill short).

Each engine warms up once, then `reps` timed runs (mean ± stdev). `--rounds N` runs the
engines alternately N times (the CPU is shared: compare runs taken together). The
table gives each llamay row over llama.cpp at its defaults; the JSON (with `uptime`'s
load averages) goes to bench/results/llamacpp-<label>-<time>.json.

The memory-bandwidth limit, measured in the same run: a read-bandwidth probe (numpy
max over a 512 MiB buffer, one thread per core, best of 5) and the weight bytes one
decode step reads (every matrix, the LM head once; an untied embedding's lookup reads a
row): `bound tok/s` = bandwidth ÷ bytes per token, and each tg128 batch-1 rate as a %
of it. `--skip-llamacpp` measures llamay alone (e.g. an older checkout, with PYTHONPATH
pointing at it, for before/after numbers).

Building llama.cpp once: `bench/build_llamacpp.sh` (about 12 min on 2 cores) builds it for
both benches as below. By hand (about 30 min on 2 cores; CMAKE_BUILD_PARALLEL_LEVEL=1 leaves
a core to others; the sdist is llama-cpp-python's source release):

    python3.12 -m venv ~/.cache/llamay/llamacpp-venv
    CMAKE_ARGS="-DGGML_NATIVE=ON" CMAKE_BUILD_PARALLEL_LEVEL=1 nice -n 10 \\
        ~/.cache/llamay/llamacpp-venv/bin/pip install --no-deps llama_cpp_python-0.3.36.tar.gz

On a CPU with AMX (Sapphire Rapids and later), GGML_NATIVE=ON also builds ggml's AMX
matmul, which crashed (SIGSEGV in ggml_backend_amx_mul_mat at the first prefill) in the
2-core VM of 2026-12-03: there, build without it, `-DGGML_NATIVE=OFF -DGGML_AVX=ON
-DGGML_AVX2=ON -DGGML_AVX_VNNI=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
-DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON` (the
host's ISA, AMX off). One build serves both benches: build llama-server as
bench/llamaserver_compare.py says with `-DBUILD_SHARED_LIBS=ON` and the targets `llama
llama-server`, then copy the sdist's `llama_cpp/` package into the venv's site-packages
and build/bin/*.so into its `llama_cpp/lib/` (the venv needs numpy, typing_extensions,
diskcache and jinja2).

Thread count: `--threads` (default: the cores) for llama.cpp's decode and batch; XLA's
CPU client and the native kernels use one thread per core, so run on a machine (or under
`taskset`) with that many cores. Run it on a quiet machine: with the default wait
policy ggml's OpenMP threads spin, and under load 11 two of them ran SmolLM2 tg at
3 tok/s (PASSIVE: 60) — which is why the PASSIVE row is there, labelled.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

VENV = Path.home() / ".cache" / "llamay" / "llamacpp-venv"
RESULTS = Path(__file__).resolve().parent / "results"
MODELS = "smollm2:135m,gemma3:270m"
CACHED = {  # store names -> the files as the test fixtures' wheel cache holds them
    "smollm2:135m": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3:270m": "gemma-3-270m-q4_k_m.gguf",
}

# Runs inside the llama.cpp venv: argv = path threads pp tg batches reps; prints JSON lines.
LLAMACPP_RUNNER = r"""
import ctypes, json, os, statistics, sys, time
import llama_cpp as L

path, threads, pp, tg, reps = sys.argv[1], *map(int, sys.argv[2:5]), int(sys.argv[6])
batches = [int(b) for b in sys.argv[5].split(",")]
depth = int(sys.argv[7])  # tokens in each sequence's cache before a test (untimed)
at = f" @ d{depth}" if depth else ""
CHUNK = 512  # the depth's prefill, tokens a call
quiet = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)(lambda *a: None)
L.llama_log_set(quiet, None)
L.llama_backend_init()
model = L.llama_model_load_from_file(path.encode(), L.llama_model_default_params())
if not model:
    sys.exit(f"llama.cpp could not load {path}")
n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))


def context(n_seq):
    cp = L.llama_context_default_params()
    cp.n_ctx = n_seq * (depth + 8 + tg + 8) + pp
    cp.n_batch = cp.n_ubatch = max(pp, 8 * n_seq, CHUNK if depth else 0)
    cp.n_seq_max = n_seq
    cp.kv_unified = True
    cp.n_threads = cp.n_threads_batch = threads
    for field in ("type_k", "type_v"):  # KV cache types (ggml type ids), e.g. 8 = q8_0
        if os.environ.get("LLAMACPP_" + field.upper()):
            setattr(cp, field, int(os.environ["LLAMACPP_" + field.upper()]))
    return L.llama_init_from_model(model, cp)


def decode(ctx, batch, rows):
    # rows: (token, pos, seq, wants logits)
    batch.n_tokens = len(rows)
    for i, (tok, pos, seq, out) in enumerate(rows):
        batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos, 1
        batch.seq_id[i][0], batch.logits[i] = seq, out
    if L.llama_decode(ctx, batch) != 0:
        sys.exit("llama_decode failed")
    L.llama_synchronize(ctx)


def tok(i):
    return 100 + (i * 7919) % min(n_vocab - 100, 30000)


def timed(fn):
    fn()
    rates = []
    for _ in range(reps):
        rates.append(fn())
    return statistics.mean(rates), statistics.pstdev(rates)


def report(test, b, rate):
    print(json.dumps(dict(engine="llama.cpp", test=test, batch=b, tokens_per_s=round(rate[0], 2),
                          stdev=round(rate[1], 2))), flush=True)


def fill(ctx, seqs):
    # `depth` tokens into each of `seqs` sequences, CHUNK at a time (untimed)
    for s in range(seqs):
        for i0 in range(0, depth, CHUNK):
            n = min(CHUNK, depth - i0)
            decode(ctx, batch, [(tok(99 * s + i0 + i), i0 + i, s, i == n - 1) for i in range(n)])


ctx = context(1)
batch = L.llama_batch_init(max(pp, 64, CHUNK), 0, 8)
mem = L.llama_get_memory(ctx)


def pp_run():
    L.llama_memory_clear(mem, True)
    fill(ctx, 1)
    t = time.perf_counter()
    decode(ctx, batch, [(tok(i), depth + i, 0, i == pp - 1) for i in range(pp)])
    return pp / (time.perf_counter() - t)


if pp:
    report(f"pp{pp}{at}", 1, timed(pp_run))
for b in batches:
    if b != 1:
        L.llama_free(ctx)
        ctx = context(b)
        mem = L.llama_get_memory(ctx)

    def tg_run(b=b, ctx=ctx, mem=mem):
        L.llama_memory_clear(mem, True)
        fill(ctx, b)
        prompt = [(tok(8 * s + i), depth + i, s, i == 7) for s in range(b) for i in range(8)]
        decode(ctx, batch, prompt)
        t = time.perf_counter()
        for step in range(tg):
            decode(ctx, batch, [(tok(step + s), depth + 8 + step, s, True) for s in range(b)])
        return tg * b / (time.perf_counter() - t)

    report(f"tg{tg}{at}", b, timed(tg_run))
"""


def model_path(name: str) -> Path:
    p = Path(name).expanduser()
    if p.is_file():
        return p
    cached = Path.home() / ".cache" / "llamay" / "models" / CACHED.get(name, "")
    if name in CACHED and cached.is_file():
        return cached
    from llamay.store import resolve

    return Path(resolve(name, progress=False))


def run_llamacpp(
    path: Path,
    threads: int,
    reps: int,
    pp: int = 128,
    tg: int = 128,
    omp_wait: str | None = None,
    batches: str = "1,8",
    kv_types: tuple[int, int] | None = None,
    depth: int = 0,
) -> list[dict]:
    """The runner in the llama.cpp venv. LLAMACPP_PYTHONPATH (its PYTHONPATH) and
    LLAMA_CPP_LIB_PATH (llama-cpp-python's own) point it at an uninstalled build.
    `batches`: the tg batch sizes ("1,8"); `kv_types`: the KV cache's (type_k, type_v) as
    ggml type ids (llama.cpp's -ctk/-ctv; None: its default, f16). `depth`: tokens in each
    sequence's cache before each test (untimed; llama-bench's -d).
    `omp_wait`: OMP_WAIT_POLICY for ggml's OpenMP threads, None for llama.cpp's default
    (the variable unset); the rows are labelled "llama.cpp" / "llama.cpp <policy>"."""
    python = VENV / "bin" / "python"
    if not python.exists():
        sys.exit(f"no llama.cpp venv at {VENV}: build it as this script's docstring says")
    env = dict(os.environ, PYTHONPATH=os.environ.get("LLAMACPP_PYTHONPATH", ""))
    env.pop("OMP_WAIT_POLICY", None)
    if omp_wait:
        env["OMP_WAIT_POLICY"] = omp_wait
    if kv_types:
        env["LLAMACPP_TYPE_K"], env["LLAMACPP_TYPE_V"] = map(str, kv_types)
    args = [str(python), "-c", LLAMACPP_RUNNER, str(path), str(threads), str(pp), str(tg), batches]
    args += [str(reps), str(depth)]
    out = subprocess.run(args, capture_output=True, text=True, check=False, env=env)
    if out.returncode != 0:
        sys.exit(f"llama.cpp run failed:\n{out.stderr[-2000:]}")
    engine = "llama.cpp" + (f" {omp_wait}" if omp_wait else "")
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return [r | {"engine": engine} for r in rows]


def run_llamay(
    path: Path, name: str, reps: int, pp: int = 128, tg: int = 128, numerics: str = "exact",
    batches: str = "1,8", depth: int = 0,
) -> list[dict]:  # fmt: skip
    import llamay
    from llamay import kernels
    from llamay.bench import run_bench

    label = numerics
    numerics, _, fa = label.partition("+")
    m = llamay.load(path, numerics=numerics, progress=False, flash_attn=fa == "fa")
    results = run_bench(m, name, pp, 0, (1,), reps, depth) if pp else []
    for b in (int(b) for b in batches.split(",")):
        results += run_bench(m, name, 0, tg, (b,), reps, depth)
    keep = ("test", "batch", "tokens_per_s", "stdev", "compile_s")
    form = kernels.weight_form(numerics)  # "native": the native CPU kernels ran
    return [
        dict(engine=f"llamay {label}", weight_form=form, **{k: r.as_dict()[k] for k in keep})
        for r in results
    ]


def read_bandwidth(threads: int, mib: int = 512, reps: int = 5) -> float:
    """Bytes/s read by `threads` threads summing disjoint parts of a `mib` MiB buffer
    (numpy releases the GIL in its reductions; `max` reads fastest of them), best of
    `reps`."""
    import numpy as np

    buf = np.ones(mib * (1 << 20) // 4, np.float32)
    parts = np.array_split(buf, threads)
    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(np.max, parts))  # pages touched, threads started
        for _ in range(reps):
            t = time.perf_counter()
            list(pool.map(np.max, parts))
            best = min(best, time.perf_counter() - t)
    return buf.nbytes / best


def weight_bytes_per_token(path: Path) -> int:
    """Bytes of weights one decode step reads: every matrix of the file, the embedding
    only where it is the (tied) LM head; 1-D tensors (norms, biases) too."""
    from llamay.gguf import open_gguf

    tensors = open_gguf(path).tensors
    tied = "output.weight" not in tensors
    return sum(t.nbytes for name, t in tensors.items() if tied or name != "token_embd.weight")


def cell(v: float | None, width: int) -> str:
    return f"{v:>{width}.2f}" if v is not None else " " * (width - 1) + "-"


def summarise(rows: list[dict]) -> dict:
    """(model, test, batch) -> {engine: median tokens/s over rounds}."""
    out: dict = {}
    for r in rows:
        key = (r["model"], r["test"], r["batch"])
        out.setdefault(key, {}).setdefault(r["engine"], []).append(r["tokens_per_s"])
    return {k: {e: statistics.median(v) for e, v in d.items()} for k, d in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=MODELS, help="store names or .gguf paths")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--label", default="run")
    ap.add_argument("--pp", type=int, default=128, help="prompt tokens")
    ap.add_argument("--tg", type=int, default=128, help="generated tokens")
    ap.add_argument("--batches", default="1,8", help="tg batch sizes, comma-separated")
    depth_help = "tokens in each sequence's cache before a test (llama-bench's -d)"
    ap.add_argument("--depth", type=int, default=0, help=depth_help)
    ap.add_argument("--numerics", default="exact,llamacpp", help="llamay's, comma-separated")
    ap.add_argument("--skip-llamacpp", action="store_true")
    ap.add_argument("--no-passive-row", action="store_true",
                    help="leave out the llama.cpp OMP_WAIT_POLICY=PASSIVE row")  # fmt: skip
    args = ap.parse_args()

    rows: list[dict] = []
    loads = [os.getloadavg()]
    bandwidth = read_bandwidth(args.threads)
    print(f"# read bandwidth ({args.threads} threads): {bandwidth / 1e9:.2f} GB/s", flush=True)

    def add(results: list[dict], name: str) -> None:
        for r in results:
            rows.append(r | {"model": name})
            print("# " + json.dumps(rows[-1]), flush=True)  # partial results as they come
        loads.append(os.getloadavg())

    per_token = {}
    for name in args.models.split(","):
        path = model_path(name)
        per_token[name] = weight_bytes_per_token(path)
        for _ in range(args.rounds):
            if not args.skip_llamacpp:
                shape = dict(batches=args.batches, depth=args.depth)
                add(run_llamacpp(path, args.threads, args.reps, args.pp, args.tg, **shape), name)
                if not args.no_passive_row:
                    opts = dict(shape, omp_wait="PASSIVE")
                    add(run_llamacpp(path, args.threads, args.reps, args.pp, args.tg, **opts), name)
            for numerics in args.numerics.split(","):
                add(run_llamay(path, name, args.reps, args.pp, args.tg, numerics, args.batches,
                               args.depth), name)  # fmt: skip
    loads.append(os.getloadavg())
    import jax

    meta = dict(
        label=args.label,
        time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        threads=args.threads,
        reps=args.reps,
        rounds=args.rounds,
        cpus=os.cpu_count(),
        jax=jax.__version__,
        load_averages=[[round(v, 2) for v in la] for la in loads],
        read_bandwidth_gb_s=round(bandwidth / 1e9, 2),
        weight_bytes_per_token=per_token,
    )
    print(f"# {meta['time']}  load averages (1/5/15 min) during the run: {meta['load_averages']}")
    print(f"# read bandwidth {meta['read_bandwidth_gb_s']} GB/s; weight bytes per token: "
          + ", ".join(f"{m} {b / 1e6:.1f} MB (bound {bandwidth / b:.0f} tok/s)"
                      for m, b in per_token.items()))  # fmt: skip
    print(f"| {'model':<14} | {'test':>6} | {'batch':>5} | {'engine':<17} | {'t/s':>9} "
          f"| {'vs llama.cpp':>12} | {'% of bound':>10} |")  # fmt: skip
    print("|" + "|".join("-" * w for w in (16, 8, 7, 19, 11, 14, 12)) + "|")
    table = []
    for (model, test, batch), by in summarise(rows).items():
        base = by.get("llama.cpp")
        for engine, rate in sorted(by.items()):
            ratio = rate / base if base and engine != "llama.cpp" else None
            bound = bandwidth / per_token[model]
            # the weights' bound; at a depth the cache's reads (per engine) dominate instead
            tg1 = test.startswith("tg") and batch == 1 and " @ d" not in test
            share = 100 * rate / bound if tg1 else None
            table.append(
                dict(
                    model=model, test=test, batch=batch, engine=engine, tokens_per_s=rate,
                    vs_llamacpp=None if ratio is None else round(ratio, 3),
                    percent_of_bandwidth_bound=None if share is None else round(share, 1),
                )
            )  # fmt: skip
            print(f"| {model:<14} | {test:>6} | {batch:>5} | {engine:<17} | {cell(rate, 9)} "
                  f"| {cell(ratio, 12)} | {cell(share, 10)} |")  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M", time.gmtime())
    out = RESULTS / f"llamacpp-{args.label}-{stamp}.json"
    out.write_text(json.dumps(dict(meta=meta, summary=table, runs=rows), indent=1) + "\n")
    print(f"# wrote {out}")


if __name__ == "__main__":
    main()
