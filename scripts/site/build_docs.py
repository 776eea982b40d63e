"""Generate the static site under `site/` from the repository.

    python scripts/site/build_docs.py            # (re)write site/
    python scripts/site/build_docs.py --check    # regenerate into a temp dir, fail on any diff
    python scripts/site/build_docs.py --git HEAD # build what HEAD commits (a shared checkout)
    python scripts/site/build_docs.py --git HEAD --check   # is HEAD's site up to date?

What is generated (every page deterministic: no timestamps, sorted tables):

- `site/docs/index.html`: the overview and the table of CLI commands;
- `site/docs/cli.html`: the CLI reference, walked from the Typer app's click command tree;
- `site/docs/python-api.html`: the public Python API, from signatures and docstrings;
- `site/docs/http-api.html` (+ `openapi.json`): the HTTP API, from `llamay.serve`'s OpenAPI
  spec once the server exists (until then the page says the reference is pending);
- `site/docs/architectures.html`, `site/docs/quant-types.html`: tables read from
  `llamay.arch.REGISTRY`, `llamay.gguf.constants` and `llamay.quant`;
- one page per hand-written Markdown file in `docs/` (getting started, install, design);
- `site/index.html` (the landing page) and `site/install.sh`, `site/install.ps1` (copies of
  `packaging/`, so the site serves the install scripts it documents).

Every internal link (href/src, with its #fragment) is checked after writing; a broken one
fails the build. The Markdown renderer is a small, dependency-free subset (headings,
paragraphs, lists, fenced and indented code, pipe tables, inline code, links, emphasis).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import html
import importlib
import inspect
import io
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable
from html.parser import HTMLParser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "site"
DOCS_SRC = ROOT / "docs"
REGENERATE = (
    "make docs (from a shared checkout others are editing, build what is committed: "
    ".venv/bin/python scripts/site/build_docs.py --git HEAD), then commit site/"
)
# Files under site/ that are written by hand, not generated (left alone by the build).
HAND_WRITTEN = {"README.md"}

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# -- HTML helpers ------------------------------------------------------------------------

esc = html.escape


def slug(text: str) -> str:
    s = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return s or "section"


def inline(text: str) -> str:
    """Inline Markdown: `code`, [text](url), **bold**, *em*; everything else escaped."""
    out, pos = [], 0
    pattern = re.compile(r"`([^`]+)`|\[([^\]]+)\]\(([^)\s]+)\)|\*\*([^*]+)\*\*|\*([^*\s][^*]*)\*")
    for m in pattern.finditer(text):
        out.append(esc(text[pos : m.start()]))
        code, label, url, bold, em = m.groups()
        if code is not None:
            out.append(f"<code>{esc(code)}</code>")
        elif label is not None:
            out.append(f'<a href="{esc(url)}">{inline(label)}</a>')
        elif bold is not None:
            out.append(f"<strong>{inline(bold)}</strong>")
        else:
            out.append(f"<em>{inline(em)}</em>")
        pos = m.end()
    out.append(esc(text[pos:]))
    return "".join(out)


class Headings:
    """Unique ids for the headings of one page."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}
        self.toc: list[tuple[int, str, str]] = []

    def id_for(self, text: str, level: int = 2, wanted: str | None = None) -> str:
        base = wanted or slug(text)
        n = self.seen.get(base, 0)
        self.seen[base] = n + 1
        hid = base if n == 0 else f"{base}-{n}"
        self.toc.append((level, hid, text))
        return hid


