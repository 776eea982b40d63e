"""Attack campaign against `llamay.load` and `llamay serve` (issue 22's closing figures).

    .venv/bin/python -m bench.hardening [--phases gguf,schema,malformed,storm]
        [--mutations 500] [--schema-examples 20] [--storm-clients 16] [--storm-s 60]
        [--phase-s 300] [--seed 0] [--out FILE.jsonl]

Phases, each capped at `--phase-s` seconds (it stops by itself, loopback only):
1. gguf: seeded mutations of the tiny llama model (byte flips, truncations, overwritten
   counts, type codes, offsets, string lengths, dims, hyperparameters) loaded by
   `llamay.load` in a child process per batch under an address-space cap; each outcome is
   a clean refusal (a `LlamayError`), a load that worked (then one greedy token), another
   exception (a bug), a signal (a crash) or a hang.
2. schema: schemathesis over the server's /openapi.json, check `not_a_server_error`.
3. malformed: hostile bodies on each generation API while 4 victim streams run; each
   victim must equal its solo output.
4. storm: clients that drop streaming and non-streaming requests part way; afterwards the
   KV pages in use return to their baseline, /health answers, SIGTERM exits in seconds.
Prints one JSON line per finding and a summary line per phase (also to `--out`).
No assertions: figures for the closing note.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.tiny_models import tiny_model

MODEL = "tiny"
OUT: list = []


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)
    OUT.append(record)


# --- phase 1: corrupted GGUFs -------------------------------------------------------

# GGUF value type code -> fixed size (8: string, 9: array handled apart)
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_INT_FMT = {4: "<I", 5: "<i", 10: "<Q", 11: "<q"}


def gguf_fields(data: bytes) -> dict[str, list]:
    """Byte positions of the header's fields, walked by hand (independent of llamay's parser):
    kind -> [(offset, size, detail)]."""
    f: dict[str, list] = {k: [] for k in ("count", "type", "strlen", "offset", "dim", "int")}
    f["count"] += [(8, 8, "n_tensors"), (16, 8, "n_kv")]
    n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)
    pos = 24

    def string(pos: int) -> tuple[int, str]:
        (n,) = struct.unpack_from("<Q", data, pos)
        f["strlen"].append((pos, 8, "len"))
        return pos + 8 + n, data[pos + 8 : pos + 8 + n].decode("utf-8", "replace")

    for _ in range(n_kv):
        pos, key = string(pos)
        (vt,) = struct.unpack_from("<I", data, pos)
        f["type"].append((pos, 4, f"kv {key}"))
        pos += 4
        if vt == 8:
            pos, _ = string(pos)
        elif vt == 9:
            (et, n) = struct.unpack_from("<IQ", data, pos)
            f["type"].append((pos, 4, f"array {key}"))
            f["count"].append((pos + 4, 8, f"array {key}"))
            pos += 12
            for _ in range(n):
                if et == 8:
                    (sn,) = struct.unpack_from("<Q", data, pos)
                    pos += 8 + sn
                else:
                    pos += _FIXED[et]
        else:
            if vt in _INT_FMT:
                f["int"].append((pos, struct.calcsize(_INT_FMT[vt]), key))
            pos += _FIXED[vt]
    for _ in range(n_tensors):
        pos, _name = string(pos)
        (nd,) = struct.unpack_from("<I", data, pos)
        f["count"].append((pos, 4, "n_dims"))
        pos += 4
        for _ in range(nd):
            f["dim"].append((pos, 8, "dim"))
            pos += 8
        f["type"].append((pos, 4, "tensor type"))
        f["offset"].append((pos + 4, 8, "tensor offset"))
        pos += 12
    f["header_end"] = [(pos, 0, "")]
    return f


_HOSTILE = [
    0,
    1,
    2,
    3,
    7,
    2**16 + 1,
    2**31 - 1,
    2**31,
    2**32 - 1,
    2**32,
    2**40,
    2**63 - 1,
    2**64 - 1,
]


def mutate(data: bytes, fields: dict, rng: random.Random) -> tuple[bytes, str]:
    """One seeded mutation of `data` and a description of it."""
    b = bytearray(data)
    header_end = fields["header_end"][0][0]
    kind = rng.choice(
        ["flip_header", "flip_any", "truncate", "count", "type", "strlen", "offset", "dim", "int"]
    )
    if kind in ("flip_header", "flip_any"):
        span = header_end if kind == "flip_header" else len(b)
        at = [rng.randrange(span) for _ in range(rng.choice([1, 2, 8]))]
        for i in at:
            b[i] ^= 1 << rng.randrange(8)
        return bytes(b), f"{kind} at {at[:4]}"
    if kind == "truncate":
        n = rng.choice([rng.randrange(header_end), rng.randrange(header_end, len(b))])
        return bytes(b[:n]), f"truncate to {n}"
    off, size, what = rng.choice(fields[kind])
    if kind == "type":
        v = (
            rng.choice([7, 8, 9, 13, 14, 40, 41, 200, 2**31, 2**32 - 1])
            if "kv" in what or "array" in what
            else rng.choice([4, 5, 22, 23, 29, 36, 39, 41, 100, 2**32 - 1])
        )
    elif kind == "int":
        v = rng.choice([0, 1, 3, 5, 2**31 - 1, 2**32 - 1, 2**31]) % (1 << (8 * size))
    else:
        old = int.from_bytes(b[off : off + size], "little")
        v = rng.choice(_HOSTILE + [old + 1, max(old - 1, 0), old * 2]) % (1 << (8 * size))
    b[off : off + size] = v.to_bytes(size, "little")
    return bytes(b), f"{kind} {what}@{off} = {v}"


_CHILD = r"""
import json, resource, sys, traceback
cap = int(sys.argv[1]) << 20
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
import llamay
from llamay.errors import LlamayError
for line in sys.stdin:
    path = line.strip()
    print(json.dumps({"start": path}), flush=True)
    rec = {"path": path}
    try:
        m = llamay.load(path, progress=False)
        try:
            m.generate("Hello", max_tokens=1, temperature=0.0)
            rec["outcome"] = "loaded"
        except LlamayError as e:
            rec.update(outcome="refused_at_generate", error=type(e).__name__, msg=str(e)[:200])
        del m
    except LlamayError as e:
        rec.update(outcome="refused", error=type(e).__name__, msg=str(e)[:200])
    except BaseException as e:
        tb = traceback.extract_tb(e.__traceback__)[-1]
        rec.update(outcome="bug", error=type(e).__name__, msg=str(e)[:200],
                   where=f"{tb.filename}:{tb.lineno}")
    print(json.dumps(rec), flush=True)
