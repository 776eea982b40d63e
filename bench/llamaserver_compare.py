"""`llamay serve` against llama.cpp's `llama-server -np N` on the same GGUF (issues 5, 18).

    .venv/bin/python -m bench.llamaserver_compare [--model smollm2:135m] [--streams 1,4,8,16]
        [--tokens 64] [--prefix 2000] [--reps 2] [--quick] [--no-prime] [--label quiet]
        [--engines llama-server,llama-server-passive,llamay]
        [--resume bench/results/llamaserver-<time>.json] [--llama-server PATH] [--dry-run]

    # the lead's end-of-session run, on a quiet machine (about 15-25 min with a primed
    # program cache; `--quick`: N = 1 and 8, 32 tokens, one rep, a 1,000-token prefix)
    .venv/bin/python -m bench.llamaserver_compare --label quiet

HTTP against HTTP: both servers run as their own processes on a free loopback port and this
process drives them with one client (httpx, asyncio) over the same API, llama.cpp's
`POST /completion` (llamay serves it too), streamed, with the same token-id prompts, greedy
(`temperature` 0, `top_k` 1), `n_predict` fixed and `ignore_eos` so both generate exactly
as many tokens. llamay's engine alone (`bench/batch.py`) would leave out the HTTP, JSON and
detokenisation work that llama-server's numbers include.

- `prime` (llamay, before anything is timed, unless `--no-prime`): each N's llamay server
  started once and stopped when fully ready (`/health` `{"status": "ok"}`, nothing
  warming), so its step programs are in the program cache (`$LLAMAY_CACHE/programs`) and
  the timed servers read them back in seconds (`prime_ready_s`: that start's readiness,
  minutes on a fresh cache). As `llamay warmup` before `llamay serve`.
- `fresh` N (first on every server, once `/health` is 200): `ready_s`, the seconds from the
  server's start until it is ready with nothing warming (llamay: loading and priming its
  programs), `serving_s` its first 200 (llamay serves from there on while the rest
  builds: `llamay.serve.readiness`; llama-server: equal to `ready_s`), and
  `first_request_s`, one 8-token prompt + 4 tokens, end to end.
- `ttft` (on the N = 1 servers, before anything else but `fresh`): a `--prefix`-token prompt +
  8 tokens (uncached), then the same prefix + 8 other tokens (cached: llama-server's
  `cache_prompt` slot reuse, llamay's prefix cache); the first such pair is the fresh
  server's first miss and first hit (`first_miss_s`, `first_hit_s`), the medians
  (`ttft_uncached_s`, `ttft_cached_s`) are over the `--reps` pairs after it;
  `cached_tokens` is each server's own count of reused tokens.
- `decode` N: N concurrent streams with distinct 8-token prompts, `--tokens` tokens each,
  after the same workload once on other prompts; `decode_tok_s` = Σ(tokens − 1) over the
  streams / (last token − first first token), `ttft_p50_s` / `ttft_p99_s` the median and
  99th percentile of the time to a stream's first event (over every stream of every rep);
  medians over `--reps`.

Each (engine, N) gets its own server: `llama-server -m GGUF -np N -c N*ctx -t 2 -tb 2` at
its defaults (`llama-server`), and again with `OMP_WAIT_POLICY=PASSIVE`
(`llama-server-passive`: spinning OpenMP threads collapse on a shared CPU, as
bench/llamacpp_compare.py found; a second, labelled row, never the reference), and
`llamay serve -m GGUF --parallel N --ctx ctx` (exact numerics, what `llamay serve` runs),
ctx = prefix + tokens + 64 per sequence on the servers that measure TTFT (N = 1), else
8 + tokens + 64, the decode prompts' (a llamay server primes a program per page-table
width its context allows: far fewer to build at N > 1, and both engines' decode attends
over the positions in use, not the whole context). The engines take turns per N; ratios
are llamay / llama-server at its defaults.
Rows are saved after each measurement to bench/results/llamaserver-<time>.json; `--resume`
that file to skip what it already holds (same model, tokens, prefix). `--dry-run` drives two
fake llama.cpp-style servers (`--fake-server`, fixed per-token sleeps) instead: the whole
pipeline without either engine, for tests.

Building llama-server once (never a llamay dependency): `bench/build_llamacpp.sh`, or by hand
(about 25 min on 2 cores). The sources
are llama.cpp as vendored in llama-cpp-python 0.3.36's source release (`pip download
--no-deps --no-binary :all: llama-cpp-python==0.3.36`):

    mkdir -p ~/.cache/llamay/llama-server && cd ~/.cache/llamay/llama-server
    tar xzf llama_cpp_python-0.3.36.tar.gz
    cmake -S llama_cpp_python-0.3.36/vendor/llama.cpp -B build -G Ninja \\
        -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \\
        -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \\
        -DBUILD_SHARED_LIBS=OFF
    nice -n 5 cmake --build build --target llama-server -j2

(`LLAMA_USE_PREBUILT_UI=OFF`: no web UI download; the server runs without one.) The binary,
build/bin/llama-server, is found there or via `--llama-server` / `$LLAMA_SERVER`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_BINARY = Path.home() / ".cache" / "llamay" / "llama-server" / "build" / "bin"
ENGINES = ("llama-server", "llama-server-passive", "llamay")
PROMPT_TOKENS = 8  # the decode prompts and the tails after the TTFT prefix
METRICS = {
    "prime": ("prime_ready_s",),
    "fresh": ("serving_s", "ready_s", "first_request_s"),
    "ttft": ("first_miss_s", "first_hit_s", "ttft_uncached_s", "ttft_cached_s"),
    "decode": ("decode_tok_s", "ttft_p50_s", "ttft_p99_s"),
}


def llama_server_binary(given: str | None = None) -> Path | None:
    """`given`, `$LLAMA_SERVER`, the build directory of the docstring, or PATH's."""
    for candidate in (given, os.environ.get("LLAMA_SERVER"), DEFAULT_BINARY / "llama-server"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    found = shutil.which("llama-server")
    return Path(found) if found else None


# --- measuring one stream ----------------------------------------------------------------


@dataclass
class Stream:
    """One streamed completion as the client saw it (perf_counter seconds)."""

    t_start: float
    t_first: float
    t_end: float
    tokens: int
    cached_tokens: int

    @property
    def ttft(self) -> float:
        return self.t_first - self.t_start


def parse_event(line: str) -> dict | None:
    """The JSON of one server-sent `data:` line; None for other lines."""
    if not line.startswith("data: ") or line.strip() == "data: [DONE]":
        return None
    return json.loads(line[6:])


def cached_tokens(final: dict) -> int:
    """Prompt tokens the server reused: `timings.cache_n`, in both servers' final events
    (their `tokens_cached` counts the whole slot: the prompt and the tokens generated)."""
    return int((final.get("timings") or {}).get("cache_n", 0))


async def complete(client, prompt: list[int], n_predict: int) -> Stream:
    """One streamed, greedy completion of exactly `n_predict` tokens."""
    body = {
        "prompt": prompt,
        "n_predict": n_predict,
        "ignore_eos": True,
        "stream": True,
        "temperature": 0.0,
        "top_k": 1,
        "seed": 0,
        "cache_prompt": True,
    }
    t_start = time.perf_counter()
    t_first = final = None
    async with client.stream("POST", "/completion", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"/completion: HTTP {r.status_code}: {(await r.aread())[:500]!r}")
        async for line in r.aiter_lines():
            ev = parse_event(line)
            if ev is None:
                continue
            if "error" in ev:
                raise RuntimeError(f"/completion streamed an error: {ev['error']}")
            now = time.perf_counter()
            if ev.get("stop"):
                final, t_end = ev, now
            elif t_first is None:
                t_first = now
    if final is None:
        raise RuntimeError("/completion stream ended without its final event")
    return Stream(
        t_start, t_first or t_end, t_end, int(final["tokens_predicted"]), cached_tokens(final)
    )


# --- aggregates ----------------------------------------------------------------------------


def decode_tok_s(streams: list[Stream]) -> float:
    """Aggregate decode rate: the tokens after each stream's first, over the span from the
    earliest first token to the last token of all."""
    span = max(s.t_end for s in streams) - min(s.t_first for s in streams)
    return sum(s.tokens - 1 for s in streams) / span


def e2e_tok_s(streams: list[Stream]) -> float:
    """All generated tokens over the wall time from the first request to the last token."""
    return sum(s.tokens for s in streams) / (
        max(s.t_end for s in streams) - min(s.t_start for s in streams)
    )


def http_client(url: str):
    """A fresh connection per request: llama-server may close a kept-alive connection after
    a streamed response just as the client reuses it ("Server disconnected without sending
    a response"); both servers get the same treatment."""
    import httpx

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    return httpx.AsyncClient(base_url=url, timeout=3600, limits=limits)


async def measure_decode(url: str, prompts, warm_prompts, tokens: int, reps: int) -> dict:
    async with http_client(url) as client:

        async def batch(ps):
            return await asyncio.gather(*(complete(client, p, tokens) for p in ps))

        await batch(warm_prompts)
        runs = [await batch(prompts) for _ in range(reps)]
    counts = sorted({s.tokens for run in runs for s in run})
    ttfts = [s.ttft for r in runs for s in r]
    return {
        "decode_tok_s": round(statistics.median(decode_tok_s(r) for r in runs), 2),
        "e2e_tok_s": round(statistics.median(e2e_tok_s(r) for r in runs), 2),
        "ttft_p50_s": round(statistics.median(ttfts), 4),
        "ttft_p99_s": round(percentile(ttfts, 99), 4),
        "decode_tok_s_runs": [round(decode_tok_s(r), 2) for r in runs],
        "ttft_p50_s_runs": [round(statistics.median(s.ttft for s in r), 4) for r in runs],
        "tokens_per_stream": counts,
    }


def percentile(xs: list[float], q: float) -> float:
    """The q-th percentile, linear between the closest ranks (numpy's default)."""
    xs = sorted(xs)
    at = (len(xs) - 1) * q / 100
    lo = int(at)
    return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (at - lo)


async def measure_fresh(url: str, prompt: list[int], ready: tuple[float, float]) -> dict:
    """A fresh server's first request, end to end (nothing sent to it before); `ready`:
    (its first /health 200, its readiness with nothing warming), seconds from its start."""
    async with http_client(url) as client:
        first = await complete(client, prompt, 4)
    return {
        "serving_s": round(ready[0], 3),
        "ready_s": round(ready[1], 3),
        "first_request_s": round(first.t_end - first.t_start, 4),
        "first_request_ttft_s": round(first.ttft, 4),
    }


async def measure_ttft(url: str, prefixes, tails, n_predict: int) -> dict:
    """prefixes[0]: the fresh server's first miss and first hit; the rest are timed, one
    rep each."""
    out: dict[str, list] = {k: [] for k in ("uncached", "cached", "cached_tokens")}
    first: dict[str, float] = {}
    async with http_client(url) as client:
        for i, prefix in enumerate(prefixes):
            cold = await complete(client, prefix + tails[0], n_predict)
            warm = await complete(client, prefix + tails[1], n_predict)
            if i:
                out["uncached"].append(cold.ttft)
                out["cached"].append(warm.ttft)
                out["cached_tokens"].append(warm.cached_tokens)
            else:
                first = {"first_miss_s": round(cold.ttft, 4), "first_hit_s": round(warm.ttft, 4)}
    return {
        **first,
        "ttft_uncached_s": round(statistics.median(out["uncached"]), 4),
        "ttft_cached_s": round(statistics.median(out["cached"]), 4),
        "ttft_uncached_runs": [round(t, 4) for t in out["uncached"]],
        "ttft_cached_runs": [round(t, 4) for t in out["cached"]],
        "cached_tokens": out["cached_tokens"],
    }


# --- servers -------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def context(args, n: int) -> int:
    """Positions per sequence on the N = n servers (the docstring: only those measuring
    TTFT hold the prefix)."""
    return max(args.prefix if n == 1 else 0, PROMPT_TOKENS) + args.tokens + 64


def server_command(engine: str, args, model: Path, n: int, port: int) -> list[str]:
    ctx = context(args, n)
    if args.dry_run:  # llama-server's fake decodes faster, so the ratio differs from 1
        ms = {"llama-server": "2", "llama-server-passive": "3", "llamay": "4"}[engine]
        fake = ["--fake-server", str(port), "--fake-token-ms", ms]
        return [sys.executable, "-m", "bench.llamaserver_compare", *fake]
    if engine.startswith("llama-server"):
        binary = llama_server_binary(args.llama_server)
        if binary is None:
            sys.exit("no llama-server binary: build it as this script's docstring says")
        t = str(args.threads)
        return [str(binary), "-m", str(model), "-np", str(n), "-c", str(n * ctx), "-t", t,
                "-tb", t, "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    llamay = Path(sys.executable).with_name("llamay")
    return [str(llamay), "serve", "-m", f"bench={model}", "--no-store", "--port", str(port),
            "--parallel", str(n), "--ctx", str(ctx), "--keep-alive", "-1"]  # fmt: skip


def server_env(engine: str, sources: Path | None = None) -> dict:
    """llama-server at its defaults (no OMP_WAIT_POLICY, whatever the caller's), or with
    PASSIVE; llamay's environment as given, running the copy of its sources in `sources`
    (`snapshot`) when given."""
    env = dict(os.environ)
    if engine == "llamay" and sources is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(sources), env.get("PYTHONPATH")]))
    if engine.startswith("llama-server"):
        env.pop("OMP_WAIT_POLICY", None)
        if engine == "llama-server-passive":
            env["OMP_WAIT_POLICY"] = "PASSIVE"
    return env