def markdown(text: str, heads: Headings, shift: int = 0) -> str:
    """A small Markdown subset to HTML (see the module docstring)."""
    lines = text.splitlines()
    out: list[str] = []
    i = 0

    def is_block_start(s: str) -> bool:
        return bool(
            s.startswith(("#", "```", "|"))
            or re.match(r"\s*([-*]|\d+\.)\s", s)
            or s.startswith("    ")
        )

    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        if line.startswith("```"):
            lang = line[3:].strip()
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            body = "\n".join(lines[i + 1 : j])
            cls = f' class="language-{esc(lang)}"' if lang else ""
            out.append(f"<pre><code{cls}>{esc(body)}</code></pre>")
            i = j + 1
            continue
        m = re.match(r"(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if m:
            level = min(6, len(m.group(1)) + shift)
            title = m.group(2)
            hid = heads.id_for(re.sub(r"[`*]", "", title), level)
            out.append(f'<h{level} id="{hid}">{inline(title)}</h{level}>')
            i += 1
            continue
        if line.startswith("    "):
            j = i
            block = []
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                block.append(lines[j][4:])
                j += 1
            while block and not block[-1].strip():
                block.pop()
            out.append(f"<pre><code>{esc(chr(10).join(block))}</code></pre>")
            i = j
            continue
        if line.startswith("|"):
            rows = []
            while i < len(lines) and lines[i].startswith("|"):
                rows.append([c.strip() for c in lines[i].strip().strip("|").split("|")])
                i += 1
            head, body = (
                rows[0],
                [r for r in rows[1:] if not all(re.fullmatch(r":?-+:?", c) for c in r)],
            )
            out.append(table(head, body, raw=False))
            continue
        lm = re.match(r"(\s*)([-*]|\d+\.)\s+(.*)", line)
        if lm:
            ordered = lm.group(2)[0].isdigit()
            items: list[str] = []
            while i < len(lines):
                im = re.match(r"\s*([-*]|\d+\.)\s+(.*)", lines[i])
                if im and (im.group(1)[0].isdigit()) == ordered:
                    items.append(im.group(2))
                elif lines[i].startswith("  ") and lines[i].strip() and items:
                    items[-1] += " " + lines[i].strip()
                else:
                    break
                i += 1
            tag = "ol" if ordered else "ul"
            out.append(f"<{tag}>" + "".join(f"<li>{inline(t)}</li>" for t in items) + f"</{tag}>")
            continue
        para = [line.strip()]
        i += 1
        while i < len(lines) and lines[i].strip() and not is_block_start(lines[i]):
            para.append(lines[i].strip())
            i += 1
        out.append(f"<p>{inline(' '.join(para))}</p>")
    return "\n".join(out)


def table(head: list[str], rows: Iterable[list[str]], raw: bool = True, cls: str = "") -> str:
    """An HTML table; cells are HTML when `raw`, else inline Markdown."""
    cell = (lambda c: c) if raw else inline
    attr = f' class="{cls}"' if cls else ""
    th = "".join(f"<th>{cell(h)}</th>" for h in head)
    trs = "".join("<tr>" + "".join(f"<td>{cell(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table{attr}><thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table>"


def docstring_html(doc: str | None) -> str:
    """A docstring (Markdown-ish: backticks, indented examples, `- ` lists) as HTML."""
    if not doc:
        return '<p class="muted">(no docstring)</p>'
    return markdown(inspect.cleandoc(doc), Headings(), shift=3)


# -- pages -------------------------------------------------------------------------------

PAGES: list[tuple[str, str]] = [
    ("index.html", "Overview"),
    ("getting-started.html", "Getting started"),
    ("install.html", "Install"),
    ("cli.html", "CLI reference"),
    ("python-api.html", "Python API"),
    ("http-api.html", "HTTP API"),
    ("evaluation.html", "Evaluation"),
    ("vision.html", "Vision models"),
    ("architectures.html", "Architectures"),
    ("quant-types.html", "Quantisation types"),
    ("design.html", "Design"),
    ("architecture.html", "Code architecture"),
]

CSS = """\
:root { --fg: #1d2327; --muted: #5b6770; --accent: #0b5cad; --line: #d9dee2; --code: #f3f5f7; }
* { box-sizing: border-box; }
body { margin: 0; font: 16px/1.55 system-ui, -apple-system, "Segoe UI", sans-serif;
  color: var(--fg); display: flex; min-height: 100vh; }
nav { width: 15rem; flex: none; padding: 1.5rem 1rem; border-right: 1px solid var(--line);
  background: #fafbfc; }
nav .brand { font-weight: 700; font-size: 1.2rem; display: block; margin-bottom: 1rem; }
nav ul { list-style: none; padding: 0; margin: 0; }
nav li a { display: block; padding: .2rem .4rem; border-radius: 4px; }
nav li a.current { background: #e6eef7; font-weight: 600; }
main { flex: 1; max-width: 60rem; padding: 1.5rem 2.5rem 4rem; min-width: 0; }
a { color: var(--accent); text-decoration: none; }
a:hover { text-decoration: underline; }
code, pre { font: 14px/1.45 ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; }
code { background: var(--code); padding: .05rem .25rem; border-radius: 3px; }
pre { background: var(--code); padding: .75rem 1rem; overflow-x: auto; border-radius: 6px; }
pre code { background: none; padding: 0; }
table { border-collapse: collapse; margin: 1rem 0; width: 100%; font-size: 15px; }
th, td { border: 1px solid var(--line); padding: .3rem .5rem; text-align: left;
  vertical-align: top; }
th { background: #f0f3f5; }
td:first-child code { white-space: nowrap; }
.muted { color: var(--muted); }
.sig { background: var(--code); padding: .4rem .6rem; border-left: 3px solid var(--accent);
  font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 14px; overflow-x: auto; }
.api { margin: 0 0 2rem; }
.api .api { margin-left: 1.25rem; }
h1 { margin-top: 0; }
h2 code, h3 code, h4 code { font-size: .95em; }
h2 { border-bottom: 1px solid var(--line); padding-bottom: .2rem; margin-top: 2.2rem; }
footer { margin-top: 3rem; color: var(--muted); font-size: 14px; }
@media (max-width: 760px) {
  body { display: block; }
  nav { width: auto; border-right: none; border-bottom: 1px solid var(--line); padding: 1rem; }
  nav ul { display: flex; flex-wrap: wrap; gap: .25rem; }
  main { padding: 1rem; }
  table { display: block; overflow-x: auto; }
}
"""


def page(name: str, title: str, body: str, heads: Headings, version: str) -> str:
    current = ' class="current"'
    nav = "".join(
        f'<li><a href="{href}"{current if href == name else ""}>{esc(t)}</a></li>'
        for href, t in PAGES
    )
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)} · llamay</title>
<link rel="stylesheet" href="style.css">
</head>
<body>
<nav><a class="brand" href="../index.html">llamay</a><ul>{nav}</ul></nav>
<main>
<h1 id="top">{esc(title)}</h1>
{body}
<footer>llamay {esc(version)} · generated by <code>scripts/site/build_docs.py</code>
from the repository; do not edit by hand.</footer>
</main>
</body>
</html>
"""


# -- CLI reference -----------------------------------------------------------------------


def _subcommands(cmd) -> dict:
    """A group's subcommands (click's `Group.commands`); {} for a plain command."""
    subs = getattr(cmd, "commands", None)
    return subs if isinstance(subs, dict) else {}


def _is_argument(p) -> bool:
    return getattr(p, "param_type_name", "") == "argument"


def cli_tree():
    """The click command tree of the Typer app, as (path, command) pairs, sorted.

    Duck-typed over click's objects (Typer may ship click or its own copy of it).
    """
    import typer.main

    from llamay_cli.main import app

    root = typer.main.get_command(app)

    def walk(cmd, path: list[str]):
        yield path, cmd
        subs = _subcommands(cmd)
        for name in sorted(subs):
            if not getattr(subs[name], "hidden", False):
                yield from walk(subs[name], [*path, name])

    return root, list(walk(root, ["llamay"]))


_TYPE_NAMES = {int: "INTEGER", float: "FLOAT", str: "TEXT", bool: "BOOLEAN", Path: "PATH"}


def _annotation_name(ann) -> str:
    import enum
    import types
    import typing

    origin = typing.get_origin(ann)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        return " | ".join(_annotation_name(a) for a in args)
    if origin in (list, tuple, set):
        args = typing.get_args(ann)
        return _annotation_name(args[0]) if args else "TEXT"
    if origin is typing.Annotated:
        return _annotation_name(typing.get_args(ann)[0])
    if isinstance(ann, type) and issubclass(ann, enum.Enum):
        return "|".join(str(m.value) for m in ann)
    if isinstance(ann, type) and issubclass(ann, Path):
        return "PATH"
    return _TYPE_NAMES.get(ann, getattr(ann, "__name__", str(ann)).upper())


def _type_name(p) -> str:
    t = getattr(p, "type", None)
    if t is not None and hasattr(t, "name"):
        choices = getattr(t, "choices", None)
        name = "|".join(map(str, choices)) if choices else str(t.name).upper()
        lo, hi = getattr(t, "min", None), getattr(t, "max", None)
    else:
        desc = getattr(p, "type_descriptor", None)
        name = _annotation_name(getattr(desc, "annotation", str))
        lo, hi = getattr(p, "min", None), getattr(p, "max", None)
    name = name.replace(" RANGE", "")
    bounds = [
        b for b in (f">={lo}" if lo is not None else "", f"<={hi}" if hi is not None else "") if b
    ]
    return f"{name} ({', '.join(bounds)})" if bounds else name


def _default(p) -> str:
    d = p.default
    if d is None or getattr(p, "is_flag", False) and d is False and not p.secondary_opts:
        return ""
    if callable(d):
        return "(computed)"
    if isinstance(d, list | tuple):
        if not d:
            return ""
        d = " ".join(map(str, d))
    s = str(d)
    home = os.path.expanduser("~")
    if home and home != "/" and home in s:
        s = s.replace(home, "~")
    return s


def _usage(path: list[str], cmd) -> str:
    parts = [*path, "[OPTIONS]"]
    for p in cmd.params:
        if _is_argument(p):
            meta = p.name.upper() + ("..." if p.nargs == -1 else "")
            parts.append(meta if p.required else f"[{meta}]")
    if _subcommands(cmd):
        parts.append("COMMAND [ARGS]...")
    return " ".join(parts)


def _cmd_id(path: list[str]) -> str:
    return "cmd-" + "-".join(path[1:]) if len(path) > 1 else "cmd-llamay"


def _first_line(text: str | None) -> str:
    return inspect.cleandoc(text or "").split("\n\n")[0].replace("\n", " ")


def cli_pages(version: str) -> dict[str, str]:
    root, tree = cli_tree()
    heads = Headings()
    body = [
        "<p>Every command of the <code>llamay</code> program, generated from its click command "
        "tree (the Typer app <code>llamay_cli.main:app</code>). <code>llamay COMMAND --help</code> "
        "prints the same.</p>"
    ]
    for path, cmd in tree:
        hid = heads.id_for(" ".join(path), 2, _cmd_id(path))
        sec = [f'<section class="command" data-command="{esc(" ".join(path[1:]))}">']
        sec.append(f'<h2 id="{hid}"><code>{esc(" ".join(path))}</code></h2>')
        sec.append(f'<pre class="usage"><code>{esc(_usage(path, cmd))}</code></pre>')
        sec.append(docstring_html(cmd.help))
        args = [p for p in cmd.params if _is_argument(p)]
        opts = [p for p in cmd.params if not _is_argument(p) and not getattr(p, "hidden", False)]
        if args:
            rows = [
                [
                    f"<code>{esc(p.name.upper())}</code>",
                    esc(_type_name(p)),
                    "yes" if p.required else "no",
                    inline(getattr(p, "help", None) or ""),
                ]
                for p in args
            ]
            sec.append("<h3>Arguments</h3>" + table(["argument", "type", "required", "help"], rows))
        rows = []
        for p in opts:
            names = ", ".join(f"<code>{esc(o)}</code>" for o in (*p.opts, *p.secondary_opts))
            kind = "flag" if getattr(p, "is_flag", False) else esc(_type_name(p))
            default = _default(p)
            rows.append(
                [
                    names,
                    kind,
                    f"<code>{esc(default)}</code>" if default else "",
                    inline(p.help or ""),
                ]
            )
        rows.append(["<code>--help</code>", "flag", "", "Show the help and exit."])
        sec.append("<h3>Options</h3>" + table(["option", "type", "default", "help"], rows))
        if _subcommands(cmd):
            subs = [
                [
                    f'<a href="#{_cmd_id([*path, n])}"><code>{esc(n)}</code></a>',
                    inline(_first_line(c.help)),
                ]
                for n, c in sorted(_subcommands(cmd).items())
                if not getattr(c, "hidden", False)
            ]
            sec.append("<h3>Commands</h3>" + table(["command", "summary"], subs))
        sec.append("</section>")
        body.append("\n".join(sec))
    return {"cli.html": page("cli.html", "CLI reference", "\n".join(body), heads, version)}


def cli_summary_table() -> str:
    _, tree = cli_tree()
    rows = [
        [
            f'<a href="cli.html#{_cmd_id(path)}"><code>{esc(" ".join(path))}</code></a>',
            inline(_first_line(cmd.help)),
        ]
        for path, cmd in tree
        if len(path) > 1
    ]
    return table(["command", "what it does"], rows, cls="cli-commands")


# -- Python API reference ----------------------------------------------------------------

# (section title, module, names): the public API, in reading order.
API: list[tuple[str, str, list[str]]] = [
    ("Loading and running a model", "llamay", ["load", "Model"]),
    (
        "GGUF files",
        "llamay.gguf",
        [
            "GGUFFile",
            "open_gguf",
            "write_gguf",
            "copy_gguf",
            "GGUFWriter",
            "TensorSpec",
            "tensor_spec",
            "tensor_nbytes",
            "GGMLType",
            "GGUFValueType",
        ],
    ),
    ("Tokenizer", "llamay.tok", ["Tokenizer"]),
    ("Sampling", "llamay.sample", ["Sampler"]),
    (
        "The model store",
        "llamay.store",
        ["pull", "resolve", "list_models", "remove", "copy", "create", "gc", "store_dir"],
    ),
    (
        "Models across llamay's and Ollama's stores",
        "llamay.library",
        ["resolve", "layered_model", "load", "create"],
    ),
]

_ADDR = re.compile(r" at 0x[0-9a-fA-F]+")


class _Text:
    """An annotation written as text (`from __future__ import annotations`), shown as is."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def signature(obj) -> str:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return "(...)"

    def text(ann):
        return _Text(ann) if isinstance(ann, str) else ann

    params = [p.replace(annotation=text(p.annotation)) for p in sig.parameters.values()]
    sig = sig.replace(parameters=params, return_annotation=text(sig.return_annotation))
    return _ADDR.sub("", str(sig))


