"""Speculative decoding on the batch engine: tok/s and accepted tokens per verify step,
with and without speculation; prints one JSON line per configuration.

    .venv/bin/python -m bench.speculative [-m smollm2:135m] [--tokens 96] [--rows 1]
        [--draft-max 8] [--repeats 2]

Configurations, each on one `BatchEngine` over the target (greedy, so every
configuration emits the same tokens, which is checked):
- `plain`: no speculation;
- `ngram`: prompt lookup (`--model-draft ngram`) on a code-edit prompt (the answer
  copies the code it is given) and a summarisation prompt;
- `self`: the target drafting for itself (the same model loaded twice): the acceptance
  ceiling (every draft accepted) and the draft's cost in full.

Each configuration runs once untimed (compiles), then `--repeats` timed runs; reported:
generated tok/s (best run), steps, verify steps, draft tokens proposed and accepted,
accepted per verify step and tokens emitted per target forward. With `--rows` > 1 the
prompt runs in that many rows at once. No assertions: numbers for notes; the machine's
load average is printed with them.
"""

from __future__ import annotations

import argparse
import json
import os
import time

CODE = '''def moving_average(values, window):
    """Return the moving averages of values over window."""
    out = []
    total = 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            out.append(total / window)
    return out
'''

PROMPTS = {
    "code-edit": "Rename the function moving_average to rolling_mean and the argument "
    "values to xs in this code. Reply with the whole code only.\n\n" + CODE,
    "summarise": "Summarise this text in two sentences, reusing its words.\n\nThe city "
    "council met on Tuesday to discuss the new bicycle lanes on Main Street. The council "
    "voted to extend the bicycle lanes on Main Street to the river, and to add new bicycle "
    "parking near the station. The extension of the bicycle lanes will start in the spring "
    "and the new bicycle parking near the station will open in the summer.",
}


def run(engine, ids, rows, tokens, Request, GREEDY):
    before = engine.stats()
    t0 = time.perf_counter()
    hs = [engine.submit(Request(ids, tokens, GREEDY)) for _ in range(rows)]
    out = [[ev.token_id for ev in h] for h in hs]
    dt = time.perf_counter() - t0
    after = engine.stats()
    d = {k: after.get(k, 0) - before.get(k, 0) for k in after if isinstance(after[k], int)}
    return out, dt, d


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default="smollm2:135m")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--draft-max", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--only", default="plain,ngram,self")
    args = ap.parse_args()

    import jax

    import llamay
    from llamay.engine.api import Request
    from llamay.engine.scheduler import BatchEngine
    from llamay.engine.speculative import Speculation
    from llamay.sample import GREEDY

    target = llamay.load(args.model, n_ctx=args.ctx, progress=False)
    configs = {"plain": None, "ngram": Speculation("ngram", args.draft_max)}
    if "self" in args.only:
        draft = llamay.load(args.model, n_ctx=args.ctx, progress=False)
        configs["self"] = Speculation(draft, args.draft_max, 0, 0.0)
    reference = {}
    for name in args.only.split(","):
        spec = configs[name]
        for task, text in PROMPTS.items():
            chat = f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
            ids = target.tokenize(chat, add_special=True, parse_special=True)
            e = BatchEngine(target, slots=max(2, args.rows), page_size=16, speculative=spec)
            try:
                run(e, ids, args.rows, args.tokens, Request, GREEDY)  # compiles
                best = None
                for _ in range(args.repeats):
                    out, dt, d = run(e, ids, args.rows, args.tokens, Request, GREEDY)
                    if best is None or dt < best[1]:
                        best = (out, dt, d)
            finally:
                e.close()
            out, dt, d = best
            same = reference.setdefault(task, out) == out
            n = sum(len(o) for o in out)
            verify = d.get("spec_steps", 0)
            print(
                json.dumps(
                    {
                        "config": name,
                        "task": task,
                        "model": args.model,
                        "rows": args.rows,
                        "draft_max": args.draft_max if spec else 0,
                        "tokens": n,
                        "seconds": round(dt, 3),
                        "tok_s": round(n / dt, 2),
                        "steps": d.get("steps", 0),
                        "verify_steps": verify,
                        "draft_tokens": d.get("draft_tokens", 0),
                        "draft_accepted": d.get("draft_accepted", 0),
                        "accepted_per_verify": round(d.get("draft_accepted", 0) / verify, 2)
                        if verify
                        else 0.0,
                        "tokens_per_step": round(n / max(1, d.get("steps", 1)), 2),
                        "same_tokens_as_plain": same,
                        "backend": jax.default_backend(),
                        "loadavg": [round(x, 2) for x in os.getloadavg()],
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