def snapshot(into: Path) -> Path:
    """A copy of llamay's sources under `into`, which every llamay server of the run
    imports: its programs are keyed by those sources (`llamay.engine.programs`), so the
    timed servers read back what the priming ones built even if the checkout is edited
    meanwhile."""
    repo = Path(__file__).resolve().parents[1]
    shutil.copytree(repo / "llamay", into / "llamay", ignore=shutil.ignore_patterns("__pycache__"))
    return into


@contextlib.contextmanager
def running(cmd: list[str], port: int, env: dict, log: Path, timeout: float = 3600):
    """Start `cmd` (its own process group), wait until GET /health says it is ready with
    nothing warming, yield its URL and (seconds to its first 200, seconds to that): a
    warming-up llamay answers 503 while it loads, then 200 with a "warming" field while
    the rest of its programs build (`llamay.serve.readiness`)."""
    import httpx

    url = f"http://127.0.0.1:{port}"
    t0 = time.perf_counter()
    cwd = Path(__file__).resolve().parents[1]
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + timeout
        serving = None
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{cmd[0]} exited ({proc.returncode}):\n{log.read_text()[-3000:]}"
                )
            with contextlib.suppress(httpx.HTTPError, ValueError):
                r = httpx.get(url + "/health", timeout=5)
                if r.status_code == 200:
                    serving = serving or time.perf_counter() - t0
                    if "warming" not in r.json():
                        break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{cmd[0]} not ready after {timeout} s")
            time.sleep(0.3)
        yield url, (serving, time.perf_counter() - t0)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()