def _members(cls) -> list[tuple[str, object]]:
    out = []
    for name, member in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(member, property | classmethod | staticmethod) or inspect.isfunction(member):
            out.append((name, member))
    return sorted(out)


def api_entry(heads: Headings, qual: str, obj, level: int = 2) -> str:
    hid = heads.id_for(qual, level, "api-" + slug(qual))
    parts = [f'<div class="api" id="{hid}-block">']
    if inspect.isclass(obj):
        import enum

        kind = "enum" if issubclass(obj, enum.Enum) else "class"
        sig = "" if kind == "enum" else signature(obj)
        parts.append(f'<h{level} id="{hid}"><code>{esc(qual)}</code></h{level}>')
        parts.append(f'<div class="sig">{kind} {esc(qual)}{esc(sig)}</div>')
        parts.append(docstring_html(_own_doc(obj)))
        if kind == "enum":
            rows = [[f"<code>{esc(m.name)}</code>", str(int(m.value))] for m in obj]
            parts.append(table(["member", "value"], rows))
        elif dataclasses.is_dataclass(obj):
            rows = []
            for f in dataclasses.fields(obj):
                default = (
                    repr(f.default)
                    if f.default is not dataclasses.MISSING
                    else "(factory)"
                    if f.default_factory is not dataclasses.MISSING
                    else ""
                )
                rows.append(
                    [
                        f"<code>{esc(f.name)}</code>",
                        f"<code>{esc(str(f.type))}</code>",
                        f"<code>{esc(_ADDR.sub('', default))}</code>" if default else "",
                    ]
                )
            parts.append("<h4>Fields</h4>" + table(["field", "type", "default"], rows))
        if kind == "class":
            for name, member in _members(obj):
                mq = f"{qual}.{name}"
                mid = heads.id_for(mq, level + 1, "api-" + slug(mq))
                if isinstance(member, property):
                    sig, label, doc = "", "property", member.fget.__doc__ if member.fget else None
                else:
                    fn = (
                        member.__func__
                        if isinstance(member, classmethod | staticmethod)
                        else member
                    )
                    label = "classmethod" if isinstance(member, classmethod) else "method"
                    sig = signature(fn)
                    if label == "classmethod":
                        sig = re.sub(r"^\(cls,?\s*", "(", sig)
                    else:
                        sig = re.sub(r"^\(self,?\s*", "(", sig)
                    doc = fn.__doc__
                hl = f"h{level + 1}"
                parts.append(
                    f'<div class="api"><{hl} id="{mid}"><code>{esc(mq)}</code></{hl}>'
                    f'<div class="sig">{label} {esc(name)}{esc(sig)}</div>'
                    f"{docstring_html(doc)}</div>"
                )
    else:
        parts.append(f'<h{level} id="{hid}"><code>{esc(qual)}</code></h{level}>')
        parts.append(f'<div class="sig">def {esc(qual)}{esc(signature(obj))}</div>')
        parts.append(docstring_html(obj.__doc__))
    parts.append("</div>")
    return "\n".join(parts)