"""


def phase_gguf(args) -> dict:
    t0 = time.monotonic()
    src = tiny_model("llama").read_bytes()
    fields = gguf_fields(src)
    rng = random.Random(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="llamay-hardening-gguf-"))
    cases = []
    for i in range(args.mutations):
        data, what = mutate(src, fields, rng)
        p = tmp / f"m{i:04d}.gguf"
        p.write_bytes(data)
        cases.append((str(p), what))
    desc = dict(cases)
    counts: dict[str, int] = {}
    errors: dict[str, int] = {}
    todo = [p for p, _ in cases]
    tried = 0
    while todo and time.monotonic() - t0 < args.phase_s:
        batch, todo = todo[: args.batch], todo[args.batch :]
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(args.rss_mb)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        child.stdin.write("\n".join(batch) + "\n")
        child.stdin.close()
        started = None
        done = set()
        deadline = time.monotonic() + args.case_s
        import selectors

        sel = selectors.DefaultSelector()
        sel.register(child.stdout, selectors.EVENT_READ)
        while True:
            if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                child.kill()
                child.wait()
                outcome = {"path": started, "outcome": "hang"} if started else None
                break
            line = child.stdout.readline()
            if not line:
                child.wait()
                outcome = None
                if started and started not in done:
                    outcome = {"path": started, "outcome": "crash", "rc": child.returncode}
                break
            rec = json.loads(line)
            if "start" in rec:
                started = rec["start"]
                deadline = time.monotonic() + args.case_s
                continue
            done.add(rec["path"])
            tried += 1
            counts[rec["outcome"]] = counts.get(rec["outcome"], 0) + 1
            if rec.get("error"):
                errors[rec["error"]] = errors.get(rec["error"], 0) + 1
            if rec["outcome"] == "bug":
                emit(
                    {
                        "phase": "gguf",
                        "finding": "non-llamay exception",
                        "mutation": desc[rec["path"]],
                        **rec,
                    }
                )
        if outcome:
            tried += 1
            counts[outcome["outcome"]] = counts.get(outcome["outcome"], 0) + 1
            emit(
                {
                    "phase": "gguf",
                    "finding": outcome["outcome"],
                    "mutation": desc[started],
                    **outcome,
                }
            )
        todo = [p for p in batch if p not in done and p != started] + todo
    for p, _ in cases:
        Path(p).unlink(missing_ok=True)
    tmp.rmdir()
    return {
        "phase": "gguf",
        "cases": tried,
        "of": args.mutations,
        "outcomes": counts,
        "error_types": errors,
        "rss_cap_mb": args.rss_mb,
        "s": round(time.monotonic() - t0, 1),
    }


# --- the server ---------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_LAUNCHER = r"""
import os, sys
from llamay.serve import create_app
from llamay.serve.app import run_server
from llamay.serve.models import Models
models = Models({"tiny": sys.argv[1]}, parallel=int(os.environ["HARDENING_PARALLEL"]),
                use_store=False)
