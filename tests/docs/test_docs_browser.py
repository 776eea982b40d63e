"""Headless Chromium opens the generated docs and renders the CLI reference (a DOM check of
what the browser built, via `chromium --headless --dump-dom`). Skipped where no Chromium is
installed (CI installs Debian's `chromium`)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "site" / "docs"
sys.path.insert(0, str(REPO / "scripts" / "site"))
import build_docs  # noqa: E402

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")


def browser() -> str:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    pytest.skip(
        f"no headless browser installed (tried {', '.join(BROWSERS)}; apt-get install chromium)"
    )


def dump_dom(page: Path, tmp_path: Path) -> str:
    r = subprocess.run(
        [
            browser(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--virtual-time-budget=2000",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip(), f"chromium rendered nothing: {r.stderr[-2000:]}"
    return r.stdout


class Cells(HTMLParser):
    """Text of the rows of tables with class `cls`, and the ids/data-command of the DOM."""

    def __init__(self, cls: str) -> None:
        super().__init__()
        self.cls, self.depth, self.rows, self.cell = cls, 0, [], None
        self.commands: list[str] = []
        self.stylesheets: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table" and self.cls in (a.get("class") or "").split():
            self.depth = 1
        elif tag == "table" and self.depth:
            self.depth += 1
        if self.depth and tag == "tr":
            self.rows.append([])
        if self.depth and tag in ("td", "th"):
            self.cell = []
        if "data-command" in a:
            self.commands.append(a["data-command"])
        if tag == "link" and a.get("rel") == "stylesheet":
            self.stylesheets.append(a.get("href"))

    def handle_endtag(self, tag):
        if tag == "table" and self.depth:
            self.depth -= 1
        if self.depth and tag in ("td", "th") and self.cell is not None:
            self.rows[-1].append("".join(self.cell).strip())
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell.append(data)


def test_index_renders_the_cli_commands(tmp_path):
    dom = dump_dom(DOCS / "index.html", tmp_path)
    p = Cells("cli-commands")
    p.feed(dom)
    assert p.stylesheets == ["style.css"]
    header, *rows = p.rows
    assert header == ["command", "what it does"]
    _, tree = build_docs.cli_tree()
    want = [" ".join(path) for path, _ in tree if len(path) > 1]
    assert [r[0] for r in rows] == want
    assert all(r[1] for r in rows), "a command without a summary"


def test_cli_reference_renders_every_command_and_option(tmp_path):
    dom = dump_dom(DOCS / "cli.html", tmp_path)
    p = Cells("none")
    p.feed(dom)
    _, tree = build_docs.cli_tree()
    assert p.commands == [" ".join(path[1:]) for path, _ in tree]
    assert "<code>--max-tokens</code>" in dom and "<code>--temperature</code>" in dom


def test_screenshot_is_not_blank(tmp_path):
    shot = tmp_path / "index.png"
    r = subprocess.run(
        [
            browser(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
            "--window-size=1024,768",
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={shot}",
            (DOCS / "index.html").as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and shot.exists(), r.stderr[-2000:]
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 10_000, len(data)
