"""The `llamay` command: thin Typer commands over the library.

Generated text goes to stdout; diagnostics (progress, timings) go to stderr.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Annotated

import typer

from llamay.errors import LlamayError

DEFAULT_MODEL = "smollm2:135m"

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="llamay: run GGUF language models with JAX.",
    pretty_exceptions_enable=False,
)

ModelOpt = Annotated[
    str, typer.Option("--model", "-m", help="A path to a .gguf file or a store name.")
]


def _err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _fail(exc: LlamayError) -> typer.Exit:
    _err(f"error: {exc}")
    return typer.Exit(code=1)


@app.command()
def generate(
    prompt: Annotated[str, typer.Argument(help="The text to continue.")],
    model: ModelOpt = DEFAULT_MODEL,
    max_tokens: Annotated[int, typer.Option("--max-tokens", "-n", min=0)] = 128,
    temperature: Annotated[float, typer.Option("--temperature", "--temp", min=0.0)] = 0.8,
    top_k: Annotated[int, typer.Option("--top-k", min=0)] = 40,
    top_p: Annotated[float, typer.Option("--top-p")] = 0.95,
    min_p: Annotated[float, typer.Option("--min-p")] = 0.05,
    seed: Annotated[int | None, typer.Option("--seed", "-s")] = None,
    n_ctx: Annotated[int | None, typer.Option("--ctx-size", "-c", min=1)] = None,
) -> None:
    """Continue PROMPT with MODEL, streaming the generated text to stdout."""
    import llamay

    try:
        t0 = time.perf_counter()
        m = llamay.load(model, n_ctx=n_ctx)
        t_load = time.perf_counter() - t0
        pieces = m.generate(
            prompt,
            max_tokens=max_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            seed=seed,
            stream=True,
        )
        t1 = time.perf_counter()
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
    _err(f"[llamay] load {t_load:.2f}s, first token {first or 0:.2f}s, total {total:.2f}s")


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
    from llamay.store import resolve
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
    from llamay.store import resolve

    try:
        info = summary(resolve(model))
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


@app.command()
def pull(name: Annotated[str, typer.Argument(help="A model name, e.g. smollm2:135m.")]) -> None:
    """Fetch a model into the local store."""
    from llamay.store import pull as store_pull

    try:
        path = store_pull(name, progress=True)
    except LlamayError as exc:
        raise _fail(exc) from None
    print(path)


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


__import__("llamay_cli.store_cmds").store_cmds.register(app)
__import__("llamay_cli.ocr").ocr.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
