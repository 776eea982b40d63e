"""The chat page at `/` in headless Chromium against a real server (issue 19): a test
types a message, sees the streamed answer (equal to Model.generate at temperature 0) and
stops a long one mid-way (the engine then goes idle). Chromium is driven over the
DevTools protocol on a pipe (`--remote-debugging-pipe`: JSON messages ending in NUL on
file descriptors 3 and 4), so no driver package is needed; CI installs Debian's chromium,
and a machine without one skips (the docs browser test does the same)."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import time

import httpx
import pytest

from tests.docs.test_docs_browser import browser
from tests.serve.conftest import chat_prompt, greedy, wait_idle


class Chromium:
    """A headless Chromium with one page, driven over the DevTools pipe."""

    def __init__(self, profile):
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()

        argv = [browser(), "--headless", "--no-sandbox", "--disable-gpu"]
        argv += ["--disable-dev-shm-usage", "--no-first-run", "--remote-debugging-pipe"]
        argv += [f"--user-data-dir={profile}", "about:blank"]
        # the browser reads commands on fd 3 and answers on fd 4; bash puts them there
        # from copies far above both (so neither end can be clobbered on the way)
        r = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD_CLOEXEC, 100)
        w = fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD_CLOEXEC, 100)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        to_chrome_r, from_chrome_w = r, w
        script = f'exec "$0" "$@" 3<&{r} 4>&{w} {r}<&- {w}>&-'
        self.proc = subprocess.Popen(
            ["/bin/bash", "-c", script, *argv],
            pass_fds=(to_chrome_r, from_chrome_w),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._id, self._buf, self.session = 0, b"", None
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)[
            "sessionId"
        ]

    def call(self, method: str, **params):
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params}
        if self.session is not None and not method.startswith("Target."):
            msg["sessionId"] = self.session
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        while True:
            while b"\0" not in self._buf:
                chunk = os.read(self._from_chrome, 1 << 16)
                assert chunk, "chromium closed its DevTools pipe"
                self._buf += chunk
            raw, self._buf = self._buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._id:
                assert "error" not in reply, reply
                return reply["result"]

    def js(self, expression: str):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in r, r
        return r["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 120.0):
        deadline = time.monotonic() + timeout
        while not (value := self.js(expression)):
            assert time.monotonic() < deadline, f"timed out waiting for {expression}"
            time.sleep(0.1)
        return value

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)
        os.close(self._to_chrome)
        os.close(self._from_chrome)


@pytest.fixture
def page(server, tmp_path):
    chrome = Chromium(tmp_path / "profile")
    try:
        chrome.call("Page.navigate", url=server.url + "/")
        chrome.wait_for("document.body && document.body.dataset.ready === '1'")
        yield chrome
    finally:
        chrome.close()


LAST = "[...document.querySelectorAll('.msg.assistant')].at(-1)"


def type_and_send(page: Chromium, text: str) -> None:
    page.js("document.getElementById('prompt').focus()")
    page.call("Input.insertText", text=text)  # as typing does
    page.js("document.getElementById('send').click()")


def test_chat_page_streams_and_stops(page, server, tiny):
    assert httpx.get(server.url + "/").text == "llamay is running"  # not a browser
    models = page.js("[...document.querySelectorAll('#model option')].map(o => o.value)")
    assert "tiny" in models
    page.js("document.getElementById('model').value = 'tiny'")
    page.js("document.getElementById('temperature').value = '0'")
    page.js("document.getElementById('max_tokens').value = '8'")
    type_and_send(page, "Hello there")
    page.wait_for(f"{LAST} && {LAST}.dataset.state === 'done'")
    answer = page.js(f"{LAST}.textContent")
    msgs = [{"role": "user", "content": "Hello there"}]
    assert answer == greedy(tiny, chat_prompt(tiny, msgs), 8)
    assert page.js(f"{LAST}.dataset.finish") == "length"

    # a long answer, stopped once it has started streaming
    page.js("document.getElementById('max_tokens').value = '250'")
    type_and_send(page, "Tell me a long story")
    page.wait_for(f"{LAST}.dataset.state === 'streaming' && {LAST}.textContent.length > 0")
    page.js("document.getElementById('stop').click()")
    page.wait_for(f"{LAST}.dataset.state === 'stopped'")
    stopped = page.js(f"{LAST}.textContent")
    stats = wait_idle(server.state)  # the stop cancelled the generation in the engine
    assert stats["tiny"]["active"] == 0
    time.sleep(0.5)
    assert page.js(f"{LAST}.textContent") == stopped  # nothing arrives after the stop
    assert page.js("document.getElementById('send').disabled") is False
