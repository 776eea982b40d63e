"""Chat templates: HF-compatible helpers, built-in fallbacks, and the sandbox."""

from __future__ import annotations

import pytest
from jinja2.exceptions import SecurityError
from toktestlib import PIECES, spm_meta

from llamay.errors import ChatTemplateError
from llamay.tok import BUILTIN_TEMPLATES, Tokenizer, builtin_template_for, render_chat

MSGS = [{"role": "user", "content": "Hi"}]


def test_chatml_fallback_matches_llamacpp_default():
    out = render_chat(BUILTIN_TEMPLATES["chatml"], MSGS + [{"role": "assistant", "content": "Yo"}])
    assert out == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nYo<|im_end|>\n" + (
        "<|im_start|>assistant\n"
    )
    assert render_chat(BUILTIN_TEMPLATES["chatml"], MSGS, add_generation_prompt=False) == (
        "<|im_start|>user\nHi<|im_end|>\n"
    )


def test_builtin_choice_by_architecture():
    assert builtin_template_for("gemma3") == "gemma" == builtin_template_for("gemma2")
    assert builtin_template_for("llama") == "chatml" == builtin_template_for(None)


def test_gemma_builtin_merges_system_and_trims():
    out = render_chat(
        BUILTIN_TEMPLATES["gemma"],
        [{"role": "system", "content": " S "}, {"role": "user", "content": "\nQ\n"}],
    )
    assert out == "<start_of_turn>user\nS\n\nQ<end_of_turn>\n<start_of_turn>model\n"


def test_hf_helpers():
    t = (
        "{{ bos_token }}{{ messages | tojson }}{% for m in messages %}{% if m.role != 'user' %}"
        "{{ raise_exception('bad role') }}{% endif %}{% endfor %}{{ strftime_now('%Y') | length }}"
    )
    out = render_chat(t, [{"role": "user", "content": "é"}], bos_token="<s>")
    assert out == '<s>[{"role": "user", "content": "é"}]4'
    with pytest.raises(ChatTemplateError, match="bad role"):
        render_chat(t, [{"role": "bot", "content": "x"}])


def test_trim_blocks_like_hf():
    t = "{% for m in messages %}\n  {{ m.content }}\n{% endfor %}"
    assert render_chat(t, MSGS * 2) == "  Hi\n  Hi\n"


@pytest.mark.parametrize(
    "template",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ messages.__class__ }}",
        "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
        "{% set x = messages.append(1) %}",  # immutable sandbox
        "{{ 'a' * 100000000 }}",
        "{{ 10 ** 100000 }}",
    ],
)
def test_malicious_templates_are_refused(template):
    with pytest.raises(ChatTemplateError) as e:
        render_chat(template, MSGS)
    assert isinstance(e.value.__cause__, SecurityError)


def test_syntax_error_is_a_chat_template_error():
    with pytest.raises(ChatTemplateError, match="does not compile"):
        render_chat("{% for %}", MSGS)


def test_bos_is_not_doubled():
    meta = spm_meta(PIECES)
    meta["tokenizer.chat_template"] = "{{ bos_token }}{{ messages[0]['content'] }}"
    tok = Tokenizer.from_metadata(meta)
    assert tok.add_bos
    assert tok.apply_chat_template([{"role": "user", "content": "ab"}]) == "ab"
    assert tok.encode("ab", add_special=True, parse_special=True)[:1] == [tok.bos_id]