app = create_app(models, max_tokens_limit=256, warm_up=False)
app.state.llamay.extra["allow_local_files"] = False
run_server(app, "127.0.0.1", int(os.environ["HARDENING_PORT"]))
"""


class Server:
    """`llamay serve` on the tiny model in a subprocess with a throwaway store."""

    def __init__(self, args):
        self.home = tempfile.mkdtemp(prefix="llamay-hardening-home-")
        self.log_path = Path(self.home) / "serve.log"
        self.launcher = "cli"
        try:
            self._start(args, self._cli_cmd(args))
        except RuntimeError as e:
            if "exited" not in str(e):
                raise
            # the CLI did not start (a broken checkout): the same app through the same
            # run_server, so SIGTERM and the edge behave as the CLI's would
            emit({"server": "cli failed, python launcher", "error": str(e)[-300:]})
            self.launcher = "python"
            self._start(args, [sys.executable, "-c", _LAUNCHER, str(tiny_model("llama"))])

    def _cli_cmd(self, args) -> list[str]:
        exe = Path(sys.executable).with_name("llamay")
        cmd = [str(exe), "serve", "-m", f"{MODEL}={tiny_model('llama')}", "--no-store"]
        cmd += ["--parallel", str(args.parallel), "--max-tokens", "256"]
        if not args.warmup:  # programs then compile on first use (the warm-up is 140 of them)
            cmd.append("--no-warmup")
        return cmd

    def _start(self, args, cmd: list[str]) -> None:
        import httpx

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, LLAMAY_HOME=self.home, OLLAMA_MODELS=self.home + "/ollama")
        env.update(HARDENING_PORT=str(self.port), HARDENING_PARALLEL=str(args.parallel))
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [*cmd, "--port", str(self.port)] if self.launcher == "cli" else cmd,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        t0 = time.monotonic()
        while time.monotonic() - t0 < args.start_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llamay serve exited {self.proc.returncode}: {self.tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    self.ready_s = round(time.monotonic() - t0, 1)
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.proc.kill()
        raise RuntimeError(f"llamay serve not ready in {args.start_s} s: {self.tail()}")

    def tail(self) -> str:
        self.log.flush()
        return self.log_path.read_text()[-2000:]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def sigterm(self) -> float | None:
        """Seconds from SIGTERM to exit (None: killed after 30 s)."""
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
            return round(time.monotonic() - t0, 2)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None


# --- phase 2: schemathesis ----------------------------------------------------------


def phase_schema(args, server: Server) -> dict:
    t0 = time.monotonic()
    exe = Path(sys.executable).with_name("schemathesis")
    report = Path(server.home) / "schema.ndjson"
    cmd = [str(exe), "run", server.url + "/openapi.json", "--checks", "not_a_server_error"]
    cmd += ["--max-examples", str(args.schema_examples), "--seed", str(args.seed)]
    cmd += ["--request-timeout", "60", "--report", "ndjson", "--report-ndjson-path", str(report)]
    # pulls would leave loopback; the rest (create, delete, copy, blobs) runs on the
    # throwaway store
    cmd += ["--exclude-path-regex", "^/api/pull$", "--suppress-health-check", "all"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.phase_s)
        out, rc = p.stdout, p.returncode
    except subprocess.TimeoutExpired as e:
        out, rc = (
            (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""),
            "timeout",
        )
    cases, failures = _schema_counts(report)
    five = [f for f in failures if "server error" in f.lower() or "5" == f[:1]]
    for f in failures[:20]:
        emit({"phase": "schema", "finding": f})
    tail = "\n".join(out.splitlines()[-12:])
    return {
        "phase": "schema",
        "cases": cases,
        "failures": len(failures),
        "server_errors": len(five),
        "rc": rc,
        "server_alive": server.alive(),
        "tail": tail,
        "s": round(time.monotonic() - t0, 1),
    }


def _schema_counts(report: Path) -> tuple[int, list[str]]:
    """Test cases and failure titles from schemathesis' NDJSON event stream."""
    cases, failures = 0, []
    if not report.exists():
        return 0, []
    for line in report.read_text().splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        for name, body in ev.items():
            if name == "ScenarioFinished" and isinstance(body, dict):
                rec = body.get("recorder", {})
                cases += len(rec.get("cases", {}))
                for checks in rec.get("checks", {}).values():
                    for c in checks:
                        if c.get("status") == "FAILURE" or c.get("status") == "failure":
                            fail = c.get("failure_info") or {}
                            failures.append(
                                f"{c.get('name')}: {str(fail.get('failure', fail))[:300]}"
                            )
    return cases, failures