def _own_doc(cls) -> str | None:
    """A class's own docstring (not an inherited one, nor a dataclass's generated one)."""
    doc = cls.__dict__.get("__doc__")
    if doc and dataclasses.is_dataclass(cls) and doc.startswith(cls.__name__ + "("):
        return None
    return doc


def python_api_page(version: str) -> dict[str, str]:
    heads = Headings()
    body = [
        "<p>The public Python API, generated from signatures and docstrings. "
        "<code>import llamay</code> imports JAX lazily: <code>llamay.gguf</code> and "
        "<code>llamay.store</code> need only numpy.</p>"
    ]
    toc = []
    sections = []
    for title, modname, names in API:
        mod = importlib.import_module(modname)
        sid = heads.id_for(title, 2)
        toc.append(f'<li><a href="#{sid}">{esc(title)}</a> (<code>{esc(modname)}</code>)</li>')
        sec = [f'<h2 id="{sid}">{esc(title)}</h2>']
        if modname != "llamay":
            sec.append(docstring_html(mod.__doc__))
        for name in names:
            sec.append(api_entry(heads, f"{modname}.{name}", getattr(mod, name), 3))
        sections.append("\n".join(sec))
    sid = heads.id_for("Errors", 2)
    toc.append(f'<li><a href="#{sid}">Errors</a> (<code>llamay.errors</code>)</li>')
    sections.append(f'<h2 id="{sid}">Errors</h2>' + errors_table())
    body.append("<ul>" + "".join(toc) + "</ul>")
    body.extend(sections)
    return {
        "python-api.html": page("python-api.html", "Python API", "\n".join(body), heads, version)
    }


def errors_table() -> str:
    """llamay's exception types (`llamay.errors`), in the module's order."""
    from llamay import errors

    rows = []
    for name, cls in vars(errors).items():
        if isinstance(cls, type) and issubclass(cls, errors.LlamayError):
            if cls.__module__ != errors.__name__:
                continue
            base = cls.__bases__[0].__name__
            rows.append(
                [
                    f'<code id="err-{slug(name)}">{esc(name)}</code>',
                    f"<code>{esc(base)}</code>",
                    inline(_first_line(cls.__doc__)),
                ]
            )
    intro = (
        "<p>Every error llamay raises on purpose is a <code>LlamayError</code>; its message "
        "says what was wrong and what to do. The HTTP server turns them into 4xx responses "
        "with the same message.</p>"
    )
    return intro + table(["exception", "base", "raised when"], rows)


def catalog_table() -> str:
    """The models `llamay pull` fetches by name (`llamay.store.catalog`)."""
    from llamay.store.catalog import CATALOG, DEFAULT_MODEL

    rows = [
        [
            f"<code>{esc(name)}</code>" + (" (default)" if name == DEFAULT_MODEL else ""),
            f"{e.size / 1e6:.0f} MB" if e.size else "",
            inline(e.description),
        ]
        for name, e in sorted(CATALOG.items())
    ]
    return table(["name", "size", "model"], rows)


# -- HTTP API reference ------------------------------------------------------------------


