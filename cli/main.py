"""The `llamay` command: thin Typer commands over the library.

Generated text goes to stdout; diagnostics (progress, timings) go to stderr. Each command
imports the library inside its body: `llamay --help`, `list`, `rm` or `pull` then never
load JAX (seconds), only the commands that run a model do.
"""

from __future__ import annotations

import functools
import inspect
import json
import re
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from llamay.errors import LlamayError
from llamay_cli import eval_cmds, ocr, serve_cmds, store_cmds, warmup_cmds
from llamay_cli.serve_cmds import (
    CacheTypeKOpt,
    CacheTypeVOpt,
    FlashAttnOpt,
    ImageOpt,
    MmprojOpt,
    NumericsOpt,
    image_prompt,
    lora_arg,
)

DEFAULT_MODEL = "smollm2:135m"

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="llamay: run GGUF language models with JAX.",
    pretty_exceptions_enable=False,
)

# `generate`'s options, by the help panel they show in
_sampling = functools.partial(typer.Option, rich_help_panel="Sampling")
_penalty = functools.partial(typer.Option, rich_help_panel="Repetition penalties")
_constraint = functools.partial(typer.Option, rich_help_panel="Constrained output")

ModelOpt = Annotated[
    str, typer.Option("--model", "-m", help="A path to a .gguf file or a store name.")
]


def _err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _fail(exc: LlamayError) -> typer.Exit:
    _err(f"error: {exc}")
    return typer.Exit(code=1)


def _read_prompt(path: Path) -> str:
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        _err(f"error: cannot read the prompt from {path}: {exc}")
        raise typer.Exit(code=1) from None
    return text[:-1] if text.endswith("\n") else text