# --- phase 3: malformed requests with victims ---------------------------------------

GEN_APIS = {
    "openai_chat": (
        "/v1/chat/completions",
        lambda: {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    ),
    "openai_completions": (
        "/v1/completions",
        lambda: {"model": MODEL, "prompt": "hi", "max_tokens": 4},
    ),
    "openai_responses": (
        "/v1/responses",
        lambda: {"model": MODEL, "input": "hi", "max_output_tokens": 16},
    ),
    "anthropic": (
        "/v1/messages",
        lambda: {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    ),
    "ollama_generate": (
        "/api/generate",
        lambda: {"model": MODEL, "prompt": "hi", "stream": False, "options": {"num_predict": 4}},
    ),
    "ollama_chat": (
        "/api/chat",
        lambda: {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "stream": False,
            "options": {"num_predict": 4},
        },
    ),
    "llamacpp": ("/completion", lambda: {"prompt": "hi", "n_predict": 4}),
}
_SAMPLER = [
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "seed",
    "repeat_last_n",
    "repeat_penalty",
    "presence_penalty",
    "frequency_penalty",
    "dry_multiplier",
    "dry_allowed_length",
    "dry_penalty_last_n",
    "min_keep",
    "xtc_threshold",
    "xtc_probability",
    "typical_p",
    "mirostat",
    "n_probs",
    "logprobs",
    "top_logprobs",
    "n",
    "stop",
    "logit_bias",
]
_BAD_VALUES = [2**40, -(2**40), 2**63, 1e308, "NaN", "a", None, [], {"x": [1]}, True, -1]


def hostile_bodies(rng: random.Random) -> list[tuple[str, str, object]]:
    """(api, label, body) rows: every sampler field with every bad value (options{} for
    Ollama, top level elsewhere), plus structural junk."""
    rows = []
    for api, (_, base) in GEN_APIS.items():
        for field in _SAMPLER:
            for v in _BAD_VALUES:
                b = base()
                if v == "NaN":
                    v = float("nan")
                (b.setdefault("options", {}) if api.startswith("ollama") else b)[field] = v
                rows.append((api, f"{field}={v!r}", b))
        for label, patch in [
            (
                "max_tokens huge",
                {"max_tokens": 2**62, "max_output_tokens": 2**62, "n_predict": 2**62},
            ),
            ("max_tokens str", {"max_tokens": "4", "n_predict": "4"}),
            ("model int", {"model": 7}),
            ("model traversal", {"model": "../../etc/passwd"}),
            (
                "messages junk",
                {
                    "messages": [{"role": "user", "content": {"a": [[[]]]}}],
                    "prompt": [[[{}]]],
                    "input": [{"x": 1}],
                },
            ),
            (
                "tool_calls junk",
                {
                    "messages": [
                        {
                            "role": "assistant",
                            "content": None,
                            "tool_calls": [{"function": "notadict"}],
                        },
                        {"role": "user", "content": "hi"},
                    ]
                },
            ),
            (
                "tool_calls args",
                {
                    "messages": [
                        {
                            "role": "assistant",
                            "tool_calls": [
                                {
                                    "id": 1,
                                    "type": "function",
                                    "function": {"name": {}, "arguments": [1]},
                                }
                            ],
                        }
                    ]
                },
            ),
            ("tools junk", {"tools": [{"type": "function", "function": "x"}, 3]}),
            ("grammar huge", {"grammar": "root ::= [a-z]{1000000000}"}),
            (
                "json_schema junk",
                {
                    "response_format": {
                        "type": "json_schema",
                        "json_schema": {"schema": {"$ref": "#"}},
                    },
                    "format": {"$ref": "#"},
                    "json_schema": {"$ref": "#"},
                },
            ),
            ("nested", {"metadata": json.loads("[" * 200 + "]" * 200)}),
            (
                "prompt 10MB",
                {
                    "prompt": "a " * 5_000_000,
                    "messages": [{"role": "user", "content": "a " * 5_000_000}],
                    "input": "a " * 5_000_000,
                },
            ),
            (
                "chat_template_kwargs",
                {
                    "chat_template_kwargs": {"x": "{% for i in range(100000) %}{% endfor %}"},
                    "chat_template": "{{ 'x' * 2**31 }}",
                },
            ),
            ("raw template", {"raw": True, "template": "{{ range 1 }}", "system": 5}),
            ("stream junk", {"stream": "yes", "stream_options": [1]}),
        ]:
            b = base()
            for k, v in patch.items():
                if k in b or k in (
                    "messages",
                    "tools",
                    "grammar",
                    "metadata",
                    "chat_template_kwargs",
                    "chat_template",
                    "raw",
                    "template",
                    "stream",
                    "stream_options",
                    "response_format",
                    "format",
                    "json_schema",
                    "model",
                ):
                    b[k] = v
            rows.append((api, label, b))
        rows.append((api, "not json", b'{"model": '))
        rows.append((api, "array body", b"[1,2,3]"))
    for label, body in [
        ("create traversal", {"model": "evil", "from": "sub/../../../../etc/passwd"}),
        ("create local", {"model": "evil2", "from": "/etc/passwd"}),
        ("create modelfile", {"model": "evil3", "modelfile": "FROM ../../../../etc/passwd"}),
        (
            "create template",
            {
                "model": "evil4",
                "from": MODEL,
                "template": "{% for i in range(100000) %}{% for j in range(100000) %}"
                "{% endfor %}{% endfor %}",
            },
        ),
        ("create files", {"model": "evil5", "files": {"../x.gguf": "sha256:" + "0" * 64}}),
    ]:
        rows.append(("ollama_create", label, body))
    rng.shuffle(rows)
    return rows


VICTIM_PROMPTS = ["Tell me a story.", "Count to ten.", "What is a cat?", "Say something."]


async def victim_text(client, prompt: str, max_tokens: int) -> str:
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}]}
    body.update(max_tokens=max_tokens, temperature=0.0, stream=True)
    text = []
    async with client.stream("POST", "/v1/chat/completions", json=body, timeout=300) as r:
        if r.status_code != 200:
            raise RuntimeError(f"victim status {r.status_code}")
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                ev = json.loads(line[6:])
                if ev.get("error"):
                    raise RuntimeError(f"victim error {ev['error']}")
                for ch in ev.get("choices", []):
                    text.append(ch.get("delta", {}).get("content") or "")
    return "".join(text)


