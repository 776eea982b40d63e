"""Store commands of the `llamay` CLI: `list` (ours and, marked, Ollama's), `rm`, `cp`, `gc`,
`create` (from a Modelfile), `run` (with a model's layers applied), `modelfile` and `ps`
(the models a running server has loaded).

`register(app)` adds them to the Typer app; its `list` replaces the plain one in `main.py`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from llamay.errors import LlamayError, ModelNotFoundError
from llamay_cli.serve_cmds import ImageOpt, MmprojOpt, image_prompt


def _err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _fail(exc: LlamayError) -> typer.Exit:
    _err(f"error: {exc}")
    return typer.Exit(code=1)


def _size(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def _ago(when) -> str:  # noqa: ANN001
    from datetime import UTC, datetime

    s = (datetime.now(UTC) - when).total_seconds()
    for unit, sec in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if s >= sec:
            n = int(s // sec)
            return f"{n} {unit}{'s' if n > 1 else ''} ago"
    return "just now"


def list_cmd(
    ollama: Annotated[
        bool, typer.Option("--ollama/--no-ollama", help="Also list the local Ollama store.")
    ] = True,
) -> None:
    """List the models in the local store and, marked `(ollama)`, in a local Ollama store."""
    from llamay.store import list_models

    rows = [(e.name, e.digest[7:19], _size(e.size), _ago(e.modified)) for e in list_models()]
    if ollama:
        from llamay.ollama import find_store
        from llamay.ollama import list_models as ollama_list

        root = find_store()
        if root is not None:
            for m in ollama_list(root):
                rows.append((f"{m.name} (ollama)", m.digest[7:19], _size(m.size), _ago(m.modified)))
    if not rows:
        _err("no models in the store yet (try: llamay pull smollm2:135m)")
        return
    width = max(28, *(len(r[0]) + 2 for r in rows))
    print(f"{'NAME':<{width}}{'ID':<14}{'SIZE':<10}MODIFIED")
    for name, ident, size, mod in rows:
        print(f"{name:<{width}}{ident:<14}{size:<10}{mod}")


def rm(
    names: Annotated[list[str], typer.Argument(help="Model names to remove from the store.")],
) -> None:
    """Remove models from the store (blobs still used by another name stay)."""
    from llamay.store import remove

    for name in names:
        try:
            remove(name)
        except LlamayError as exc:
            raise _fail(exc) from None
        print(f"deleted '{name}'")


def cp(
    source: Annotated[str, typer.Argument(help="A model in the store.")],
    destination: Annotated[str, typer.Argument(help="The new name.")],
) -> None:
    """Give a stored model a second name (no data is copied)."""
    from llamay.store import copy

    try:
        copy(source, destination)
    except LlamayError as exc:
        raise _fail(exc) from None
    print(f"copied '{source}' to '{destination}'")


def gc() -> None:
    """Remove blobs that no model in the store references, and partial downloads and
    snapshot saves that no live process is writing."""
    from llamay.store import gc as store_gc

    try:
        removed = store_gc()
    except LlamayError as exc:
        raise _fail(exc) from None
    for p in removed:
        print(f"removed {p.name}")
    _err(f"{len(removed)} unreferenced blob(s) and dead partial file(s) removed")


def create(
    name: Annotated[str, typer.Argument(help="The new model's name.")],
    file: Annotated[
        Path, typer.Option("--file", "-f", help="The Modelfile (FROM, TEMPLATE, SYSTEM, ...).")
    ] = Path("Modelfile"),
) -> None:
    """Create a model from a Modelfile: FROM a GGUF path or a model, plus TEMPLATE, SYSTEM,
    PARAMETER and LICENSE."""
    from llamay.library import create as store_create

    try:
        text = file.read_text(encoding="utf-8")
    except OSError as e:
        _err(f"error: cannot read the Modelfile {file}: {e}")
        raise typer.Exit(code=1) from None
    try:
        entry = store_create(name, text, directory=file.parent, progress=True)
    except LlamayError as exc:
        raise _fail(exc) from None
    print(f"created '{entry.name}'")


def run(
    name: Annotated[
        str,
        typer.Argument(
            help="A model of the store: with layers (a registry pull, a model made by "
            "`create`, one of Ollama's) or without (its GGUF chat template applies)."
        ),
    ],
    prompt: Annotated[str, typer.Argument(help="The user's message.")],
    system: Annotated[str | None, typer.Option(help="Replace the system layer.")] = None,
    raw: Annotated[bool, typer.Option("--raw", help="Do not apply the template.")] = False,
    max_tokens: Annotated[
        int | None,
        typer.Option("--max-tokens", "-n", min=0, help="The most tokens to generate."),
    ] = None,
    temperature: Annotated[
        float | None, typer.Option("--temperature", min=0.0, help="0: greedy.")
    ] = None,
    seed: Annotated[
        int | None, typer.Option("--seed", "-s", help="Seed of the draws (default: a new one).")
    ] = None,
    mmproj: MmprojOpt = None,
    image: ImageOpt = None,
) -> None:
    """Generate with a model's template, system and params layers applied (as `ollama run`
    does for one prompt); options given here override the params layer. `--image` gives
    the message images (before its text unless it has `<__media__>` markers), read by the
    model's projector layer or `--mmproj`."""
    from llamay import library, ollama

    overrides = {
        k: v
        for k, v in (("max_tokens", max_tokens), ("temperature", temperature), ("seed", seed))
        if v is not None
    }
    prompt, images = image_prompt(prompt, image)
    if images:
        overrides["images"] = images
    try:
        try:
            model, om = library.load(name, mmproj=mmproj)
            pieces = ollama.generate(
                model, om, prompt, system=system, raw=raw, stream=True, **overrides
            )
        except ModelNotFoundError as layered:
            try:
                pieces = _run_plain(name, prompt, system, raw, overrides, mmproj)
            except ModelNotFoundError:
                raise layered from None
        for piece in pieces:
            sys.stdout.write(piece)
            sys.stdout.flush()
    except LlamayError as exc:
        raise _fail(exc) from None
    sys.stdout.write("\n")


