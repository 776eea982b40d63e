"""Chat templates: Jinja rendering in a sandbox, plus built-in fallbacks.

A GGUF's `tokenizer.chat_template` comes with the file and is untrusted, so it is rendered
in `llamay.tok.sandbox.BoundedEnvironment`: Jinja's immutable sandbox (no access to
private/dunder attributes — an attempt raises `ChatTemplateError` at once instead of
rendering an empty string —, no mutation of the objects passed in, `range` bounded by
Jinja) with a time, an allocation and an output budget, so a template can neither hang
its caller nor build gigantic strings, lists or numbers. The environment matches what
Hugging Face templates expect: `trim_blocks`, `lstrip_blocks`, loop controls,
`raise_exception`, `strftime_now` and a `tojson` filter that keeps non-ASCII text as is.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

from llamay.errors import ChatTemplateError
from llamay.tok import sandbox

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


def _make_env():
    env = sandbox.BoundedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.add_filter("tojson", _tojson)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


_ENV = None


def _env():
    global _ENV
    if _ENV is None:
        _ENV = _make_env()
    return _ENV


MAX_TEMPLATE_CHARS = 1 << 20  # real templates are a few kB; this one comes from a file


@lru_cache(maxsize=32)
def _compile(template: str):
    from jinja2.exceptions import TemplateError

    if len(template) > MAX_TEMPLATE_CHARS:
        raise ChatTemplateError(
            f"chat template is {len(template)} characters, over the limit of {MAX_TEMPLATE_CHARS}"
        )
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
    time_budget_s: float | None = None,
    **kw: Any,
) -> str:
    """Render `messages` with a (possibly untrusted) Jinja chat template.

    Extra keyword arguments (`tools`, `documents`, `enable_thinking`, ...) are passed to the
    template. Any failure, including a sandbox violation or an exceeded budget (time:
    `time_budget_s`, by default `sandbox.time_budget(len(messages))`; allocations and
    output: see `llamay.tok.sandbox`), raises
    `ChatTemplateError` (the original exception is its `__cause__`). Safe to call from
    any thread; the budgets are per call."""
    from jinja2.exceptions import SecurityError, TemplateError

    size = sandbox.input_chars(messages, bos_token, eos_token, kw)
    if time_budget_s is None:
        time_budget_s = sandbox.time_budget(len(messages))
    try:
        with sandbox.budgeted(size, messages, kw) as budget, sandbox.time_limit(time_budget_s):
            tmpl = _compile(template)
            out, n = [], 0
            for piece in tmpl.generate(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=bos_token,
                eos_token=eos_token,
                **kw,
            ):
                n += len(piece)
                if n > budget.output:
                    raise sandbox.BudgetError(
                        f"output over {budget.output} characters (for {size} characters of input)"
                    )
                out.append(piece)
            return "".join(out)
    except ChatTemplateError:
        raise
    except sandbox.RenderTimeout:
        raise ChatTemplateError(
            f"chat template took longer than its time budget of {time_budget_s} s to render"
        ) from None
    except sandbox.BudgetError as e:
        raise ChatTemplateError(f"chat template exceeded a rendering budget: {e}") from e
    except MemoryError as e:
        raise ChatTemplateError("chat template ran out of memory while rendering") from e
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