def openapi_spec() -> dict | None:
    """The server's OpenAPI spec, or None while `llamay.serve` does not provide one.

    Looks for `llamay.serve.openapi_spec()`, then `llamay.serve.app.create_app().openapi()`,
    then a module-level FastAPI `app`. A server that exists but fails while building its
    spec is an error (not silently "pending").
    """
    try:
        serve = importlib.import_module("llamay.serve")
    except ImportError:
        return None
    if callable(getattr(serve, "openapi_spec", None)):
        return serve.openapi_spec()
    for modname in ("llamay.serve.app", "llamay.serve.server", "llamay.serve"):
        try:
            mod = importlib.import_module(modname)
        except ModuleNotFoundError as exc:
            if exc.name and (exc.name == modname or modname.startswith(exc.name + ".")):
                continue
            raise
        if callable(getattr(mod, "create_app", None)):
            return mod.create_app().openapi()
        app = getattr(mod, "app", None)
        if app is not None and callable(getattr(app, "openapi", None)):
            return app.openapi()
    return None


def _schema_type(s: dict) -> str:
    if not isinstance(s, dict):
        return ""
    if "$ref" in s:
        name = s["$ref"].rsplit("/", 1)[-1]
        return f'<a href="#schema-{slug(name)}">{esc(name)}</a>'
    for key in ("anyOf", "oneOf", "allOf"):
        if key in s:
            return " | ".join(_schema_type(x) for x in s[key])
    t = s.get("type", "")
    if t == "array":
        return f"array of {_schema_type(s.get('items', {}))}"
    if "enum" in s:
        return " | ".join(f"<code>{esc(json.dumps(v))}</code>" for v in s["enum"])
    if "const" in s:
        return f"<code>{esc(json.dumps(s['const']))}</code>"
    return esc(t if isinstance(t, str) else " | ".join(t)) or "any"


def http_api_page(version: str, spec: dict | None) -> dict[str, str]:
    heads = Headings()
    if spec is None:
        body = (
            '<p id="http-pending"><strong>Pending.</strong> The HTTP server '
            "(<code>llamay.serve</code>: OpenAI-, Anthropic- and Ollama-compatible APIs over one "
            "engine) is being written. This page is generated from its OpenAPI spec and will "
            "list every endpoint once <code>llamay.serve</code> provides one "
            "(<code>llamay.serve.openapi_spec()</code> or "
            "<code>llamay.serve.app.create_app()</code>): regenerate the docs then.</p>"
        )
        return {"http-api.html": page("http-api.html", "HTTP API", body, heads, version)}
    info = spec.get("info", {})
    about = info.get("description") or info.get("summary") or "The HTTP API of `llamay.serve`."
    has_serve = any(path == ["llamay", "serve"] for path, _ in cli_tree()[1])
    start = (
        'Start the server with <a href="cli.html#cmd-serve"><code>llamay serve</code></a>. '
        if has_serve
        else ""
    )
    body = [
        f"<p>{inline(about.rstrip('.'))}.</p>",
        f"<p>{start}OpenAPI {esc(str(spec.get('openapi', '')))}, API version "
        f"{esc(str(info.get('version', '')))}; the spec as JSON: "
        '<a href="openapi.json">openapi.json</a>.</p>',
    ]
    ops = []  # (tag, path, method, op)
    for path, item in spec.get("paths", {}).items():
        for method, op in item.items():
            if not isinstance(op, dict) or method.startswith("x-") or method == "parameters":
                continue
            ops.append(((op.get("tags") or ["Other"])[0], path, method, op))
    rows, details, tag_seen = [], [], None
    for tag, path, method, op in sorted(ops, key=lambda o: o[:3]):
        if tag != tag_seen:
            tid = heads.id_for(tag, 2, "api-" + slug(tag))
            details.append(f'<h2 id="{tid}">{esc(tag)}</h2>')
            tag_seen = tag
        label = f"{method.upper()} {path}"
        hid = heads.id_for(label, 3, "op-" + slug(label))
        rows.append(
            [
                f'<a href="#{tid}">{esc(tag)}</a>',
                f'<a href="#{hid}"><code>{esc(label)}</code></a>',
                inline(op.get("summary", "")),
            ]
        )
        d = [f'<h3 id="{hid}"><code>{esc(label)}</code></h3>']
        if op.get("description"):
            d.append(docstring_html(op["description"]))
        params = op.get("parameters", [])
        if params:
            prow = [
                [
                    f"<code>{esc(p.get('name', ''))}</code>",
                    esc(p.get("in", "")),
                    "yes" if p.get("required") else "no",
                    _schema_type(p.get("schema", {})),
                    inline(p.get("description", "")),
                ]
                for p in params
            ]
            d.append(table(["parameter", "in", "required", "type", "description"], prow))
        rb = op.get("requestBody", {}).get("content", {})
        if rb:
            brow = [
                [f"<code>{esc(ct)}</code>", _schema_type(c.get("schema", {}))]
                for ct, c in sorted(rb.items())
            ]
            d.append("<h4>Request body</h4>" + table(["content type", "schema"], brow))
        resp = op.get("responses", {})
        if resp:
            rrow = []
            for code in sorted(resp):
                r = resp[code]
                schemas = ", ".join(
                    _schema_type(c.get("schema", {}))
                    for _, c in sorted(r.get("content", {}).items())
                )
                rrow.append([esc(code), inline(r.get("description", "")), schemas])
            d.append("<h4>Responses</h4>" + table(["status", "description", "schema"], rrow))
        details.append("\n".join(d))
    sid = heads.id_for("Endpoints", 2)
    body.append(f'<h2 id="{sid}">Endpoints</h2>' + table(["API", "endpoint", "summary"], rows))
    body.extend(details)
    schemas = spec.get("components", {}).get("schemas", {})
    if schemas:
        body.append(f'<h2 id="{heads.id_for("Schemas", 2)}">Schemas</h2>')
        for name in sorted(schemas):
            s = schemas[name]
            hid = heads.id_for(name, 3, "schema-" + slug(name))
            req = set(s.get("required", []))
            prow = [
                [
                    f"<code>{esc(k)}</code>",
                    _schema_type(v),
                    "yes" if k in req else "no",
                    inline(v.get("description", "") if isinstance(v, dict) else ""),
                ]
                for k, v in s.get("properties", {}).items()
            ]
            body.append(
                f'<h3 id="{hid}"><code>{esc(name)}</code></h3>'
                + (f"<p>{inline(s['description'])}</p>" if s.get("description") else "")
                + (table(["field", "type", "required", "description"], prow) if prow else "")
            )
    return {
        "http-api.html": page("http-api.html", "HTTP API", "\n".join(body), heads, version),
        "openapi.json": json.dumps(spec, indent=2, sort_keys=True, ensure_ascii=False) + "\n",
    }


