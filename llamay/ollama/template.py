"""The subset of Ollama's Go templates that a single-turn prompt needs.

Supported: literal text, `{{ .System }}`, `{{ .Prompt }}`, `{{ .Response }}`, `{{ if .X }}`
… `{{ else }}` … `{{ end }}` over those fields, and the `{{-` / `-}}` whitespace trim
markers. As Ollama does for a generation, rendering stops at `{{ .Response }}` (the model
writes the response). Anything else — `range .Messages`, functions, variables, pipelines —
raises `UnsupportedTemplateError`, so a caller can fall back to the GGUF's own chat template
instead of sending a half-rendered prompt.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from llamay.ollama.errors import UnsupportedTemplateError

_ACTION = re.compile(r"\{\{(-\s)?\s*(.*?)\s*(\s-)?\}\}", re.S)
_FIELDS = ("System", "Prompt", "Response")


@dataclass(frozen=True)
class _Text:
    text: str


@dataclass(frozen=True)
class _Field:
    name: str


@dataclass(frozen=True)
class _If:
    name: str
    then: list
    orelse: list


def _tokens(template: str) -> list[tuple[str, str]]:
    """[("text", s) | ("action", body)], with trim markers applied to the text around."""
    out: list[tuple[str, str]] = []
    pos = 0
    trim_next = False
    for m in _ACTION.finditer(template):
        text = template[pos : m.start()]
        if trim_next:
            text = text.lstrip()
        if m.group(1):
            text = text.rstrip()
        if text:
            out.append(("text", text))
        out.append(("action", m.group(2)))
        trim_next = bool(m.group(3))
        pos = m.end()
    tail = template[pos:]
    if trim_next:
        tail = tail.lstrip()
    if tail:
        out.append(("text", tail))
    return out


def _field(expr: str, template: str) -> str:
    if expr.startswith(".") and expr[1:] in _FIELDS:
        return expr[1:]
    raise UnsupportedTemplateError(
        f"the Ollama template uses {{{{ {expr} }}}}, which llamay's template subset does not "
        f"support (only .System, .Prompt, .Response and if/else/end over them): {template[:80]!r}"
    )


def parse(template: str) -> list:
    """Parse into a small tree; raises `UnsupportedTemplateError`."""
    stack: list[tuple[list, _If | None]] = [([], None)]
    for kind, body in _tokens(template):
        nodes = stack[-1][0]
        if kind == "text":
            nodes.append(_Text(body))
        elif body.startswith("if "):
            node = _If(_field(body[3:].strip(), template), [], [])
            nodes.append(node)
            stack.append((node.then, node))
        elif body == "else":
            top = stack[-1][1]
            if top is None or stack[-1][0] is top.orelse:
                raise UnsupportedTemplateError(f"unexpected {{{{ else }}}} in {template[:80]!r}")
            stack[-1] = (top.orelse, top)
        elif body == "end":
            if len(stack) == 1:
                raise UnsupportedTemplateError(f"unexpected {{{{ end }}}} in {template[:80]!r}")
            stack.pop()
        else:
            nodes.append(_Field(_field(body, template)))
    if len(stack) != 1:
        raise UnsupportedTemplateError(f"unterminated {{{{ if }}}} in {template[:80]!r}")
    return stack[0][0]


class _Stop(Exception):
    pass


def render(template: str, prompt: str, system: str | None = None) -> str:
    """The prompt text for one user turn: the template up to `{{ .Response }}`."""
    values = {"System": system or "", "Prompt": prompt, "Response": ""}
    out: list[str] = []

    def walk(nodes: list) -> None:
        for n in nodes:
            if isinstance(n, _Text):
                out.append(n.text)
            elif isinstance(n, _Field):
                if n.name == "Response":
                    raise _Stop
                out.append(values[n.name])
            else:
                walk(n.then if values[n.name] else n.orelse)

    try:
        walk(parse(template))
    except _Stop:
        pass
    return "".join(out)