def _run_plain(name: str, prompt: str, system: str | None, raw: bool, overrides: dict, mmproj=None):
    """A model without layers (a wheel-fetched default, a GGUF file): its GGUF chat
    template formats the prompt, as `ollama run` does with the template a pull brings."""
    import llamay
    from llamay.ollama import gguf_chat_prompt

    model = llamay.load(name, mmproj=mmproj)
    if raw:
        text = prompt
    else:
        text = gguf_chat_prompt(model, prompt, system)
    return model.generate(text, stream=True, **overrides)


def modelfile(
    name: Annotated[str, typer.Argument(help="A model with layers (see `run`).")],
) -> None:
    """Print a model's Modelfile: its blob, template, system prompt, parameters, license."""
    from llamay import library, ollama

    try:
        print(ollama.to_modelfile(library.layered_model(name)), end="")
    except LlamayError as exc:
        raise _fail(exc) from None


def _server_url(host: str | None) -> str:
    import os

    from llamay_cli.serve_cmds import DEFAULT_PORT

    url = host or os.environ.get("LLAMAY_HOST") or f"127.0.0.1:{DEFAULT_PORT}"
    return url if "://" in url else f"http://{url}"


def ps(
    host: Annotated[
        str | None,
        typer.Option(help="The server (default $LLAMAY_HOST, else 127.0.0.1:<serve's port>)."),
    ] = None,
) -> None:
    """List the models loaded in a running `llamay serve` (its /api/ps)."""
    import json
    import urllib.error
    import urllib.request

    url = _server_url(host) + "/api/ps"
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            models = json.loads(r.read()).get("models", [])
    except (urllib.error.URLError, OSError, ValueError, AttributeError) as e:
        _err(f"error: no llamay server answered at {url} ({e}); start one with `llamay serve`")
        raise typer.Exit(code=1) from None
    rows = [
        (
            m.get("name", "?"),
            str(m.get("digest", ""))[:12],
            _size(int(m.get("size") or 0)),
            str(m.get("context_length", "")),
            str(m.get("expires_at", "")),
        )
        for m in models
    ]
    width = max([28] + [len(r[0]) + 2 for r in rows])
    print(f"{'NAME':<{width}}{'ID':<14}{'SIZE':<10}{'CONTEXT':<9}UNTIL")
    for name, ident, size, ctx, until in rows:
        print(f"{name:<{width}}{ident:<14}{size:<10}{ctx:<9}{until}")


def register(app: typer.Typer) -> None:
    """Add the store commands to `app` (replacing a `list` registered before)."""
    app.registered_commands[:] = [c for c in app.registered_commands if c.name != "list"]
    app.command("list")(list_cmd)
    app.command("rm")(rm)
    app.command("cp")(cp)
    app.command("gc")(gc)
    app.command("create")(create)
    app.command("run")(run)
    app.command("modelfile")(modelfile)
    app.command("ps")(ps)