@app.command()
def generate(
    prompt: Annotated[str | None, typer.Argument(help="The text to continue (or --file).")] = None,
    prompt_file: Annotated[
        Path | None,
        typer.Option(
            "--file",
            "-f",
            dir_okay=False,
            allow_dash=True,
            help="Read the prompt from this file (-: standard input), less one final newline, "
            "as llama-cli's -f.",
        ),
    ] = None,
    model: ModelOpt = DEFAULT_MODEL,
    max_tokens: Annotated[
        int,
        typer.Option(
            "--max-tokens", "-n", min=0, help="The most tokens to generate (fewer at an end token)."
        ),
    ] = 128,
    temperature: Annotated[
        float,
        _sampling(
            "--temperature", "--temp", min=0.0, help="0: always the most likely token (greedy)."
        ),
    ] = 0.8,
    top_k: Annotated[
        int,
        _sampling("--top-k", min=0, help="Keep the K most likely tokens (0: all)."),
    ] = 40,
    top_p: Annotated[
        float,
        _sampling(
            "--top-p", help="Keep the most likely tokens whose probabilities sum to P (1: off)."
        ),
    ] = 0.95,
    min_p: Annotated[
        float,
        _sampling(
            "--min-p", help="Drop tokens less likely than P times the most likely one (0: off)."
        ),
    ] = 0.05,
    seed: Annotated[
        int | None,
        _sampling("--seed", "-s", help="Seed of the draws (default: a new one each run)."),
    ] = None,
    n_ctx: Annotated[
        int | None,
        typer.Option(
            "--ctx-size",
            "--ctx",
            "-c",
            min=1,
            help="Context length in tokens (default, and at most: the model's).",
        ),
    ] = None,
    grammar: Annotated[
        str | None,
        _constraint("--grammar", help="A GBNF grammar."),
    ] = None,
    grammar_file: Annotated[
        Path | None,
        _constraint("--grammar-file", exists=True, dir_okay=False, help="A GBNF grammar's file."),
    ] = None,
    json_schema: Annotated[
        str | None,
        _constraint("--json-schema", "-j", help="A JSON schema (text)."),
    ] = None,
    json_schema_file: Annotated[
        Path | None,
        _constraint(
            "--json-schema-file", exists=True, dir_okay=False, help="A JSON schema's file."
        ),
    ] = None,
    json_any: Annotated[bool, _constraint("--json", help="A JSON object.")] = False,
    regex: Annotated[
        str | None,
        _constraint("--regex", help="Output that this regex (Rust syntax) matches whole."),
    ] = None,
    lenient: Annotated[
        bool,
        _constraint("--lenient", help="Drop schema keywords that cannot be enforced."),
    ] = False,
    repeat_penalty: Annotated[
        float,
        _penalty(
            "--repeat-penalty",
            help="Tokens in the window: a positive logit divided by this, a negative one "
            "multiplied (1: off).",
        ),
    ] = 1.0,
    repeat_last_n: Annotated[
        int,
        _penalty(
            "--repeat-last-n",
            help="The penalties' window in tokens (0: off, -1: the whole context).",
        ),
    ] = 64,
    presence_penalty: Annotated[
        float,
        _penalty(
            "--presence-penalty",
            help="Subtracted from the logit of each token in the window (0: off).",
        ),
    ] = 0.0,
    frequency_penalty: Annotated[
        float,
        _penalty(
            "--frequency-penalty", help="Subtracted once per occurrence in the window (0: off)."
        ),
    ] = 0.0,
    typical_p: Annotated[
        float,
        _sampling("--typical", help="Locally typical sampling's mass (1: off)."),
    ] = 1.0,
    top_n_sigma: Annotated[
        float,
        _sampling(
            "--top-n-sigma", help="Keep logits within N standard deviations of the best (-1: off)."
        ),
    ] = -1.0,
    xtc_probability: Annotated[
        float,
        _sampling(
            "--xtc-probability",
            help="XTC: the chance, per token, of dropping the likeliest tokens above "
            "--xtc-threshold but the least of them (0: off).",
        ),
    ] = 0.0,
    xtc_threshold: Annotated[
        float,
        _sampling("--xtc-threshold", help="XTC's threshold."),
    ] = 0.1,
    dry_multiplier: Annotated[
        float,
        _penalty(
            "--dry-multiplier",
            help="DRY: penalise tokens that would extend a repeated sequence (0: off).",
        ),
    ] = 0.0,
    dynatemp_range: Annotated[
        float,
        _sampling(
            "--dynatemp-range",
            help="Dynamic temperature: within temperature ± this, by the candidates' entropy "
            "(0: off).",
        ),
    ] = 0.0,
    mirostat: Annotated[
        int,
        _sampling(
            "--mirostat", help="Mirostat: 1 or 2 (version), in place of top-k, top-p, ...; 0: off."
        ),
    ] = 0,
    mirostat_tau: Annotated[
        float,
        _sampling("--mirostat-ent", help="Mirostat's target entropy (tau)."),
    ] = 5.0,
    mirostat_eta: Annotated[
        float,
        _sampling("--mirostat-lr", help="Mirostat's learning rate (eta)."),
    ] = 0.1,
    samplers: Annotated[
        str | None,
        _sampling("--samplers", help="Sampler order, e.g. top_k;top_p;temperature"),
    ] = None,
    stop: Annotated[
        list[str] | None,
        typer.Option(
            "--stop",
            "-r",
            help="End the text before this string (repeatable; llama-cli's -r, the API's stop).",
        ),
    ] = None,
    lora: Annotated[
        list[str] | None,
        typer.Option("--lora", help="A GGUF LoRA adapter, PATH or PATH:SCALE (repeatable)."),
    ] = None,
    mmproj: MmprojOpt = None,
    image: ImageOpt = None,
    cache_type_k: CacheTypeKOpt = None,
    cache_type_v: CacheTypeVOpt = None,
    numerics: NumericsOpt = "exact",
    flash_attn: FlashAttnOpt = "off",
) -> None:
    """Continue PROMPT with MODEL, streaming the generated text to stdout."""
    import llamay

    if (prompt is None) == (prompt_file is None):
        _err("error: give the prompt as PROMPT or --file, one of them")
        raise typer.Exit(code=2)
    if prompt_file is not None:
        prompt = _read_prompt(prompt_file)
    if grammar_file is not None:
        grammar = grammar_file.read_text()
    if json_schema_file is not None:
        json_schema = json_schema_file.read_text()
    sampling = dict(
        repeat_penalty=repeat_penalty,
        repeat_last_n=repeat_last_n,
        presence_penalty=presence_penalty,
        frequency_penalty=frequency_penalty,
        typical_p=typical_p,
        top_n_sigma=top_n_sigma,
        xtc_probability=xtc_probability,
        xtc_threshold=xtc_threshold,
        dry_multiplier=dry_multiplier,
        dynatemp_range=dynatemp_range,
        mirostat=mirostat,
        mirostat_tau=mirostat_tau,
        mirostat_eta=mirostat_eta,
    )
    if samplers:
        sampling["samplers"] = samplers
    prompt, images = image_prompt(prompt, image)
    m = None
    try:
        t0 = time.perf_counter()
        m = llamay.load(
            model,
            n_ctx=n_ctx,
            lora=[lora_arg(a) for a in lora or ()],
            cache_type_k=cache_type_k,
            cache_type_v=cache_type_v,
            numerics=numerics,
            flash_attn=flash_attn,
        )
        if mmproj is not None:
            m.attach_projector(mmproj)
        t_load = time.perf_counter() - t0
        t1 = time.perf_counter()  # first token: from here (tokenizing, engine start included)
        pieces = m.generate(
            prompt,
            max_tokens=max_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            seed=seed,
            stream=True,
            json_schema=json_schema,
            grammar=grammar,
            regex=regex,
            json=json_any,
            lenient=lenient,
            images=images,
            stop=stop,
            **sampling,
        )
        first = None
        for piece in pieces:
            if first is None:
                first = time.perf_counter() - t1
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        total = time.perf_counter() - t1
    except LlamayError as exc:
        raise _fail(exc) from None
    finally:
        if m is not None:  # the generation ran on the model's engine: stop it
            m.close()
    # why it ended: an eval job must tell a text cut at -n or the context from a finished one
    why = {"stop": "an end token or --stop", "length": "-n or the context"}.get(
        pieces.finish_reason, pieces.finish_reason
    )
    _err(
        f"[llamay] {pieces.completion_tokens} tokens, ended by {why}; load {t_load:.2f}s, "
        f"first token {first or 0:.2f}s, total {total:.2f}s"
    )