async def _phase_malformed(args, server: Server) -> dict:
    import httpx

    t0 = time.monotonic()
    rng = random.Random(args.seed + 1)
    rows = hostile_bodies(rng)[: args.malformed_max]
    async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
        solo = [await victim_text(client, p, args.victim_tokens) for p in VICTIM_PROMPTS]
        stop = asyncio.Event()
        victims = {"runs": 0, "failed": 0}

        async def victim(i: int):
            while not stop.is_set():
                try:
                    got = await victim_text(client, VICTIM_PROMPTS[i], args.victim_tokens)
                    ok = got == solo[i]
                    detail = None if ok else {"want": solo[i][:80], "got": got[:80]}
                except Exception as e:  # noqa: BLE001 - a failed victim is the finding
                    ok, detail = False, f"{type(e).__name__}: {e}"[:300]
                victims["runs"] += 1
                if not ok:
                    victims["failed"] += 1
                    emit(
                        {
                            "phase": "malformed",
                            "finding": "victim failed",
                            "victim": i,
                            "detail": detail,
                        }
                    )

        tasks = [asyncio.create_task(victim(i)) for i in range(4)]
        try:
            sent, statuses, five = await _attack(args, client, rows, t0)
        finally:
            stop.set()
            await asyncio.gather(*tasks)
        leaked = (Path(server.home) / "blobs").exists() and any(
            b"root:" in p.read_bytes()[:4096]
            for p in (Path(server.home) / "blobs").glob("*")
            if p.is_file()
        )
    return {
        "phase": "malformed",
        "cases": sent,
        "of": len(rows),
        "statuses": statuses,
        "server_errors_or_unsafe": five,
        "victim_runs": victims["runs"],
        "victims_failed": victims["failed"],
        "passwd_in_store": leaked,
        "server_alive": server.alive(),
        "s": round(time.monotonic() - t0, 1),
    }


