"""`llamay warmup`: compile a model's step programs ahead of time (`llamay.engine.warmup`)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from llamay.errors import LlamayError
from llamay_cli.serve_cmds import FlashAttnOpt, NumericsOpt


def _ints(text: str | None, what: str) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise typer.BadParameter(
            f"{what}: a comma-separated list of integers, not {text!r}"
        ) from None


def warmup(
    model: Annotated[str, typer.Argument(help="A path to a .gguf file or a store name.")],
    batch: Annotated[
        str,
        typer.Option(
            "--batch",
            "-b",
            help="Concurrent sequences to cover, e.g. 1,2,4,8 (each rounds up to a power of two).",
        ),
    ] = "1",
    length: Annotated[
        int,
        typer.Option(
            "--length", "-l", min=1, help="The longest sequence (prompt + new tokens) covered."
        ),
    ] = 512,
    prefill_buckets: Annotated[
        str | None,
        typer.Option(
            "--prefill-buckets",
            "-p",
            help="Prompt chunk sizes to cover, e.g. 16,64 (default: 16 up to the prefill chunk).",
        ),
    ] = None,
    n_ctx: Annotated[
        int | None,
        typer.Option(
            "--ctx-size",
            "--ctx",
            "-c",
            min=1,
            help="The context size the commands will run with (as their --ctx-size / --ctx).",
        ),
    ] = None,
    serve: Annotated[
        bool, typer.Option("--serve", help="Warm up `llamay serve`'s engine, not generate's.")
    ] = False,
    parallel: Annotated[
        int, typer.Option(min=1, help="With --serve: the server's --parallel.")
    ] = 8,
    workers: Annotated[
        int | None, typer.Option(min=1, help="Compile threads (default: CPUs, at most 4).")
    ] = None,
    numerics: NumericsOpt = "exact",
    flash_attn: FlashAttnOpt = "off",
) -> None:
    """Compile MODEL's programs ahead of time, so the next run starts without compiling.

    Into the program cache go every step shape the next `llamay generate` (or, with
    --serve, `llamay serve`) runs for up to --batch concurrent sequences of up to --length
    positions (a decode step, and a prefill step per chunk bucket, per page-table width),
    and the sampling programs. The caches are ~/.cache/llamay/programs
    and ~/.cache/llamay/jax (LLAMAY_CACHE moves them); programs are per model shape,
    context size, numerics, engine and device, so warm up with the settings the later
    commands use."""
    import llamay
    from llamay.engine.warmup import warmup as run_warmup

    rows = _ints(batch, "--batch") or [1]
    prefill = _ints(prefill_buckets, "--prefill-buckets")

    def progress(shape, seconds: float) -> None:
        print(f"[llamay] compiled {shape} in {seconds:.1f}s", file=sys.stderr, flush=True)

    m = None
    try:
        m = llamay.load(model, n_ctx=n_ctx, numerics=numerics, flash_attn=flash_attn)
        if serve:
            from llamay.serve.models import make_engine

            engine = make_engine(m, parallel)
        else:
            engine = m.engine
        try:
            report = run_warmup(engine, rows, length, prefill, workers, progress)
        finally:
            if serve:
                engine.close()
    except LlamayError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise typer.Exit(code=1) from None
    finally:
        if m is not None:
            m.close()
    print(
        f"[llamay] warmed up {len(report.steps)} step programs in {report.seconds:.1f}s "
        f"({report.cache_hits} of {report.requests} programs already cached)",
        file=sys.stderr,
    )


def register(app: typer.Typer) -> None:
    app.command()(warmup)
