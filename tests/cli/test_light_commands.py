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