async def _attack(args, client, rows, t0) -> tuple[int, dict, int]:
    """Send the hostile rows; (sent, status classes, 5xx or unsafe 200s)."""
    import httpx

    statuses: dict = {}
    five, sent = 0, 0
    paths = {**{k: v[0] for k, v in GEN_APIS.items()}, "ollama_create": "/api/create"}
    for api, label, body in rows:
        if time.monotonic() - t0 > args.phase_s:
            break
        # Python's json writes NaN as the bare literal hostile clients send (httpx refuses)
        kw = {"content": body if isinstance(body, bytes) else json.dumps(body).encode()}
        try:
            r = await client.post(
                paths[api], timeout=60, **kw, headers={"content-type": "application/json"}
            )
            code = r.status_code
        except httpx.HTTPError as e:
            code, r = f"{type(e).__name__}", None
        sent += 1
        key = str(code)[0] + "xx" if isinstance(code, int) else code
        statuses[key] = statuses.get(key, 0) + 1
        if key == "2xx" and "=" not in label:  # structural junk answered 200: worth a look
            statuses.setdefault("accepted_junk", []).append(f"{api}: {label}")
        bad_create = api == "ollama_create" and code == 200 and label != "create template"
        if not isinstance(code, int) or code >= 500 or bad_create:
            five += 1
            emit(
                {
                    "phase": "malformed",
                    "finding": f"status {code}",
                    "api": api,
                    "case": label,
                    "body": r.text[:300] if r is not None else None,
                }
            )
    return sent, statuses, five


# --- phase 4: disconnect storm ------------------------------------------------------


def pages_in_use(url: str, metric: str = "llamay_kv_pages_held") -> int | None:
    """KV pages held by live sequences (the leak measure; `llamay_kv_pages_used` also
    counts the prefix cache's reusable pages)."""
    import httpx

    text = httpx.get(url + "/metrics", timeout=10).text
    vals = re.findall(rf"^{metric}(?:\{{[^}}]*\}})? ([0-9.e+]+)$", text, re.M)
    return sum(int(float(v)) for v in vals) if vals else None


