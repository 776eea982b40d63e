"""Chat templates from GGUF files are untrusted: hostile ones are refused within a time
and memory bound (issue 22.3), real ones render exactly as plain Jinja renders them."""

from __future__ import annotations

import json
import threading
import time
import tracemalloc

import pytest
from fixture_data import tiny_model_file, tiny_names

from llamay.errors import ChatTemplateError
from llamay.gguf import GGUFFile
from llamay.tok import sandbox
from llamay.tok.chat import BUILTIN_TEMPLATES, render_chat

MSGS = [{"role": "user", "content": "hi"}]
BUDGET_S = 0.5
# What a refusal may cost: the time budget plus slack for a loaded machine, and Python
# memory within a few times the allocation budget (characters of up to 4 bytes each).
TIME_BOUND_S = BUDGET_S + 5.0
MEMORY_BOUND = 8 * sandbox.RENDER_CHARS

NS = "{% set ns = namespace(s='x') %}"
HOSTILE = {
    "nested_range": "{% for i in range(100000) %}{% for j in range(100000) %}"
    "{% endfor %}{% endfor %}",
    "nested_range_output": "{% for i in range(100000) %}{% for j in range(100000) %}x"
    "{% endfor %}{% endfor %}",
    "tilde_doubling": NS + "{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
    "{{ ns.s | length }}",
    "plus_doubling": NS + "{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "star_doubling": NS + "{% for i in range(64) %}{% set ns.s = ns.s * 2 %}{% endfor %}",
    "block_doubling": NS + "{% for i in range(64) %}{% set t %}{{ ns.s }}{{ ns.s }}"
    "{% endset %}{% set ns.s = t %}{% endfor %}",
    "macro_doubling": "{% macro d(n) %}{% if n %}{{ d(n - 1) }}{{ d(n - 1) }}{% else %}x"
    "{% endif %}{% endmacro %}{{ d(40) }}",
    "center_filter": "{{ 'x' | center(2**31) }}",
    "center_method": "{{ 'x'.center(2**31) }}",
    "star_repetition": "{{ 'x' * 2**31 }}",
    "list_repetition": "{{ messages * 2**31 }}",
    "percent_width": "{{ '%999999999s' % 'x' }}",
    "format_filter_width": "{{ '%999999999s' | format('x') }}",
    "str_format_width": "{{ '{:>999999999}'.format('x') }}",
    "indent_growth": "{% set ns = namespace(s='x\\n' * 1000) %}{% for i in range(30) %}"
    "{% set ns.s = ns.s | indent(1000, true) %}{% endfor %}",
    "replace_growth": "{% set ns = namespace(s='xx') %}{% for i in range(40) %}"
    "{% set ns.s = ns.s | replace('x', 'xxxxxxxx') %}{% endfor %}",
    "list_of_big_strings": "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}"
    "{% set ns.l = ns.l + ['y' * 100000] %}{% endfor %}",
    "big_integers": "{% set ns = namespace(x=10) %}{% for i in range(64) %}"
    "{% set ns.x = ns.x * ns.x %}{% endfor %}",
    "big_power": "{{ (10 ** 4000) ** 4000 }}",
    "lipsum": "{{ lipsum(10 ** 8) }}",
    "slice_count": "{{ [1, 2, 3] | slice(10 ** 8) | list | length }}",
    "output_flood": "{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}",
    "recursive_loop": "{% for x in [1] recursive %}{{ loop([1]) }}{% endfor %}",
    # widths given as arguments, and shared containers rendered as text
    "star_width": "{{ '%*s' % (999999999, 'x') }}",
    "star_width_filter": "{{ '%*s' | format(999999999, 'x') }}",
    "nested_field_width": "{{ '{:>{w}}'.format('x', w=999999999) }}",
    "shared_lists_output": "{{ [['x'] * 100000] * 100 }}",
    "shared_lists_joined": "{% set ns = namespace(l=['y' * 100000]) %}{% for i in range(30) %}"
    "{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l | join }}",
    "shared_lists_tilde": "{% set l = [['x'] * 100000] * 100 %}{{ 'a' ~ l }}",
    "shared_lists_tojson": "{{ ([messages] * 100000) | tojson }}",
    "huge_template": "x" * (2 << 20),
}