# --- the fake server (dry runs and tests) --------------------------------------------------


def fake_server(port: int, token_ms: float, prompt_ms: float = 0.2) -> None:
    """A llama.cpp-style `/completion` server that sleeps instead of computing: `prompt_ms`
    per prompt token not shared with an earlier prompt, then `token_ms` per token."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[list[int]] = []

    def common(a: list[int], b: list[int]) -> int:
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):  # quiet
            pass

        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
            self.wfile.write(b'{"status": "ok"}')

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            prompt, n = body["prompt"], body["n_predict"]
            hit = max((common(prompt, p) for p in seen), default=0)
            hit = min(hit, len(prompt) - 1)
            seen.append(prompt)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()

            def send(ev: dict) -> None:
                self.wfile.write(f"data: {json.dumps(ev)}\n\n".encode())
                self.wfile.flush()

            time.sleep(prompt_ms * (len(prompt) - hit) / 1e3)
            for _ in range(n):
                send({"content": "x", "stop": False})
                time.sleep(token_ms / 1e3)
            send({"content": "", "stop": True, "tokens_predicted": n,
                  "timings": {"cache_n": hit, "prompt_n": len(prompt) - hit}})  # fmt: skip

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


# --- the run -------------------------------------------------------------------------------


def normal_token_ids(model: Path | None) -> list[int]:
    """Ids of the model's ordinary tokens (no control/special ones), for random prompts."""
    if model is None:
        return list(range(100, 30000))
    from llamay.gguf import open_gguf

    with open_gguf(model) as f:
        kinds = f.metadata.get("tokenizer.ggml.token_type")
        n = len(f.metadata["tokenizer.ggml.tokens"])
    return [i for i in range(n) if kinds is None or int(kinds[i]) == 1]