async def _phase_storm(args, server: Server) -> dict:
    import httpx

    t0 = time.monotonic()
    rng = random.Random(args.seed + 2)
    baseline = pages_in_use(server.url)
    stats = {"requests": 0, "dropped_stream": 0, "dropped_nonstream": 0, "completed": 0, "5xx": 0}
    peak = [baseline or 0]

    async def client_loop(i: int):
        r = random.Random(rng.random())
        async with httpx.AsyncClient(base_url=server.url) as c:
            while time.monotonic() - t0 < args.storm_s:
                api = r.choice(list(GEN_APIS))
                path, base = GEN_APIS[api]
                body = base()
                n = 200
                for k in ("max_tokens", "max_output_tokens", "n_predict"):
                    if k in body:
                        body[k] = n
                if "options" in body:
                    body["options"]["num_predict"] = n
                stream = r.random() < 0.5
                body["stream"] = stream
                wait = r.uniform(0.05, 3.0)
                stats["requests"] += 1
                try:
                    if stream:
                        async with c.stream("POST", path, json=body, timeout=30) as resp:
                            if resp.status_code >= 500:
                                stats["5xx"] += 1
                            t1 = time.monotonic()
                            async for _ in resp.aiter_bytes():
                                if time.monotonic() - t1 > wait:
                                    stats["dropped_stream"] += 1
                                    break
                            else:
                                stats["completed"] += 1
                    else:
                        resp = await c.post(path, json=body, timeout=wait)
                        stats["completed"] += 1
                        if resp.status_code >= 500:
                            stats["5xx"] += 1
                except httpx.TimeoutException:
                    stats["dropped_nonstream"] += 1
                except httpx.HTTPError as e:
                    emit(
                        {
                            "phase": "storm",
                            "finding": f"client error {type(e).__name__}",
                            "api": api,
                        }
                    )

    async def sample():
        while time.monotonic() - t0 < args.storm_s:
            await asyncio.sleep(2)
            try:
                p = await asyncio.to_thread(pages_in_use, server.url)
                peak[0] = max(peak[0], p or 0)
            except httpx.HTTPError:
                pass

    await asyncio.gather(*(client_loop(i) for i in range(args.storm_clients)), sample())
    storm_s = time.monotonic() - t0
    drained, settle = None, time.monotonic()
    while time.monotonic() - settle < 60:
        now = pages_in_use(server.url)
        if now == baseline:
            drained = round(time.monotonic() - settle, 1)
            break
        await asyncio.sleep(1)
    health = httpx.get(server.url + "/health", timeout=10).status_code
    return {
        "phase": "storm",
        "clients": args.storm_clients,
        "storm_s": round(storm_s, 1),
        **stats,
        "pages_baseline": baseline,
        "pages_peak": peak[0],
        "pages_after": pages_in_use(server.url),
        "pages_used_incl_prefix_cache": pages_in_use(server.url, "llamay_kv_pages_used"),
        "pages_back_to_baseline_s": drained,
        "health_after": health,
    }


# --- main ---------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phases", default="gguf,schema,malformed,storm")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--phase-s", type=float, default=300, help="cap per phase (s)")
    ap.add_argument("--mutations", type=int, default=500)
    ap.add_argument("--batch", type=int, default=50, help="GGUFs per child process")
    ap.add_argument("--rss-mb", type=int, default=8192, help="child address-space cap")
    ap.add_argument("--case-s", type=float, default=60, help="one GGUF's load budget")
    ap.add_argument("--schema-examples", type=int, default=20, help="per operation")
    ap.add_argument("--malformed-max", type=int, default=2000)
    ap.add_argument("--victim-tokens", type=int, default=24)
    ap.add_argument("--storm-clients", type=int, default=16)
    ap.add_argument("--storm-s", type=float, default=60)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--start-s", type=float, default=300, help="server readiness budget")
    ap.add_argument("--warmup", action="store_true", help="let the server compile at start")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    phases = args.phases.split(",")
    summary = []
    if "gguf" in phases:
        summary.append(phase_gguf(args))
        emit({"summary": True, **summary[-1]})
    if set(phases) & {"schema", "malformed", "storm"}:
        server = Server(args)
        emit({"server": server.url, "ready_s": server.ready_s})
        try:
            for name, fn in [
                ("schema", phase_schema),
                ("malformed", lambda a, s: asyncio.run(_phase_malformed(a, s))),
                ("storm", lambda a, s: asyncio.run(_phase_storm(a, s))),
            ]:
                if name in phases and server.alive():
                    summary.append(fn(args, server))
                    emit({"summary": True, **summary[-1]})
            emit(
                {
                    "summary": True,
                    "phase": "sigterm",
                    "exit_s": server.sigterm(),
                    "rc": server.proc.returncode,
                }
            )
        finally:
            if server.alive():
                server.proc.kill()
            emit({"server_log_tail": server.tail()[-1500:]})
    if args.out:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in OUT))


if __name__ == "__main__":
    main()
