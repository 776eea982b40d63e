"""scripts/site/build_docs.py: the committed site is up to date, every internal link
resolves, the CLI reference covers the click command tree, and --check catches drift."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "scripts" / "site" / "build_docs.py"
sys.path.insert(0, str(BUILD.parent))
import build_docs  # noqa: E402


def run_build(*args: str, capsys) -> tuple[int, str]:
    """build_docs.py ARGS in this process: (exit status, stdout + stderr)."""
    capsys.readouterr()
    rc = build_docs.main(list(args))
    out = capsys.readouterr()
    return rc, out.out + out.err


@pytest.fixture(scope="module")
def fresh_site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    build_docs.build(out)
    return out


def test_committed_site_is_up_to_date():
    """As CI runs it (`make docs-check`, in a fresh process). In a git checkout the check
    is of the committed tree (`--git HEAD`: what a clean clone sees), so work in progress
    in a shared checkout does not fail it; `make docs-check` checks the working tree."""
    git = (REPO / ".git").exists() and shutil.which("git")
    args = ["--git", "HEAD", "--check"] if git else ["--check"]
    r = subprocess.run(
        [sys.executable, str(BUILD), *args], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, f"{r.stderr}\nsite/ is stale: {build_docs.REGENERATE}"


def test_no_broken_internal_links(fresh_site):
    assert build_docs.check_links(fresh_site) == []


def test_every_page_is_linked_from_the_nav(fresh_site):
    index = (fresh_site / "docs" / "index.html").read_text()
    for name, _ in build_docs.PAGES:
        assert (fresh_site / "docs" / name).exists()
        assert f'href="{name}"' in index


def test_cli_reference_covers_every_command(fresh_site):
    _, tree = build_docs.cli_tree()
    cli = (fresh_site / "docs" / "cli.html").read_text()
    index = (fresh_site / "docs" / "index.html").read_text()
    for path, cmd in tree:
        name = " ".join(path[1:])
        assert f'data-command="{name}"' in cli
        for p in cmd.params:
            for opt in getattr(p, "opts", []):
                if opt.startswith("-"):
                    assert f"<code>{opt}</code>" in cli, f"{name}: option {opt} missing"
        if name:
            assert f'href="cli.html#{build_docs._cmd_id(path)}"' in index


def test_registry_tables(fresh_site):
    from llamay.arch import REGISTRY
    from llamay.gguf.constants import GGMLType

    arch = (fresh_site / "docs" / "architectures.html").read_text()
    for name in REGISTRY:
        assert f"<code>{name}</code>" in arch
    quant = (fresh_site / "docs" / "quant-types.html").read_text()
    for t in GGMLType:
        assert f'id="type-{build_docs.slug(t.name)}"' in quant


def test_errors_and_catalog_tables(fresh_site):
    from llamay import errors
    from llamay.store.catalog import CATALOG

    api = (fresh_site / "docs" / "python-api.html").read_text()
    for name, cls in vars(errors).items():
        if (
            isinstance(cls, type)
            and issubclass(cls, errors.LlamayError)
            and (cls.__module__ == errors.__name__)
        ):
            assert f'id="err-{build_docs.slug(name)}"' in api, name
    started = (fresh_site / "docs" / "getting-started.html").read_text()
    for name in CATALOG:
        assert f"<code>{name}</code>" in started


def test_install_scripts_are_served(fresh_site):
    for name in ("install.sh", "install.ps1"):
        assert (fresh_site / name).read_text() == (REPO / "packaging" / name).read_text()


def test_pages_are_deterministic(fresh_site, tmp_path):
    again = tmp_path / "again"
    build_docs.build(again)
    for f in sorted(p for p in fresh_site.rglob("*") if p.is_file()):
        assert (again / f.relative_to(fresh_site)).read_bytes() == f.read_bytes(), f


def test_check_fails_on_drift(fresh_site, tmp_path, capsys):
    site = tmp_path / "site"
    shutil.copytree(fresh_site, site)
    assert run_build("--check", "--out", str(site), capsys=capsys)[0] == 0
    cli = site / "docs" / "cli.html"
    cli.write_text(cli.read_text().replace("llamay generate", "llamay generat", 1))
    (site / "docs" / "old-page.html").write_text("<p>stale</p>")
    (site / "docs" / "quant-types.html").unlink()
    rc, out = run_build("--check", "--out", str(site), capsys=capsys)
    assert rc == 1
    assert "docs/cli.html: differs" in out
    assert "docs/old-page.html: stale" in out
    assert "docs/quant-types.html: missing" in out
    assert "regenerate with: make docs" in out


def test_build_writes_and_prunes(fresh_site, tmp_path, capsys):
    site = tmp_path / "site"
    (site / "docs").mkdir(parents=True)
    (site / "README.md").write_text("hand-written")
    (site / "docs" / "old-page.html").write_text("<p>stale</p>")
    assert run_build("--out", str(site), capsys=capsys)[0] == 0
    assert not (site / "docs" / "old-page.html").exists()
    assert (site / "README.md").read_text() == "hand-written"
    assert build_docs.generated_files(site) == build_docs.generated_files(fresh_site)


def test_link_checker_finds_broken_links(tmp_path):
    (tmp_path / "a.html").write_text(
        '<h2 id="here">x</h2><a href="#here">ok</a><a href="b.html#nope">bad frag</a>'
        '<a href="missing.html">bad file</a><a href="https://example.invalid/">external</a>'
        '<a href="../outside.html">outside</a>'
    )
    (tmp_path / "b.html").write_text('<p id="yes">b</p>')
    broken = build_docs.check_links(tmp_path)
    assert broken == [
        "a.html: b.html#nope (no id 'nope' in b.html)",
        "a.html: missing.html (no such file)",
        "a.html: ../outside.html leaves the site",
    ]


def test_http_reference_pending_until_the_server_has_a_spec():
    html = build_docs.http_api_page("0", None)["http-api.html"]
    assert 'id="http-pending"' in html and "Pending." in html


def test_http_reference_from_an_openapi_spec(tmp_path):
    spec = {
        "openapi": "3.1.0",
        "info": {"title": "llamay", "version": "0.1.0"},
        "paths": {
            "/v1/chat/completions": {
                "post": {
                    "summary": "Create a chat completion",
                    "requestBody": {
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/ChatRequest"}
                            }
                        }
                    },
                    "responses": {"200": {"description": "OK"}},
                }
            },
            "/api/tags": {"get": {"summary": "List models", "responses": {}}},
        },
        "components": {
            "schemas": {
                "ChatRequest": {
                    "properties": {"model": {"type": "string"}, "messages": {"type": "array"}},
                    "required": ["model"],
                }
            }
        },
    }
    pages = build_docs.http_api_page("0", spec)
    assert set(pages) == {"http-api.html", "openapi.json"}
    html = pages["http-api.html"]
    assert "POST /v1/chat/completions" in html and "GET /api/tags" in html
    assert html.index("GET /api/tags") < html.index("POST /v1/chat/completions")
    assert 'href="#schema-chatrequest"' in html and 'id="schema-chatrequest"' in html
    docs = tmp_path / "docs"
    docs.mkdir()
    for name, text in pages.items():
        (docs / name).write_text(text)
    (docs / "style.css").write_text("")
    # links to the other pages of the site aside, every link resolves
    broken = [b for b in build_docs.check_links(tmp_path) if not b.endswith("(no such file)")]
    assert broken == []


def test_markdown_subset():
    h = build_docs.Headings()
    out = build_docs.markdown(
        "# Title\n\nSome `code` and [a link](x.html#y), **bold** <b>.\n\n"
        "- one\n- two\n  continued\n\n1. first\n2. second\n\n"
        "```sh\necho <hi>\n```\n\n    indented\n\n| a | b |\n|---|---|\n| `1` | 2 |\n",
        h,
    )
    assert '<h1 id="title">Title</h1>' in out
    assert "<code>code</code>" in out and '<a href="x.html#y">a link</a>' in out
    assert "<strong>bold</strong> &lt;b&gt;." in out
    assert "<ul><li>one</li><li>two continued</li></ul>" in out
    assert "<ol><li>first</li><li>second</li></ol>" in out
    assert '<pre><code class="language-sh">echo &lt;hi&gt;</code></pre>' in out
    assert "<pre><code>indented</code></pre>" in out
    assert "<td><code>1</code></td><td>2</td>" in out


def test_drift_report_shows_where_long_lines_differ():
    a, b = "-" + "x" * 500 + "OLD" + "y" * 500, "+" + "x" * 500 + "NEW" + "y" * 500
    short = build_docs._short([" context", a, b])
    assert short[0] == " context"
    assert "OLD" in short[1] and "NEW" in short[2]
    assert all(len(s) < 260 for s in short)