def plan(streams: list[int], ttft: bool) -> list[tuple[int, list[str]]]:
    """(server slots, measurements on that server, in order): every server's first
    request, TTFT on the N = 1 servers while they are fresh, then decode."""
    out = [(n, ["fresh"] + (["ttft"] if ttft and n == 1 else []) + ["decode"]) for n in streams]
    if ttft and 1 not in streams:
        out.insert(0, (1, ["fresh", "ttft"]))
    return out


def summarise(rows: list[dict]) -> list[dict]:
    """One line per (measurement, N): both engines' numbers and llamay / llama-server."""
    by: dict = {}
    for r in rows:
        by.setdefault((r["kind"], r["streams"]), {})[r["engine"]] = r
    out = []
    order = list(METRICS)
    for (kind, n), engines in sorted(by.items(), key=lambda kv: (order.index(kv[0][0]), kv[0])):
        keys = METRICS[kind]
        line: dict = {"kind": kind, "streams": n}
        for k in keys:
            got = {e: engines.get(e, {}).get(k) for e in ENGINES}
            a, b = got["llamay"], got["llama-server"]
            line[k] = {**got, "ratio": round(a / b, 3) if a and b else None}
        line["load"] = {e: r["loadavg"] for e, r in engines.items()}
        out.append(line)
    return out


