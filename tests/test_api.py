"""`llamay.load` and `Model` on bad input: each failure a specific, clear exception."""

from __future__ import annotations

import pytest
from fixture_data import tiny_model_file

import llamay
from llamay.errors import (
    ContextOverflowError,
    GGUFError,
    ModelFormatError,
    ModelNotFoundError,
    RequestError,
    UnknownArchitectureError,
)
from llamay.gguf.writer import copy_gguf


@pytest.fixture(scope="module")
def tiny():
    return tiny_model_file("llama")


def test_unknown_architecture_lists_supported(tiny, tmp_path):
    bad = copy_gguf(tiny, tmp_path / "arch.gguf", metadata={"general.architecture": "nosuch"})
    with pytest.raises(UnknownArchitectureError, match="nosuch.*llama"):
        llamay.load(bad)


def test_missing_tensor_names_it(tiny, tmp_path):
    bad = copy_gguf(tiny, tmp_path / "t.gguf", tensors={"blk.2.ffn_up.weight": None})
    with pytest.raises(ModelFormatError, match=r"blk\.2\.ffn_up\.weight"):
        llamay.load(bad)


def test_missing_hparam_names_it(tiny, tmp_path):
    bad = copy_gguf(tiny, tmp_path / "h.gguf", metadata={"llama.block_count": None})
    with pytest.raises(ModelFormatError, match=r"llama\.block_count"):
        llamay.load(bad)


def test_truncated_file_is_a_gguf_error(tiny, tmp_path):
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(tiny.read_bytes()[:100_000])
    with pytest.raises(GGUFError, match="cut.gguf"):
        llamay.load(bad)


def test_missing_path_is_not_found(tmp_path):
    with pytest.raises(ModelNotFoundError):
        llamay.load(tmp_path / "absent.gguf")


def test_bad_numerics_and_requests(tiny):
    with pytest.raises(RequestError, match="numerics"):
        llamay.load(tiny, numerics="fast")
    m = llamay.load(tiny, n_ctx=64)
    with pytest.raises(ContextOverflowError, match="64"):
        m.generate("word " * 100, max_tokens=4)
    with pytest.raises(RequestError, match="empty"):
        list(m.generation([], max_tokens=4))
    with pytest.raises(RequestError, match="top_p"):
        m.generate("hi", top_p=0)


def test_generation_stops_at_context_end(tiny):
    m = llamay.load(tiny, n_ctx=40)
    from llamay.sample import GREEDY

    gen = m.generation(list(range(1000, 1030)), max_tokens=100, sampler=GREEDY)
    out = list(gen)
    assert len(out) == 10 and gen.finish_reason == "length"


def test_generate_json_schema_format_modes(tiny):
    import json

    import jsonschema

    from llamay.errors import LlamayError

    m = llamay.load(tiny)
    try:
        date = {"type": "string", "format": "date"}
        out = json.loads(m.generate("Day:", max_tokens=40, temperature=0, json_schema=date))
        jsonschema.validate(out, date, format_checker=jsonschema.FormatChecker())
        unknown = {"type": "string", "format": "x-no-such-format", "maxLength": 6}
        with pytest.raises(LlamayError, match="x-no-such-format"):
            m.generate("Day:", max_tokens=8, json_schema=unknown, format="assert")
        got = m.generate(
            "Day:", max_tokens=40, temperature=0, json_schema=unknown, format="annotation"
        )
        assert isinstance(json.loads(got), str)
        with pytest.raises(RequestError, match="format"):
            m.generate("Day:", max_tokens=8, json_schema=date, format="strict")
    finally:
        m.close()


def test_token_ids_are_checked_before_a_forward_pass(tiny):
    import numpy as np

    m = llamay.load(tiny, n_ctx=64)
    vocab = m.tokenizer.vocab_size
    for bad in ([1, vocab], (2, -5), np.array([1, 10**6])):
        with pytest.raises(RequestError, match="not in the vocabulary"):
            m.logits(bad)
    with pytest.raises(RequestError, match="not in the vocabulary"):
        m.logits_batch([[1, 2], [vocab + 3]])
    for wrong in ("hello", [1.7, 2.2], [1, True], np.array([[1, 2], [3, 4]]), 123):
        with pytest.raises(TypeError, match="token ids"):
            m.logits(wrong)
    with pytest.raises(TypeError, match="token ids"):
        m.generation("Hi there", 4)
    # logits over the whole context are fine; one more is an overflow naming the context
    assert m.logits([1] * 64).shape == (64, vocab)
    with pytest.raises(ContextOverflowError, match="holds 64"):
        m.logits([1] * 65)


def test_load_refuses_a_negative_context(tiny):
    with pytest.raises(RequestError, match="n_ctx"):
        llamay.load(tiny, n_ctx=-5)


def test_negative_max_tokens_runs_until_the_end_or_a_full_context(tiny):
    m = llamay.load(tiny, n_ctx=48)
    ids = m.tokenize("The sea", add_special=True, parse_special=True)
    whole = m.generate(ids, max_tokens=48, temperature=0)
    assert m.generate(ids, max_tokens=-1, temperature=0) == whole != ""
    from llamay.sample import GREEDY

    assert list(m.generation(ids, -1, GREEDY)) == list(m.generation(ids, 48, GREEDY))
    m.close()


def test_scoring_takes_lists_of_strings_not_one_string(tiny):
    m = llamay.load(tiny)
    with pytest.raises(TypeError, match="list of strings"):
        m.loglikelihood_rolling("The quick brown fox")
    with pytest.raises(TypeError, match="list of strings"):
        m.score("The capital", " Paris")


def test_a_script_that_never_closes_its_model_exits_cleanly(tiny, tmp_path):
    # the engine's worker thread used to outlive jax's backends at exit: a segfault
    import subprocess
    import sys

    script = tmp_path / "s.py"
    script.write_text(
        f"import llamay\nm = llamay.load({str(tiny)!r})\n"
        "print(m.generate('Once upon a time', max_tokens=4, temperature=0))\n"
    )
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip()
