"""Chat templates: Jinja rendering in a sandbox, plus built-in fallbacks.

A GGUF's `tokenizer.chat_template` comes with the file and is untrusted, so it is rendered
in `jinja2.sandbox.ImmutableSandboxedEnvironment`: no access to private/dunder attributes
(an attempt raises `ChatTemplateError` at once instead of rendering an empty string),
no mutation of the objects passed in, `range` bounded by Jinja, and `+`, `*` and `**`
checked so a template cannot build gigantic strings, lists or numbers in one step. The
environment matches what Hugging Face templates expect: `trim_blocks`, `lstrip_blocks`,
loop controls, `raise_exception`, `strftime_now` and a `tojson` filter that keeps
non-ASCII text as is.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

from llamay.errors import ChatTemplateError

MAX_SIZE = 1 << 24  # largest string/sequence/number magnitude a single operator may produce
MAX_EXPONENT = 4096

# llama.cpp's default when a model has no template (common/chat.cpp CHATML_TEMPLATE_SRC).
CHATML_TEMPLATE = (
    "{%- for message in messages -%}\n"
    "  {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|im_start|>assistant\\n' -}}\n"
    "{%- endif -%}"
)

# llama.cpp's built-in "gemma" format (llm_chat_apply_template): system text is merged
# into the next user turn, "assistant" is called "model", contents are trimmed. No BOS:
# the tokenizer adds it (tokenizer.ggml.add_bos_token).
GEMMA_TEMPLATE = (
    "{%- set ns = namespace(system='') -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}"
    "{%- set ns.system = ns.system + (message['content'] | trim(' \\t\\n\\r\\v\\f')) -%}"
    "{%- else -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{- '<start_of_turn>' + role + '\\n' -}}"
    "{%- if ns.system and role != 'model' -%}"
    "{{- ns.system + '\\n\\n' -}}{%- set ns.system = '' -%}"
    "{%- endif -%}"
    "{{- (message['content'] | trim(' \\t\\n\\r\\v\\f')) + '<end_of_turn>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}"
)

BUILTIN_TEMPLATES = {"chatml": CHATML_TEMPLATE, "gemma": GEMMA_TEMPLATE}
_ARCH_TEMPLATES = {"gemma": "gemma", "gemma2": "gemma", "gemma3": "gemma", "gemma3n": "gemma"}


def builtin_template_for(architecture: str | None) -> str:
    """Name of the built-in template used when a GGUF has none: by architecture, else
    llama.cpp's ChatML default."""
    return _ARCH_TEMPLATES.get(architecture or "", "chatml")


def _raise_exception(message: str = "") -> None:
    raise ChatTemplateError(f"chat template raised an error: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(value: Any, indent=None, separators=None, sort_keys: bool = False) -> str:
    return json.dumps(
        value, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _size(x: Any) -> int:
    if isinstance(x, (str, bytes, list, tuple)):
        return len(x)
    return 0


def _make_env():
    from jinja2.exceptions import SecurityError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class ChatTemplateEnvironment(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(["+", "*", "**"])

        def unsafe_undefined(self, obj: Any, attribute: str):
            raise SecurityError(
                f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe"
            )

        def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
            if operator == "*":
                for seq, k in ((left, right), (right, left)):
                    if isinstance(k, int) and _size(seq) * max(k, 0) > MAX_SIZE:
                        raise SecurityError("chat template tried to build a too large value")
            elif operator == "+":
                if _size(left) + _size(right) > MAX_SIZE:
                    raise SecurityError("chat template tried to build a too large value")
            elif operator == "**":
                if isinstance(right, (int, float)) and abs(right) > MAX_EXPONENT:
                    raise SecurityError("chat template tried to compute a too large power")
            return super().call_binop(context, operator, left, right)

    env = ChatTemplateEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


_ENV = None


def _env():
    global _ENV
    if _ENV is None:
        _ENV = _make_env()
    return _ENV


@lru_cache(maxsize=32)
def _compile(template: str):
    from jinja2.exceptions import TemplateError

    try:
        return _env().from_string(template)
    except TemplateError as e:
        raise ChatTemplateError(f"chat template does not compile: {e}") from e


def render_chat(
    template: str,
    messages: list[dict],
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
    **kw: Any,
) -> str:
    """Render `messages` with a (possibly untrusted) Jinja chat template.

    Extra keyword arguments (`tools`, `documents`, `enable_thinking`, ...) are passed to the
    template. Any failure, including a sandbox violation, raises `ChatTemplateError` (the
    original exception is its `__cause__`)."""
    from jinja2.exceptions import SecurityError, TemplateError

    tmpl = _compile(template)
    try:
        return tmpl.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
            **kw,
        )
    except ChatTemplateError:
        raise
    except SecurityError as e:
        raise ChatTemplateError(f"chat template attempted an unsafe operation: {e}") from e
    except TemplateError as e:
        raise ChatTemplateError(f"chat template failed to render: {e}") from e
    except (
        TypeError,
        ValueError,
        KeyError,
        IndexError,
        AttributeError,
        ZeroDivisionError,
        OverflowError,
        RecursionError,
    ) as e:
        raise ChatTemplateError(f"chat template failed to render: {type(e).__name__}: {e}") from e
