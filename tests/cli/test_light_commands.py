"""Commands that run no model never load JAX (`--help`, `list`, `rm`, `gc`, `modelfile`
errors): checked in a fresh interpreter, where nothing else has imported it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

_PROBE = """
import json, sys
from typer.testing import CliRunner
from llamay_cli.main import app
r = CliRunner().invoke(app, sys.argv[1:])
print(json.dumps({"exit": r.exit_code, "jax": "jax" in sys.modules}))
"""


@pytest.mark.parametrize(
    "args", [["--help"], ["list"], ["gc"], ["rm", "nothere:1"], ["modelfile", "nothere:1"]]
)
def test_light_commands_do_not_load_jax(tmp_path, args) -> None:
    env = dict(os.environ, LLAMAY_HOME=str(tmp_path), OLLAMA_MODELS=str(tmp_path / "none"))
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, *args], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["jax"] is False, args
    assert result["exit"] == (0 if args[0] in ("--help", "list", "gc") else 1)


def _help(args: list[str]) -> list[str]:
    from typer.testing import CliRunner

    from llamay_cli.main import app

    r = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert r.exit_code == 0, r.output
    return r.output.splitlines()


def _panel(lines: list[str], title: str) -> list[str]:
    start = next(i for i, s in enumerate(lines) if f"─ {title} " in s)
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("╰"))
    return [s.rstrip()[2:-1].rstrip() for s in lines[start + 1 : end]]  # "│ " ... "│"


def _commands(args: list[str]) -> dict[str, str]:
    rows = _panel(_help(args), "Commands")
    # a row whose first column is blank continues the summary above it
    assert all(not r.startswith(" ") for r in rows), rows
    return dict(r.split(None, 1) for r in rows)


def test_the_command_lists_give_each_command_one_line() -> None:
    import inspect

    from llamay_cli.main import app

    top = _commands([])
    assert set(top) == {c.name or c.callback.__name__ for c in app.registered_commands} | {
        g.name for g in app.registered_groups
    }
    for group in app.registered_groups:
        sub = _commands([group.name])
        for info in group.typer_instance.registered_commands:
            name = info.name or info.callback.__name__.replace("_", "-")
            first = " ".join(inspect.getdoc(info.callback).split("\n\n")[0].split())
            assert first.startswith(sub[name].rstrip("."))


def test_a_commands_help_reflows_its_docstring_to_the_terminal() -> None:
    """`warmup`'s second paragraph is wrapped at 88 columns in the source: at 200 each of
    its lines but the last is filled past 170."""
    lines = _help(["warmup"])
    usage = next(i for i, s in enumerate(lines) if s.strip().startswith("Usage:"))
    body = [
        s.strip()
        for s in lines[usage + 1 : next(i for i, s in enumerate(lines) if "─ Arguments" in s)]
    ]
    paragraphs = [p for p in "\n".join(body).split("\n\n") if p.strip()]
    assert len(paragraphs) == 2, body
    second = paragraphs[1].strip().splitlines()
    assert len(second) >= 2 and all(len(s) > 170 for s in second[:-1]), second


def test_every_option_and_argument_says_what_it_does() -> None:
    import typer.main

    from llamay_cli.main import app

    def bare(command, path):
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                yield from bare(sub, [*path, name])
        else:
            for p in command.params:
                if not getattr(p, "help", None):
                    yield " ".join(path), p.opts

    assert list(bare(typer.main.get_command(app), ["llamay"])) == []