def table(summary: list[dict]) -> str:
    def fmt(v) -> str:
        return "-" if v is None else f"{v:g}"

    lines = ["| test | N | metric | llamay | llama-server | llama-server (PASSIVE) "
             "| llamay / llama-server |",
             "|---|---:|---|---:|---:|---:|---:|"]  # fmt: skip
    for s in summary:
        for k, v in s.items():
            if isinstance(v, dict) and "ratio" in v:
                cells = (fmt(v["llamay"]), fmt(v["llama-server"]),
                         fmt(v["llama-server-passive"]), fmt(v["ratio"]))  # fmt: skip
                lines.append(f"| {s['kind']} | {s['streams']} | {k} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2:135m", help="store name or .gguf path")
    ap.add_argument("--streams", default="1,4,8,16")
    ap.add_argument("--tokens", type=int, default=64, help="generated tokens per stream")
    ap.add_argument("--prefix", type=int, default=2000, help="TTFT prefix tokens (0: no TTFT)")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument(
        "--quick",
        action="store_true",
        help="N = 1 and 8, 32 tokens, 1 rep, a 1000-token prefix (unless given)",
    )
    ap.add_argument(
        "--no-prime",
        dest="prime",
        action="store_false",
        help="do not start each llamay server once first to fill its program cache",
    )
    ap.add_argument("--label", default="", help="in the results file's name and the table")
    ap.add_argument("--threads", type=int, default=2, help="llama-server -t/-tb")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--llama-server", default=None, help="the binary (default: see docstring)")
    ap.add_argument("--resume", type=Path, default=None, help="a results file to continue")
    ap.add_argument("--out-dir", type=Path, default=RESULTS)
    ap.add_argument("--dry-run", action="store_true", help="fake servers, no engines")
    ap.add_argument("--fake-server", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--fake-token-ms", type=float, default=2.0, help=argparse.SUPPRESS)
    given = set(argv if argv is not None else sys.argv[1:])
    args = ap.parse_args(argv)
    if args.quick:  # what was not given explicitly
        for flag, name, value in (("--streams", "streams", "1,8"), ("--tokens", "tokens", 32),
                                  ("--reps", "reps", 1), ("--prefix", "prefix", 1000)):  # fmt: skip
            if not any(g == flag or g.startswith(flag + "=") for g in given):
                setattr(args, name, value)
    if args.fake_server is not None:
        fake_server(args.fake_server, args.fake_token_ms)
        return {}

    import numpy as np

    engines = [e for e in args.engines.split(",") if e]
    if unknown := set(engines) - set(ENGINES):
        sys.exit(f"--engines: unknown {sorted(unknown)} (known: {', '.join(ENGINES)})")
    model = None
    if not args.dry_run:
        from bench.llamacpp_compare import model_path

        model = model_path(args.model)
    params = {"model": args.model, "tokens": args.tokens, "prefix": args.prefix,
              "reps": args.reps, "threads": args.threads, "dry_run": args.dry_run}  # fmt: skip
    if args.resume:
        path, doc = args.resume, json.loads(args.resume.read_text())
        if doc["params"] != params:
            sys.exit(f"{path} was run with {doc['params']}, not {params}")
    else:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        label = f"{args.label}-" if args.label else ""
        stamp = time.strftime("%Y%m%dT%H%M", time.gmtime())
        path = args.out_dir / f"llamaserver-{label}{stamp}.json"
        doc = {"params": params, "rows": []}
    binary = llama_server_binary(args.llama_server)
    if binary and not args.dry_run:
        version = subprocess.run([str(binary), "--version"], capture_output=True, text=True)
        doc["llama_server_version"] = (version.stdout + version.stderr).strip().splitlines()[-2:]
    doc["model_path"] = str(model)
    doc["label"] = args.label
    done = {(r["engine"], r["kind"], r["streams"]) for r in doc["rows"]}

    vocab = normal_token_ids(model)

    def prompts(seed: tuple, count: int, length: int = PROMPT_TOKENS) -> list[list[int]]:
        # seeded per use: the same prompts for both engines, in every (resumed) run
        rng = np.random.default_rng(seed)
        return [[vocab[i] for i in rng.integers(0, len(vocab), length)] for _ in range(count)]

    logs = Path(tempfile.mkdtemp(prefix="llamaserver-bench-"))
    streams = [int(s) for s in args.streams.split(",")]
    sources = snapshot(logs / "sources") if "llamay" in engines and not args.dry_run else None
    if args.prime and "llamay" in engines:
        for n in sorted({n for n, _ in plan(streams, args.prefix > 0)}):
            if ("llamay", "prime", n) in done:
                continue
            port = free_port()
            cmd = server_command("llamay", args, model, n, port)
            load0 = os.getloadavg()
            with running(cmd, port, server_env("llamay", sources), logs / f"prime-{n}.log") as (
                _,
                ready,
            ):
                pass
            row = {"engine": "llamay", "kind": "prime", "streams": n,
                   "prime_ready_s": round(ready[1], 3)}  # fmt: skip
            row["loadavg"] = [round(v, 2) for v in (*load0, *os.getloadavg())]
            row["time"] = time.strftime("%H:%M:%S", time.gmtime())
            doc["rows"].append(row)
            path.write_text(json.dumps(doc, indent=1) + "\n")
            print("# " + json.dumps(row), flush=True)
    for n, kinds in plan(streams, args.prefix > 0):
        work = {
            "fresh": prompts((n, 4), 1)[0],
            "decode": (prompts((n, 0), n), prompts((n, 1), n)),  # timed, warm-up
            "ttft": (prompts((0, 2), args.reps + 1, args.prefix), prompts((0, 3), 2)),
        }
        for engine in engines:
            todo = [k for k in kinds if (engine, k, n) not in done]
            if not todo:
                continue
            port = free_port()
            cmd = server_command(engine, args, model, n, port)
            env = server_env(engine, sources)
            with running(cmd, port, env, logs / f"{engine}-{n}.log") as (
                url,
                ready,
            ):
                for kind in todo:
                    load0 = os.getloadavg()
                    if kind == "fresh":
                        coro = measure_fresh(url, work[kind], ready)
                    elif kind == "decode":
                        coro = measure_decode(url, *work[kind], args.tokens, args.reps)
                    else:
                        coro = measure_ttft(url, *work[kind], n_predict=4)
                    row = {"engine": engine, "kind": kind, "streams": n, **asyncio.run(coro)}
                    # uptime's 1/5/15-minute load averages before and after
                    row["loadavg"] = [round(v, 2) for v in (*load0, *os.getloadavg())]
                    row["time"] = time.strftime("%H:%M:%S", time.gmtime())
                    row["command"] = " ".join(cmd)
                    doc["rows"].append(row)
                    path.write_text(json.dumps(doc, indent=1) + "\n")
                    print("# " + json.dumps(row), flush=True)
    doc["summary"] = summarise(doc["rows"])
    path.write_text(json.dumps(doc, indent=1) + "\n")
    load = [round(v, 2) for v in os.getloadavg()]
    label = args.label or "unlabelled"
    print(f"# {label}: load average {load} at the end (each row's is in the file)")
    print(table(doc["summary"]))
    print(f"# wrote {path} (server logs in {logs})")
    return doc


if __name__ == "__main__":
    main()