@app.command()
def tokenize(
    text: Annotated[str, typer.Argument(help="The text to tokenize.")],
    model: ModelOpt = DEFAULT_MODEL,
    no_special: Annotated[bool, typer.Option("--no-special", help="Do not add BOS/EOS.")] = False,
    parse_special: Annotated[
        bool, typer.Option("--parse-special", help="Parse special-token text as special tokens.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list of ids.")] = False,
) -> None:
    """Print the token ids (and pieces) of TEXT under MODEL's tokenizer."""
    from llamay.gguf import GGUFFile
    from llamay.library import resolve
    from llamay.tok import Tokenizer

    try:
        gf = GGUFFile(resolve(model))
        tok = Tokenizer.from_metadata(gf.metadata)
        ids = tok.encode(text, add_special=not no_special, parse_special=parse_special)
    except LlamayError as exc:
        raise _fail(exc) from None
    if as_json:
        print(json.dumps(ids))
        return
    for i in ids:
        print(f"{i:>8} -> {tok.token_to_piece(i).decode('utf-8', errors='replace')!r}")


@app.command()
def show(
    model: Annotated[str, typer.Argument(help="A path to a .gguf file or a store name.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Describe a model: architecture, parameters, context, tensor types, chat template."""
    from llamay.gguf.inspect import summary
    from llamay.library import resolve

    try:
        info = summary(resolve(model))
        info.update(_layers(model))
    except LlamayError as exc:
        raise _fail(exc) from None
    if as_json:
        print(json.dumps(info, default=str))
        return
    types = ", ".join(f"{t} x{n}" for t, n in info["tensor_types"].items())
    rows = [
        ("architecture", info["architecture"]),
        ("name", info.get("name")),
        ("parameters", f"{info['parameter_count'] / 1e6:.1f}M"),
        ("file type", info.get("file_type")),
        ("file size", f"{info['file_size'] / 1e6:.1f} MB"),
        ("context length", info.get("context_length")),
        ("embedding length", info.get("embedding_length")),
        ("layers", info.get("block_count")),
        ("tokenizer", f"{info.get('tokenizer')} ({info.get('vocab_size')} tokens)"),
        ("chat template", "yes" if info["has_chat_template"] else "no (built-in fallback)"),
        ("tensor types", types),
    ]
    for k, v in rows:
        print(f"{k:>18}  {v}")
    for key in ("system", "parameters", "template", "license"):
        if info.get(key):
            text = info[key] if isinstance(info[key], str) else json.dumps(info[key])
            print(f"\n{key}:\n" + "\n".join("  " + line for line in text.splitlines()))


def _layers(model: str) -> dict:
    """Template/system/params/license layers of a store or Ollama model (as `ollama show`);
    nothing for a plain .gguf path or a model without layers."""
    from pathlib import Path

    from llamay.library import layered_model

    if Path(model).expanduser().is_file():
        return {}
    try:
        om = layered_model(model)
    except LlamayError:
        return {}
    return {
        "template": om.template,
        "system": om.system,
        "parameters": om.params or None,
        "license": "\n\n".join(om.license) or None,
    }


@app.command()
def bench(
    model: ModelOpt = DEFAULT_MODEL,
    prompt_tokens: Annotated[
        int, typer.Option("--prompt-tokens", "-p", min=0, help="Prompt length of ppN (0: none).")
    ] = 128,
    gen_tokens: Annotated[
        int, typer.Option("--gen-tokens", "-n", min=0, help="Tokens decoded in tgN (0: none).")
    ] = 128,
    batch: Annotated[str, typer.Option("--batch", "-b", help="Comma-separated sizes.")] = "1",
    repetitions: Annotated[
        int, typer.Option("--repetitions", "-r", min=1, help="Runs of each test (mean ± sd).")
    ] = 3,
    numerics: NumericsOpt = "exact",
    flash_attn: FlashAttnOpt = "off",
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    cache_type_k: CacheTypeKOpt = None,
    cache_type_v: CacheTypeVOpt = None,
    depth: Annotated[
        int,
        typer.Option(
            "--depth",
            "-d",
            min=0,
            help="Tokens already in the cache before each test (llama-bench's -d): "
            '"pp128 @ d4096".',
        ),
    ] = 0,
) -> None:
    """Measure prefill (ppN) and decode (tgN) tokens/s, llama-bench style."""
    import llamay
    from llamay.bench import run_bench

    try:
        batches = tuple(int(b) for b in batch.split(",") if b.strip())
        if not batches or min(batches) < 1:
            raise ValueError
    except ValueError:
        raise typer.BadParameter(f"--batch must be positive integers, got {batch!r}") from None
    if prompt_tokens == 0 and gen_tokens == 0:  # nothing to measure: say so, load nothing
        raise typer.BadParameter("-p and -n are both 0: no test to run")
    try:
        m = llamay.load(model, numerics=numerics, cache_type_k=cache_type_k,
                        cache_type_v=cache_type_v, flash_attn=flash_attn)  # fmt: skip
        results = run_bench(m, model, prompt_tokens, gen_tokens, batches, repetitions, depth)
    except LlamayError as exc:
        raise _fail(exc) from None
    if as_json:
        for r in results:
            print(json.dumps(r.as_dict()))
        return
    tw = max(6, *(len(r.test) for r in results)) if results else 6
    print(
        f"| {'model':<16} | {'size':>8} | {'params':>7} | {'backend':<7} | {'test':>{tw}} "
        f"| {'batch':>5} | {'t/s':>16} | {'compile':>7} |"
    )
    print("|" + "|".join("-" * w for w in (18, 10, 9, 9, tw + 2, 7, 18, 9)) + "|")
    for r in results:
        print(
            f"| {r.model:<16} | {r.size_mb:>6.1f}MB | {r.params_m:>6.1f}M | {r.backend:<7} "
            f"| {r.test:>{tw}} | {r.batch:>5} | {r.tokens_per_s:>8.2f} ± {r.stdev:<5.2f} "
            f"| {r.compile_s:>6.2f}s |"
        )


@app.command()
def pull(
    name: Annotated[str, typer.Argument(help="A model name, e.g. smollm2:135m.")],
    warmup: Annotated[
        bool,
        typer.Option("--warmup", help="Then compile it for `llamay generate` (llamay warmup)."),
    ] = False,
) -> None:
    """Fetch a model into the local store."""
    from llamay.store import pull as store_pull

    try:
        path = store_pull(name, progress=True)
    except LlamayError as exc:
        raise _fail(exc) from None
    print(path)
    if warmup:  # opt-in: compiling costs about a minute of CPU even for SmolLM2-135M
        from llamay_cli.warmup_cmds import warmup as warmup_cmd

        warmup_cmd(str(path))


@app.command("list")
def list_models() -> None:
    """List the models in the local store."""
    from llamay.store import list_models as store_list

    entries = store_list()
    if not entries:
        _err("no models in the store yet (try: llamay pull smollm2:135m)")
        return
    print(f"{'NAME':<28} {'SIZE':>10}  DIGEST")
    for e in entries:
        print(f"{e.name:<28} {e.size / 1e6:>8.1f}MB  {e.digest[:19]}")


for _commands in (store_cmds, ocr, serve_cmds, eval_cmds, warmup_cmds):
    _commands.register(app)


def _tidy_help(group: typer.Typer) -> None:
    """Reflow each command's docstring of `group` (and its subgroups) to the terminal, and
    list each command with its first sentence. Typer's rich help keeps a docstring's
    single line breaks, so wrapped source lines showed as ragged ones (and a long first
    paragraph as several lines of the command list)."""
    for info in group.registered_commands:
        doc = inspect.getdoc(info.callback) or ""
        paragraphs = [" ".join(p.split()) for p in doc.split("\n\n")]
        if info.help is None and doc:
            info.help = "\n\n".join(paragraphs)
        if info.short_help is None and doc:
            info.short_help = re.split(r"(?<=\.)\s+(?=[A-Z`(])", paragraphs[0])[0]
    for sub in group.registered_groups:
        _tidy_help(sub.typer_instance)


_tidy_help(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
