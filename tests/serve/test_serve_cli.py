"""`llamay serve` as a process: binds loopback, serves the -m models under their names,
answers the openai client, and stops on SIGINT."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import openai
import pytest

from llamay.serve.app import free_port

pytestmark = pytest.mark.slow


def test_serve_process(tiny_paths, serve_home):
    port = free_port()
    env = {**os.environ, "LLAMAY_HOME": str(serve_home)}
    argv = [
        sys.executable,
        "-m",
        "llamay_cli.main",
        "serve",
        "-m",
        f"t={tiny_paths['tiny']}",
        "--port",
        str(port),
        "--no-store",
        "--max-tokens",
        "4",
        "--api-key",
        "k",
    ]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stdout.read().decode()
            assert time.monotonic() < deadline, "the server did not come up"
            time.sleep(0.3)
        c = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
        assert [m.id for m in c.models.list()] == ["t"]
        r = c.completions.create(model="t", prompt="Hi", max_tokens=50, temperature=0)
        assert r.usage.completion_tokens <= 4  # --max-tokens caps every request
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0).models.list()
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode in (0, -signal.SIGINT, 130)
