"""The store commands of the CLI: list, rm, cp, gc (registry-free, with catalogue fakes)."""

from __future__ import annotations

import os

from typer.testing import CliRunner

import llamay.store as store
from llamay_cli.main import app


def _run(*args: str):
    return CliRunner().invoke(app, list(args))


def test_list_rm_cp_gc(env, fake_model, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "none"))
    r = _run("list")
    assert r.exit_code == 0 and "no models in the store yet" in r.stderr
    m = fake_model()
    store.pull(m.name, progress=False)
    r = _run("cp", m.name, "other/copy:v2")
    assert r.exit_code == 0 and "copied 'fake:1' to 'other/copy:v2'" in r.stdout
    r = _run("list")
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["NAME", "ID", "SIZE", "MODIFIED"]
    assert [ln.split()[0] for ln in lines[1:]] == ["fake:1", "other/copy:v2"]
    assert all(m.sha256[:12] in ln for ln in lines[1:])
    r = _run("rm", "fake:1")
    assert r.exit_code == 0 and "deleted 'fake:1'" in r.stdout
    assert store.resolve("other/copy:v2", progress=False).read_bytes() == m.payload
    r = _run("rm", "fake:1")
    assert r.exit_code == 1 and "not in the store" in r.stderr
    r = _run("cp", "nope:1", "x:1")
    assert r.exit_code == 1 and "not (completely) in the store" in r.stderr
    r = _run("rm", "../evil")
    assert r.exit_code == 1 and "invalid model name" in r.stderr
    orphan = env.home / "blobs" / ("sha256-" + "a" * 64)
    orphan.write_bytes(b"x")
    os.utime(orphan, (0, 0))
    r = _run("gc")
    assert r.exit_code == 0 and f"removed {orphan.name}" in r.stdout
    assert not orphan.exists()
    r = _run("rm", "other/copy:v2")
    assert r.exit_code == 0 and env.files() == []


def test_ps_asks_a_running_server(monkeypatch) -> None:
    import http.server
    import json
    import threading

    class Api(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            assert self.path == "/api/ps"
            body = json.dumps(
                {
                    "models": [
                        {
                            "name": "smollm2:135m",
                            "digest": "b179c9523d0e6a0f98a3",
                            "size": 98_362_432,
                            "context_length": 2048,
                            "expires_at": "2026-01-01T00:05:00Z",
                        }
                    ]
                }
            ).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("LLAMAY_HOST", f"127.0.0.1:{server.server_address[1]}")
        r = _run("ps")
        assert r.exit_code == 0, r.output
        lines = r.stdout.splitlines()
        assert lines[0].split() == ["NAME", "ID", "SIZE", "CONTEXT", "UNTIL"]
        assert lines[1].split() == [
            "smollm2:135m",
            "b179c9523d0e",
            "98.4",
            "MB",
            "2048",
            "2026-01-01T00:05:00Z",
        ]
    finally:
        server.shutdown()
        server.server_close()
    r = _run("ps", "--host", f"127.0.0.1:{server.server_address[1]}")
    assert r.exit_code == 1 and "no llamay server answered" in r.stderr
