"""`llamay eval ...`: perplexity (llama.cpp's method) and lm-evaluation-harness."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from llamay.errors import LlamayError
from llamay_cli.serve_cmds import FlashAttnOpt, NumericsOpt

eval_app = typer.Typer(
    no_args_is_help=True,
    help="Evaluate a model: perplexity of a text, lm-evaluation-harness tasks.",
)

MeshOpt = Annotated[
    str | None,
    typer.Option(
        "--mesh",
        help="Shard over devices: dp=N (batch rows), tp=M (heads / FFN), e.g. dp=2,tp=2.",
    ),
]
DistributedOpt = Annotated[
    bool,
    typer.Option(
        "--distributed",
        help="Multi-host: jax.distributed.initialize() first (one process per host).",
    ),
]


def _err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def load_model(model: str, numerics: str, n_ctx: int | None, mesh: str | None, distributed: bool,
               flash_attn: str = "off"):  # fmt: skip
    """A model, sharded over `mesh` if given (after distributed init if asked)."""
    import llamay
    from llamay.model.sharding import initialize_distributed, parse_mesh, sharded_model

    if distributed:
        initialize_distributed()
    sizes = parse_mesh(mesh)
    m = llamay.load(model, numerics=numerics, n_ctx=n_ctx, flash_attn=flash_attn)
    return sharded_model(m, sizes if sizes["data"] * sizes["model"] > 1 else None)


@eval_app.command()
def perplexity(
    file: Annotated[Path, typer.Argument(help="The text file to score.", exists=True)],
    model: Annotated[
        str, typer.Option("--model", "-m", help="A path to a .gguf file or a store name.")
    ] = "smollm2:135m",
    ctx: Annotated[int, typer.Option("--ctx", "-c", min=4, help="Tokens per chunk.")] = 512,
    batch: Annotated[int, typer.Option("--batch", "-b", min=1, help="Chunks per step.")] = 1,
    chunks: Annotated[int | None, typer.Option("--chunks", min=1, help="At most N chunks.")] = None,
    numerics: NumericsOpt = "exact",
    flash_attn: FlashAttnOpt = "off",
    mesh: MeshOpt = None,
    distributed: DistributedOpt = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Perplexity of FILE as llama.cpp's perplexity tool computes it: chunks of --ctx
    tokens from an empty context, the second half of each scored."""
    from tqdm import tqdm

    from llamay.eval import perplexity as run_perplexity

    if ctx % 2:  # half of each chunk is scored: refused before the model loads
        _err(f"error: --ctx must be an even number of at least 4, not {ctx}")
        raise typer.Exit(code=1)
    try:
        m = load_model(model, numerics, max(ctx, 1), mesh, distributed, flash_attn)
        text = file.read_text(encoding="utf-8", errors="replace")
        bar = tqdm(total=None, unit="chunk", file=sys.stderr, disable=as_json)

        def progress(done: int, total: int, ppl: float) -> None:
            bar.total = total
            bar.update(done - bar.n)
            bar.set_postfix(ppl=f"{ppl:.4f}")

        t0 = time.perf_counter()
        r = run_perplexity(m, text, ctx=ctx, batch=batch, max_chunks=chunks, progress=progress)
        bar.close()
        seconds = time.perf_counter() - t0
    except LlamayError as exc:
        _err(f"error: {exc}")
        raise typer.Exit(code=1) from None
    scored = r.n_chunks * r.scored_per_chunk
    if as_json:
        fa = m.config.flash_attn
        print(json.dumps({**r.to_json(), "ctx": ctx, "numerics": numerics, "flash_attn": fa,
                          "seconds": seconds}))  # fmt: skip
        return
    print("".join(f"[{i + 1}]{p:.4f}," for i, p in enumerate(r.running_ppl)))  # llama.cpp's
    print(f"Final estimate: PPL = {r.ppl:.4f} +/- {r.uncertainty:.5f}")
    _err(
        f"[llamay] {r.n_tokens} tokens, {r.n_chunks} chunks of {ctx}, {scored} scored; "
        f"{seconds:.1f}s ({r.n_chunks * ctx / seconds:.1f} tokens/s evaluated)"
    )


@eval_app.command(
    "lm-eval",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def lm_eval_cmd(ctx: typer.Context) -> None:
    """lm-evaluation-harness's command line with the `llamay` model registered.

    For example: llamay eval lm-eval --model llamay --model_args model=smollm2:135m
    --tasks hellaswag (needs lm-eval: install llamay's eval extra)."""
    try:
        from llamay.eval.lm_eval_adapter import main
    except ImportError as exc:
        _err(f"error: lm-eval is not installed ({exc}); pip install 'llamay[eval]'")
        raise typer.Exit(code=1) from None
    sys.argv = ["lm_eval", *ctx.args]
    main()


@eval_app.command("lm-eval-plugin")
def lm_eval_plugin(
    remove: Annotated[bool, typer.Option("--remove", help="Take the hook out again.")] = False,
) -> None:
    """Let lm-eval's own `lm_eval` command find `--model llamay`.

    Writes a one-line .pth hook into this Python's site-packages (lm-eval 0.4.13 has no
    plugin discovery; see llamay/eval/lm_eval_hook.py)."""
    from llamay.eval.lm_eval_hook import install_pth, remove_pth

    if remove:
        path = remove_pth()
        print(f"removed {path}" if path else "no hook was installed")
    else:
        print(f"wrote {install_pth()}: `lm_eval --model llamay ...` now works")


def register(app: typer.Typer) -> None:
    """Add `llamay eval ...` to `app`."""
    app.add_typer(eval_app, name="eval")
