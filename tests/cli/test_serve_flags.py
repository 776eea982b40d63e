"""`llamay serve --allow-local-files` is what lets `/api/create` read a file on the server;
without it the server refuses (tests/store/test_store_create_http.py drives both)."""

from __future__ import annotations

import pytest
import uvicorn
from typer.testing import CliRunner

from llamay_cli.main import app


@pytest.mark.parametrize(("args", "allowed"), [([], False), (["--allow-local-files"], True)])
def test_allow_local_files_reaches_the_server(monkeypatch, tmp_path, args, allowed) -> None:
    monkeypatch.setenv("LLAMAY_HOME", str(tmp_path))
    served = []

    def serve(app_, *args, **kwargs):
        served.append(app_)

    # whichever way the command starts the server (uvicorn.run, or serve.app's wrapper)
    monkeypatch.setattr(uvicorn, "run", serve)
    monkeypatch.setattr("llamay.serve.app.run_server", serve, raising=False)
    r = CliRunner().invoke(app, ["serve", "--no-store", *args])
    assert r.exit_code == 0, r.output
    [server] = served
    assert server.state.llamay.extra.get("allow_local_files", False) is allowed


@pytest.mark.parametrize("flag", ["--ctx", "--ctx-size", "-c"])
def test_the_context_flag_has_llama_servers_name_too(monkeypatch, tmp_path, flag) -> None:
    monkeypatch.setenv("LLAMAY_HOME", str(tmp_path))
    served = []
    monkeypatch.setattr(uvicorn, "run", lambda app_, *a, **k: served.append(app_))
    monkeypatch.setattr(
        "llamay.serve.app.run_server", lambda app_, *a, **k: served.append(app_), raising=False
    )
    r = CliRunner().invoke(app, ["serve", "--no-store", flag, "321"])
    assert r.exit_code == 0, r.output
    [server] = served
    assert server.state.llamay.models.n_ctx == 321
