"""Constrained decoding cost: decode tokens/s with and without a JSON-schema constraint,
and the host time of one mask (µs per token) on a model's tokenizer. One JSON line.

    .venv/bin/python -m bench.constrained [-m smollm2:135m] [-n 64] [--mask-only]

The mask is computed on the host while the device runs the next forward pass
(`llamay.engine.Generation`), so it costs decode time only where it exceeds the step.
`--mask-only` loads just the tokenizer (e.g. Gemma 3's 262k vocabulary) and times
`mask()` + `advance()` along a fixed valid instance, and DRY's breaker tables (first
request on the tokenizer, then cached). No assertions.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"pattern": "^[0-9]{5}$"}},
            "required": ["city"],
        },
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
INSTANCE = {
    "name": "Ada Lovelace",
    "age": 36,
    "email": "ada@example.org",
    "tags": ["maths", "engines"],
    "address": {"city": "London", "zip": "12345"},
}


def mask_us(tokenizer, n_vocab: int, reps: int = 3) -> dict:
    from llamay.constrain import json_schema, lltokenizer_for

    t = time.perf_counter()
    lltok = lltokenizer_for(tokenizer, n_vocab)
    build_s = time.perf_counter() - t
    ids = tokenizer.encode(json.dumps(INSTANCE), add_special=False)
    per = []
    for _ in range(reps):
        c = json_schema(lltok, SCHEMA)
        for tok in ids:
            t = time.perf_counter()
            c.mask()
            c.advance(tok)
            per.append(time.perf_counter() - t)
    return {
        "vocab": n_vocab,
        "tokenizer_build_s": round(build_s, 3),
        "mask_us_median": round(1e6 * statistics.median(per), 1),
        "mask_us_p90": round(1e6 * sorted(per)[int(0.9 * len(per))], 1),
    }


def dry_tables_s(pieces) -> dict:
    """DRY's sequence-breaker tables for a request: the first on a tokenizer builds them
    (a scan of the vocabulary), later ones hit the per-tokenizer cache."""
    from llamay.sample import Sampler, SamplingParams

    s = Sampler(dry_multiplier=0.8)
    out = {}
    for name in ("first", "cached"):
        t = time.perf_counter()
        SamplingParams.stack([s], len(pieces), pieces)
        out[f"dry_tables_{name}_ms"] = round(1e3 * (time.perf_counter() - t), 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default="smollm2:135m")
    ap.add_argument("-n", "--gen-tokens", type=int, default=64)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("--mask-only", action="store_true")
    args = ap.parse_args()

    if args.mask_only:
        from llamay.store import resolve
        from llamay.tok import Tokenizer

        tok = Tokenizer.from_gguf(resolve(args.model, progress=False)).warm()
        pieces = [tok.token_to_piece(i) for i in range(tok.vocab_size)]
        print(
            json.dumps(
                {"model": args.model, **mask_us(tok, tok.vocab_size), **dry_tables_s(pieces)}
            )
        )
        return

    import llamay
    from llamay.sample import Sampler

    m = llamay.load(args.model, progress=False)
    prompt = m.tokenize("A person as JSON:", add_special=True, parse_special=True)
    s = Sampler(temperature=0.7, seed=0)

    def run(constrained: bool) -> tuple[float, float, int]:
        con = m.constraint(json_schema=SCHEMA) if constrained else None
        gen = m.generation(prompt, args.gen_tokens, s, con)
        first = end = None
        n = 0
        for _ in gen:
            n += 1
            end = time.perf_counter()
            if first is None:
                first = end
        rate = (n - 1) / (end - first) if n > 1 and end > first else float("nan")
        return rate, (gen.mask_seconds / max(n, 1)) if constrained else 0.0, n

    run(False), run(True)  # compile
    free, cons = [], []
    for _ in range(args.repetitions):  # interleaved, so load drifts hit both alike
        free.append(run(False)[0])
        cons.append(run(True))
    print(
        json.dumps(
            {
                "model": args.model,
                "backend": __import__("jax").default_backend(),
                "decode_tok_s": round(statistics.median(free), 1),
                "decode_tok_s_json_schema": round(statistics.median(c[0] for c in cons), 1),
                "constrained_tokens": [c[2] for c in cons],
                "host_constraint_us_per_token": round(
                    1e6 * statistics.median(c[1] for c in cons), 1
                ),
                **{f"tokenizer_{k}": v for k, v in mask_us(m.tokenizer, m.config.vocab).items()},
            }
        )
    )


if __name__ == "__main__":
    main()
