"""`llamay serve`: the HTTP server (OpenAI, Anthropic, Ollama, llama.cpp-native and context
APIs) over llamay's engine."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

DEFAULT_PORT = 11435


def parse_models(specs: list[str]) -> dict[str, str]:
    """`-m` values → {name: path or store name}: `NAME=PATH`, a path (named by its file
    stem), or a store name (named as itself)."""
    out: dict[str, str] = {}
    for spec in specs:
        name, sep, target = spec.partition("=")
        if not sep:
            target = spec
            p = Path(spec).expanduser()
            name = p.stem if p.suffix == ".gguf" or p.is_file() else spec
        if not name or not target:
            raise typer.BadParameter(f"--model {spec!r}: expected NAME=PATH, a path or a name")
        out[name] = target
    return out


def _resolve_all(models: dict[str, str]) -> dict[str, Path]:
    from llamay.store import resolve

    return {name: resolve(target) for name, target in models.items()}


def register(app: typer.Typer) -> None:
    @app.command()
    def serve(
        model: Annotated[
            list[str] | None,
            typer.Option(
                "--model",
                "-m",
                help="A model to serve: NAME=PATH, a .gguf path or "
                "a store name (repeatable). Store models load on demand too.",
            ),
        ] = None,
        host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")] = (
            "127.0.0.1"
        ),
        port: Annotated[int, typer.Option(min=0, max=65535)] = DEFAULT_PORT,
        api_key: Annotated[
            str | None,
            typer.Option(
                "--api-key",
                envvar="LLAMAY_API_KEY",
                help="Require this key (Authorization: Bearer or x-api-key).",
            ),
        ] = None,
        parallel: Annotated[int, typer.Option(min=1, help="Sequences decoded together.")] = 8,
        ctx: Annotated[
            int | None, typer.Option("--ctx", "-c", min=1, help="Context length per model.")
        ] = None,
        keep_alive: Annotated[
            float, typer.Option(help="Seconds an idle model stays loaded (negative: forever).")
        ] = 300.0,
        max_tokens: Annotated[
            int | None,
            typer.Option("--max-tokens", min=1, help="The most tokens one request may generate."),
        ] = None,
        no_store: Annotated[
            bool,
            typer.Option(
                "--no-store", help="Serve only the --model models, not the local store's."
            ),
        ] = False,
    ) -> None:
        """Serve models over HTTP: OpenAI, Anthropic, Ollama and llama.cpp-compatible APIs."""
        import uvicorn

        from llamay.errors import LlamayError
        from llamay.serve import create_app
        from llamay.serve.models import Models

        try:
            configured = _resolve_all(parse_models(model or []))
        except LlamayError as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise typer.Exit(code=1) from None
        if host not in ("127.0.0.1", "localhost", "::1") and not api_key:
            print(f"warning: serving on {host} without --api-key", file=sys.stderr)
        models = Models(
            configured,
            n_ctx=ctx,
            parallel=parallel,
            default_keep_alive=keep_alive,
            use_store=not no_store,
        )
        app_ = create_app(models, api_key=api_key, max_tokens_limit=max_tokens)
        print(
            f"[llamay] serving {', '.join(configured) or 'the store'} on http://{host}:{port}",
            file=sys.stderr,
        )
        uvicorn.run(app_, host=host, port=port, log_level="warning")
