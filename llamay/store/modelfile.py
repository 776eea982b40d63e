"""Modelfiles (the subset `llamay create` reads) and building a model's layers from one.

    # a comment
    FROM ./model.gguf            a GGUF path (relative to the Modelfile), or a model name
    TEMPLATE \"\"\"{{ .Prompt }}\"\"\"   one line, or a triple-quoted block
    SYSTEM You are terse.
    PARAMETER temperature 0.2     repeated `PARAMETER stop <s>` lines add up to a list
    LICENSE \"\"\"MIT ...\"\"\"
    ADAPTER ./lora.gguf          a llama.cpp GGUF LoRA adapter (repeatable), applied at scale 1

Instructions are case-insensitive. `MESSAGE` and unknown instructions or parameters are
refused with the line number, never ignored.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from llamay.errors import LlamayError


class ModelfileError(LlamayError):
    """A Modelfile cannot be read: a bad instruction, parameter or value (with its line)."""


_INT = {
    "num_keep",
    "seed",
    "num_predict",
    "top_k",
    "repeat_last_n",
    "num_ctx",
    "num_batch",
    "num_gpu",
    "main_gpu",
    "num_thread",
    "draft_num_predict",
}
_FLOAT = {
    "top_p",
    "min_p",
    "typical_p",
    "temperature",
    "repeat_penalty",
    "presence_penalty",
    "frequency_penalty",
}
_BOOL = {"use_mmap"}
_INSTRUCTIONS = {"from", "template", "system", "parameter", "license", "adapter", "message"}
_LINE = re.compile(r"\s*([A-Za-z]+)(?:\s+(.*))?\s*$", re.S)


@dataclass
class Modelfile:
    """A parsed Modelfile."""

    base: str
    template: str | None = None
    system: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    licenses: list[str] = field(default_factory=list)
    adapters: list[str] = field(default_factory=list)  # as written: a path or @sha256:<hex>

    def params_json(self) -> bytes:
        """The params layer as Ollama writes it (sorted keys, compact, newline)."""
        return (json.dumps(self.params, separators=(",", ":"), sort_keys=True) + "\n").encode()


def _value(key: str, raw: str, lineno: int) -> Any:
    try:
        if key in _INT:
            return int(raw)
        if key in _FLOAT:
            return float(raw)
        if key in _BOOL:
            if raw.lower() not in ("true", "false"):
                raise ValueError(raw)
            return raw.lower() == "true"
    except ValueError:
        raise ModelfileError(
            f"line {lineno}: PARAMETER {key} {raw!r} is not a valid value"
        ) from None
    raise ModelfileError(f"line {lineno}: unknown parameter {key!r}")


def _unquote(text: str) -> str:
    """`"..."` → its content, with JSON escapes (`\\n`, `\\"`) decoded when they parse."""
    if len(text) >= 2 and text[0] == text[-1] == '"':
        try:
            value = json.loads(text)
        except ValueError:
            return text[1:-1]
        return value if isinstance(value, str) else text[1:-1]
    return text


def _statements(text: str) -> list[tuple[int, str, str]]:
    """(line number, instruction, argument) with triple-quoted blocks joined."""
    out = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        lineno, line = i + 1, lines[i]
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            raise ModelfileError(f"line {lineno}: cannot read {line.strip()[:60]!r}")
        word, arg = m.group(1).lower(), (m.group(2) or "").strip()
        if arg.startswith('"""'):
            body = arg[3:]
            while '"""' not in body:
                if i >= len(lines):
                    raise ModelfileError(f'line {lineno}: unterminated """ block')
                body += "\n" + lines[i]
                i += 1
            body, _, rest = body.partition('"""')
            if rest.strip():
                raise ModelfileError(f'line {lineno}: text after the closing """')
            arg = body
        else:
            arg = _unquote(arg)
        out.append((lineno, word, arg))
    return out


def parse(text: str) -> Modelfile:
    """Parse a Modelfile; raises `ModelfileError` naming the line."""
    base = None
    mf = Modelfile(base="")
    for lineno, word, arg in _statements(text):
        if word not in _INSTRUCTIONS:
            raise ModelfileError(f"line {lineno}: unknown instruction {word.upper()}")
        if word == "message":
            raise ModelfileError(f"line {lineno}: {word.upper()} is not supported by llamay yet")
        if word == "from":
            if base is not None:
                raise ModelfileError(f"line {lineno}: more than one FROM")
            base = arg
        elif word == "template":
            mf.template = arg
        elif word == "system":
            mf.system = arg
        elif word == "license":
            mf.licenses.append(arg)
        elif word == "adapter":
            if not arg:
                raise ModelfileError(f"line {lineno}: ADAPTER needs a GGUF adapter file or blob")
            mf.adapters.append(arg)
        else:  # parameter
            key, _, raw = arg.partition(" ")
            key, raw = key.strip().lower(), _unquote(raw.strip())
            if not key or not raw:
                raise ModelfileError(f"line {lineno}: PARAMETER needs a name and a value")
            if key == "stop":
                mf.params.setdefault("stop", []).append(raw)
            else:
                mf.params[key] = _value(key, raw, lineno)
    if not base:
        raise ModelfileError("the Modelfile has no FROM line (a GGUF path or a model name)")
    mf.base = base
    return mf