# -- registry tables ---------------------------------------------------------------------


def architectures_page(version: str) -> dict[str, str]:
    from llamay.arch import REGISTRY

    heads = Headings()
    families: dict[str, object] = {}
    for fam in REGISTRY.values():
        families.setdefault(fam.name, fam)
    rows, details = [], []
    for name in sorted(families):
        fam = families[name]
        modname = getattr(fam.config, "__module__", "")
        mod = sys.modules.get(modname)
        desc = _first_line(mod.__doc__ if mod else "")
        required = [t for t in fam.tensors if not t.optional]
        optional = [t for t in fam.tensors if t.optional]
        hid = heads.id_for(name, 3, "arch-" + slug(name))
        rows.append(
            [
                f'<a href="#{hid}"><code>{esc(name)}</code></a>',
                ", ".join(f"<code>{esc(a)}</code>" for a in fam.aliases),
                f"<code>{esc(modname)}</code>",
                inline(desc),
            ]
        )
        trows = [
            [
                f"<code>{esc(t.name)}</code>",
                f"<code>{esc(t.role)}</code>",
                "optional" if t.optional else "required",
                "per layer" if t.per_layer else "once",
            ]
            for t in fam.tensors
        ]
        details.append(
            f'<h3 id="{hid}"><code>{esc(name)}</code></h3>'
            f"<p>{len(required)} required and {len(optional)} optional GGUF tensors "
            "(llama.cpp's names; <code>{i}</code> is the layer index).</p>"
            + table(["tensor", "role", "", "bound"], trows)
        )
    body = [
        "<p>The architectures llamay runs, read from <code>llamay.arch.REGISTRY</code>: a GGUF "
        "file's <code>general.architecture</code> must be one of these names or aliases. Each "
        "family is a config reader plus pure forward functions over a weight pytree.</p>",
        f'<h2 id="{heads.id_for("Families", 2)}">Families</h2>',
        table(["architecture", "also accepted as", "module", "description"], rows),
        f'<h2 id="{heads.id_for("Tensors", 2)}">Tensors</h2>',
        *details,
    ]
    return {
        "architectures.html": page(
            "architectures.html", "Architectures", "\n".join(body), heads, version
        )
    }


def quant_page(version: str) -> dict[str, str]:
    from llamay.gguf.constants import BLOCK_SIZES, GGMLType
    from llamay.kernels_cpu.qmatmul import EXACT_TYPES, K_TYPES, Q8_TYPES
    from llamay.kernels_pallas import KERNEL_TYPES
    from llamay.quant import LAYOUTS, VEC_DOT_TYPES

    heads = Headings()
    rows = []
    for t in sorted(GGMLType, key=int):
        elems, nbytes = BLOCK_SIZES[t]
        bpw = nbytes * 8 / elems
        supported = t in LAYOUTS
        dot = VEC_DOT_TYPES.get(t)
        rows.append(
            [
                f'<code id="type-{slug(t.name)}">{esc(t.name)}</code>',
                str(int(t)),
                str(elems),
                str(nbytes),
                f"{bpw:.4g}",
                "yes" if supported else "no",
                f"<code>{esc(dot.name)}</code>" if dot is not None else "",
                ", ".join(
                    n
                    for n, types in (("exact", EXACT_TYPES), ("llamacpp", Q8_TYPES | K_TYPES))
                    if t in types
                ),
                "yes" if t in KERNEL_TYPES else "",
            ]
        )
    n_sup = sum(t in LAYOUTS for t in GGMLType)
    body = [
        "<p>Every GGML tensor type of the GGUF format, read from "
        "<code>llamay.gguf.constants</code> (<code>GGMLType</code>, <code>BLOCK_SIZES</code>) "
        f"and <code>llamay.quant</code>. llamay dequantises {n_sup} of them "
        "(<code>llamay.quant.LAYOUTS</code>); a file with a tensor of another type is refused "
        "with an error naming the type. Quantised weights stay in their blocks on device and "
        "are dequantised inside the compiled step.</p>"
        "<p>The last column is the activation type llama.cpp rounds activations to before a "
        "matmul with a weight of that type (<code>llamay.quant.VEC_DOT_TYPES</code>), which "
        '<code>numerics="llamacpp"</code> reproduces.</p>'
        "<p>The last two: the numerics the native CPU matmul kernels take a type in "
        "(<code>llamay.kernels_cpu</code>; the others dequantise and dot through XLA), and "
        "whether the Pallas matmul kernel (GPU/TPU, <code>llamay.kernels_pallas</code>) "
        "dequantises its tiles in-kernel (the others dequantise and dot).</p>",
        table(
            [
                "type",
                "code",
                "elements / block",
                "bytes / block",
                "bits / weight",
                "llamay runs it",
                "llama.cpp activation type",
                "native CPU kernel",
                "Pallas kernel",
            ],
            rows,
        ),
    ]
    return {
        "quant-types.html": page(
            "quant-types.html", "Quantisation types", "\n".join(body), heads, version
        )
    }


# -- hand-written pages ------------------------------------------------------------------

ROOMS = [
    "gguf",
    "quant",
    "kernels",
    "kernels_pallas",
    "kernels_cpu",
    "arch",
    "model",
    "tok",
    "kv",
    "sample",
    "constrain",
    "engine",
    "serve",
    "store",
    "ollama",
    "eval",
    "ocr",
]


def rooms_table() -> str:
    """Each package of llamay with the first line of its docstring (read without importing)."""
    import ast

    rows = []
    for room in ROOMS:
        init = ROOT / "llamay" / room / "__init__.py"
        if not init.exists():
            continue
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        rows.append([f"<code>llamay/{esc(room)}</code>", inline(_first_line(doc))])
    rows.append(["<code>cli/</code> (<code>llamay_cli</code>)", inline(_first_line(_cli_doc()))])
    return table(["room", "what it holds"], rows)