@pytest.mark.parametrize("template", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_template_refused_within_bounds(template):
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(ChatTemplateError):
            render_chat(template, MSGS, time_budget_s=BUDGET_S)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - t0 < TIME_BOUND_S
    assert peak < MEMORY_BOUND, f"{peak >> 20} MB traced"


def test_time_budget_is_named():
    with pytest.raises(ChatTemplateError, match="time budget of 0.2 s"):
        render_chat(HOSTILE["nested_range"], MSGS, time_budget_s=0.2)


def test_thread_goes_on_after_a_timeout():
    """The watchdog's exception stays inside the render: nothing fires later."""
    with pytest.raises(ChatTemplateError):
        render_chat(HOSTILE["nested_range"], MSGS, time_budget_s=0.1)
    t_end = time.perf_counter() + 0.5
    n = 0
    while time.perf_counter() < t_end:  # a stray injected exception would surface here
        n += 1
    assert n > 0


def test_a_hostile_render_does_not_stop_others():
    """Renders in several threads (as the server runs them, off its event loop): one
    template spends its budget while normal renders in other threads finish."""
    results, errors = [], []

    def hostile():
        try:
            render_chat(HOSTILE["nested_range"], MSGS, time_budget_s=1.0)
        except ChatTemplateError as e:
            errors.append(e)

    def normal():
        for _ in range(50):
            results.append(render_chat(BUILTIN_TEMPLATES["chatml"], MSGS))

    threads = [threading.Thread(target=hostile), threading.Thread(target=normal)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(errors) == 1 and len(results) == 50
    assert set(results) == {"<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"}


def test_budgets_grow_with_the_input():
    """A long conversation renders: the budgets are per character of input."""
    long = [{"role": "user", "content": "word " * 400_000}] * 3  # 6 MB of input
    out = render_chat(BUILTIN_TEMPLATES["chatml"], long)
    assert len(out) > 6_000_000
    accumulate = (
        "{% set ns = namespace(s='') %}{% for m in messages %}"
        "{% set ns.s = ns.s ~ m.content ~ '\\n' %}{% endfor %}{{ ns.s }}"
    )
    many = [{"role": "user", "content": "x" * 2000}] * 200  # quadratic, 40 MB in total
    assert len(render_chat(accumulate, many)) == 200 * 2001


# -- real templates render as plain Jinja does --------------------------------------------------


def plain_jinja(template: str, messages, **kw) -> str:
    """The oracle: Jinja's own immutable sandbox, with the options and helpers of
    Hugging Face's chat-template rendering, and no budgets."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = lambda v, indent=None: json.dumps(v, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = lambda m="": (_ for _ in ()).throw(ValueError(m))
    return env.from_string(template).render(messages=messages, **kw)


CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2+2? Ünïcode ✓"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And 3+3?"},
]


def _templates(request) -> dict[str, str]:
    out = dict(BUILTIN_TEMPLATES)
    for name in tiny_names():
        t = GGUFFile(tiny_model_file(name)).metadata.get("tokenizer.chat_template")
        if t:
            out[f"tiny/{name}"] = t
    for fixture in ("smollm2_path", "gemma3_path"):
        try:
            path = request.getfixturevalue(fixture)
        except pytest.skip.Exception:
            continue
        t = GGUFFile(path).metadata.get("tokenizer.chat_template")
        if t:
            out[fixture] = t
    return out


def test_real_templates_render_as_plain_jinja(request):
    templates = _templates(request)
    assert len(templates) > len(BUILTIN_TEMPLATES)
    for name, template in templates.items():
        for messages in (CONVERSATION, CONVERSATION[1:], CONVERSATION[1:] * 50):
            kw = dict(add_generation_prompt=True, bos_token="<s>", eos_token="</s>")
            try:
                want = plain_jinja(template, messages, **kw)
            except ValueError:  # the template's raise_exception: ours must refuse too
                with pytest.raises(ChatTemplateError):
                    render_chat(template, messages, **kw)
                continue
            assert render_chat(template, messages, **kw) == want, name