def arrows_table() -> str:
    """The room table `tests/test_imports.py` enforces, beside the arrows the source has now
    (read with the test's own `ast` import graph, so the page and the test agree)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("house_imports", ROOT / "tests/test_imports.py")
    house = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = house  # its dataclasses look their module up there
    spec.loader.exec_module(house)
    now: dict[str, set[str]] = {r: set() for r in house.MAY_IMPORT}
    for imp in house.imports():
        src, dst = house.room(imp.source), house.room(imp.target)
        if dst not in (src, "base"):
            now[src].add(dst)
    modules: dict[str, list[str]] = {r: [] for r in house.MAY_IMPORT}
    for prefix, r in house.ROOM_OF.items():
        if any(m == prefix or m.startswith(prefix + ".") for m in house.MODULES):
            modules[r].append(prefix.replace("llamay_cli", "cli/ (llamay_cli)"))

    def names(rooms: Iterable[str]) -> str:
        return ", ".join(f"<code>{esc(r)}</code>" for r in sorted(rooms)) or "—"

    rows = [
        [
            f"<strong>{esc(r)}</strong>",
            ", ".join(f"<code>{esc(m)}</code>" for m in sorted(modules[r])),
            names(house.MAY_IMPORT[r]),
            names(now[r]),
        ]
        for r in house.MAY_IMPORT
    ]
    return table(["room", "modules", "may import", "imports now"], rows)


def _cli_doc() -> str:
    import ast

    src = (ROOT / "cli" / "main.py").read_text(encoding="utf-8")
    return ast.get_docstring(ast.parse(src)) or ""


def markdown_page(src: Path, out_name: str, title: str, version: str, extra: dict) -> str:
    text = src.read_text(encoding="utf-8")
    heads = Headings()
    lines = text.splitlines()
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    body = []
    chunk: list[str] = []
    for line in lines:
        m = re.fullmatch(r"<!--\s*generated:(\w+)\s*-->", line.strip())
        if m:
            body.append(markdown("\n".join(chunk), heads))
            chunk = []
            body.append(extra[m.group(1)]())
        else:
            chunk.append(line)
    body.append(markdown("\n".join(chunk), heads))
    return page(out_name, title, "\n".join(body), heads, version)


# -- landing page ------------------------------------------------------------------------

LANDING = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>llamay: GGUF language models, compiled with JAX</title>
<style>
body {{ margin: 0; font: 17px/1.6 system-ui, -apple-system, "Segoe UI", sans-serif;
  color: #1d2327; }}
header {{ background: #10243a; color: #fff; padding: 4rem 1.5rem 3rem; text-align: center; }}
header h1 {{ font-size: 3rem; margin: 0; letter-spacing: -.02em; }}
header p {{ font-size: 1.25rem; color: #c8d6e5; margin: .5rem 0 0; }}
section {{ max-width: 52rem; margin: 0 auto; padding: 1.5rem; }}
pre {{ background: #f3f5f7; padding: .8rem 1rem; border-radius: 6px; overflow-x: auto;
  font: 15px/1.45 ui-monospace, Menlo, Consolas, monospace; }}
a {{ color: #0b5cad; }}
.cards {{ display: grid; grid-template-columns: repeat(auto-fit, minmax(15rem, 1fr));
  gap: 1rem; }}
.card {{ border: 1px solid #d9dee2; border-radius: 8px; padding: .4rem 1rem; }}
footer {{ text-align: center; color: #5b6770; font-size: 14px; padding: 2rem; }}
</style>
</head>
<body>
<header>
<h1>llamay</h1>
<p>Run GGUF language models with JAX: one compiled, pure step function, on CPU, GPU or TPU.</p>
</header>
<section id="install">
<h2>Install</h2>
<p>Linux and macOS (finds Python &ge; 3.12, creates an isolated environment, picks the CUDA
build when an NVIDIA driver is present):</p>
<pre>curl -fsSL &lt;this site&gt;/install.sh | sh</pre>
<p>Windows (PowerShell):</p>
<pre>irm &lt;this site&gt;/install.ps1 | iex</pre>
<p>Then:</p>
<pre>llamay generate "Once upon a time"</pre>
<p>The scripts: <a href="install.sh">install.sh</a>, <a href="install.ps1">install.ps1</a>
(<a href="docs/install.html">what they do</a>).</p>
</section>
<section class="cards">
<div class="card"><h3><a href="docs/getting-started.html">Getting started</a></h3>
<p>Generate text, tokenize, inspect a model, use it from Python.</p></div>
<div class="card"><h3><a href="docs/cli.html">CLI reference</a></h3>
<p>Every <code>llamay</code> command and option.</p></div>
<div class="card"><h3><a href="docs/python-api.html">Python API</a></h3>
<p><code>llamay.load</code>, <code>Model</code>, GGUF files, tokenizers, samplers, the store.</p>
</div>
<div class="card"><h3><a href="docs/architectures.html">Architectures</a></h3>
<p>{n_arch} model families; {n_quant} quantisation types
(<a href="docs/quant-types.html">table</a>).</p></div>
<div class="card"><h3><a href="docs/http-api.html">HTTP API</a></h3>
<p>OpenAI-, Anthropic- and Ollama-compatible endpoints.</p></div>
<div class="card"><h3><a href="docs/design.html">Design</a></h3>
<p>How llamay is built: rooms, pure step functions, static shapes.</p></div>
</section>
<footer>llamay {version} · <a href="docs/index.html">documentation</a></footer>
</body>
</html>
"""


# -- build -------------------------------------------------------------------------------


def build(out: Path) -> list[str]:
    """Write the whole site into `out` (an empty or existing directory); returns its files."""
    import llamay
    from llamay.arch import REGISTRY
    from llamay.quant import LAYOUTS

    version = llamay.__version__
    files: dict[str, str] = {}  # path relative to out -> text
    docs: dict[str, str] = {"style.css": CSS}
    docs |= cli_pages(version)
    docs |= python_api_page(version)
    docs |= http_api_page(version, openapi_spec())
    docs |= architectures_page(version)
    docs |= quant_page(version)
    extra: dict[str, Callable[[], str]] = {
        "cli_commands": cli_summary_table,
        "rooms": rooms_table,
        "arrows": arrows_table,
        "catalog": catalog_table,
    }
    titles = dict(PAGES)
    for src in sorted(DOCS_SRC.glob("*.md")):
        name = f"{src.stem}.html"
        title = titles.get(name) or src.read_text(encoding="utf-8").splitlines()[0].lstrip("# ")
        docs[name] = markdown_page(src, name, title, version, extra)
    missing = [p for p, _ in PAGES if p not in docs]
    if missing:
        raise SystemExit(f"build_docs: no source for page(s) {missing} (expected docs/*.md)")
    files |= {f"docs/{k}": v for k, v in docs.items()}
    n_arch = len({f.name for f in REGISTRY.values()})
    files["index.html"] = LANDING.format(n_arch=n_arch, n_quant=len(LAYOUTS), version=version)
    for script in ("install.sh", "install.ps1"):
        files[script] = (ROOT / "packaging" / script).read_text(encoding="utf-8")
    for rel, text in files.items():
        p = out / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8", newline="\n")
    if (out / "install.sh").exists():
        (out / "install.sh").chmod(0o755)
    return sorted(files)


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        for key in ("href", "src"):
            if a.get(key):
                self.links.append(a[key])


def check_links(root: Path) -> list[str]:
    """Broken internal links (missing file or #fragment) in every HTML file under root."""
    parsed: dict[Path, _Links] = {}

    def parse(p: Path) -> _Links:
        if p not in parsed:
            lp = _Links()
            lp.feed(p.read_text(encoding="utf-8"))
            parsed[p] = lp
        return parsed[p]

    broken = []
    for page_path in sorted(root.rglob("*.html")):
        for link in parse(page_path).links:
            if re.match(r"^[a-z][a-z0-9+.-]*:", link, re.I) or link.startswith("//"):
                continue  # external (http:, mailto:, ...): not ours to check offline
            target, _, frag = link.partition("#")
            dest = (page_path.parent / target).resolve() if target else page_path.resolve()
            rel = page_path.relative_to(root)
            try:
                dest.relative_to(root.resolve())
            except ValueError:
                broken.append(f"{rel}: {link} leaves the site")
                continue
            if dest.is_dir():
                dest = dest / "index.html"
            if not dest.exists():
                broken.append(f"{rel}: {link} (no such file)")
            elif frag and dest.suffix == ".html" and frag not in parse(dest).ids:
                broken.append(f"{rel}: {link} (no id {frag!r} in {dest.name})")
    return broken


def _short(diff: list[str], width: int = 240) -> list[str]:
    """A unified diff with long lines cut to `width` around where each -/+ pair differs."""
    out = []
    for i, line in enumerate(diff):
        if len(line) <= width:
            out.append(line)
            continue
        other = ""
        if line.startswith("-") and i + 1 < len(diff) and diff[i + 1].startswith("+"):
            other = diff[i + 1]
        elif line.startswith("+") and i > 0 and diff[i - 1].startswith("-"):
            other = diff[i - 1]
        pairs = enumerate(zip(line[1:], other[1:], strict=False))
        at = next((k for k, (a, b) in pairs if a != b), 0)
        start = max(0, at - width // 3)
        cut = line[1 + start : 1 + start + width]
        head = "..." if start else ""
        tail = "..." if 1 + start + width < len(line) else ""
        out.append(f"{line[0]}{head}{cut}{tail}")
    return out


def generated_files(root: Path) -> set[str]:
    return {
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and str(p.relative_to(root)) not in HAND_WRITTEN
    }


def from_git(rev: str, out: Path, check: bool) -> int:
    """Export `rev` with `git archive` and run that tree's own build_docs.py on it: write
    its site into `out`, or with `check`, check that `rev`'s committed site matches its
    code (what a clean clone's CI sees, whatever the working tree holds)."""
    import subprocess
    import tarfile

    with tempfile.TemporaryDirectory(prefix="llamay-git-") as tmp:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", "--format=tar", rev],
            capture_output=True,
            check=True,
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(tmp, filter="data")
        script = Path(tmp) / "scripts" / "site" / "build_docs.py"
        if not script.exists():
            print(f"build_docs: {rev} has no scripts/site/build_docs.py", file=sys.stderr)
            return 1
        site = Path(tmp) / "site" if check else out
        cmd = [sys.executable, str(script), "--out", str(site), *(["--check"] if check else [])]
        return subprocess.run(cmd, cwd=tmp).returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="fail if site/ is not up to date")
    ap.add_argument("--out", type=Path, default=SITE, help="output directory (default: site/)")
    ap.add_argument(
        "--git",
        metavar="REV",
        help="build from the committed tree of REV (e.g. HEAD) instead of the working tree, "
        "so the site matches what is committed while others edit a shared checkout; with "
        "--check, check REV's committed site against REV's code",
    )
    args = ap.parse_args(argv)
    if args.git:
        return from_git(args.git, args.out.resolve(), args.check)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    with tempfile.TemporaryDirectory(prefix="llamay-site-") as tmp:
        fresh = Path(tmp) / "site"
        names = build(fresh)
        broken = check_links(fresh)
        if broken:
            print("build_docs: broken links:\n  " + "\n  ".join(broken), file=sys.stderr)
            return 1
        if args.check:
            have = generated_files(args.out) if args.out.exists() else set()
            problems = []
            for rel in sorted(set(names) | have):
                old = args.out / rel
                if rel not in names:
                    problems.append(f"{rel}: stale (no longer generated)")
                elif not old.exists():
                    problems.append(f"{rel}: missing")
                else:
                    a = old.read_text(encoding="utf-8").splitlines()
                    b = (fresh / rel).read_text(encoding="utf-8").splitlines()
                    if a != b:
                        diff = list(
                            difflib.unified_diff(
                                a, b, f"{rel} (committed)", f"{rel} (generated)", lineterm="", n=1
                            )
                        )
                        problems.append(f"{rel}: differs\n" + "\n".join(_short(diff[:40])))
            if problems:
                print(
                    "build_docs --check: site/ is out of date:\n" + "\n".join(problems),
                    file=sys.stderr,
                )
                print(f"regenerate with: {REGENERATE}", file=sys.stderr)
                return 1
            print(f"build_docs --check: site/ is up to date ({len(names)} files, links ok)")
            return 0
        out = args.out
        for rel in sorted(generated_files(out) - set(names)) if out.exists() else []:
            (out / rel).unlink()
        for rel in names:
            dst = out / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(fresh / rel, dst)
        print(f"build_docs: wrote {len(names)} files under {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
