"""End to end on the tiny llama: constrained generation through `Model.generate` and
`Model.generation`, output parsed and validated; the mask is applied on device and
computed on the host while the device runs the step."""

from __future__ import annotations

import json

import pytest
from fixture_data import oracle, tiny_model_file

from llamay.errors import ConstraintError, UnsupportedConstraintError
from llamay.sample import Sampler

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tiny():
    import llamay

    path = tiny_model_file("llama")
    return llamay.load(path)


def test_json_schema_generations_validate(tiny):
    jsonschema = oracle("jsonschema")
    ids = tiny.tokenize("Person:", add_special=True, parse_special=True)
    for seed in range(3):
        gen = tiny.generation(
            ids, 96, Sampler(temperature=1.0, seed=seed), tiny.constraint(json_schema=SCHEMA)
        )
        out = tiny.detokenize(list(gen))
        assert gen.finish_reason == "stop", out
        jsonschema.validate(json.loads(out), SCHEMA)
        assert gen.mask_seconds / gen.n_generated < 0.05  # host mask time per token


def test_choices_regex_grammar_and_any_json(tiny):
    assert tiny.generate("Answer:", max_tokens=16, choices=["yes", "no"], seed=0) in ("yes", "no")
    out = tiny.generate("Code:", max_tokens=16, regex="[0-9]{3}-[a-z]{2}", seed=1)
    assert len(out) == 6 and out[:3].isdigit() and out[3] == "-" and out[4:].isalpha()
    out = tiny.generate("x", max_tokens=32, grammar='root ::= "(" [a-c]{2,4} ")"', seed=2)
    assert out[0] == "(" and out[-1] == ")" and set(out[1:-1]) <= set("abc")
    ids = tiny.tokenize("x", add_special=True, parse_special=True)
    gen = tiny.generation(ids, 64, Sampler(temperature=1.0, seed=3), tiny.constraint(json=True))
    out = tiny.detokenize(list(gen))
    if gen.finish_reason == "stop":  # a random model may still be inside a string at the end
        json.loads(out)


def test_constraint_errors_are_request_errors(tiny):
    with pytest.raises(UnsupportedConstraintError, match="uniqueItems"):
        tiny.generate("x", json_schema={"type": "array", "uniqueItems": True})
    with pytest.raises(ConstraintError, match="undefined rule"):
        tiny.generate("x", grammar="root ::= nope")
    with pytest.raises(ConstraintError, match="one constraint"):
        tiny.generate("x", regex="a", choices=["a"])


def test_cli_constraint_flags(tiny, tmp_path):
    from typer.testing import CliRunner

    from llamay_cli.main import app

    runner = CliRunner()
    gf = tmp_path / "g.gbnf"
    gf.write_text('root ::= "yes" | "no"\n')
    base = ["generate", "Q:", "-m", str(tiny.path), "-n", "8", "-s", "0"]
    r = runner.invoke(app, [*base, "--grammar-file", str(gf)])
    assert r.exit_code == 0 and r.stdout.strip() in ("yes", "no"), r.output
    schema = json.dumps({"type": "integer", "minimum": 0, "maximum": 9})
    r = runner.invoke(app, [*base, "--json-schema", schema, "--repeat-penalty", "1.1"])
    assert r.exit_code == 0 and 0 <= int(r.stdout.strip()) <= 9, r.output
    r = runner.invoke(app, [*base, "--json-schema", '{"uniqueItems": true, "type": "array"}'])
    assert r.exit_code == 1 and "uniqueItems" in r.output


def test_seeded_sampling_with_penalties_and_logprobs(tiny):
    kw = dict(max_tokens=12, temperature=1.0, seed=7, repeat_penalty=1.3, dry_multiplier=0.8)
    assert tiny.generate("Once", **kw) == tiny.generate("Once", **kw)
    ids = tiny.tokenize("Once", add_special=True, parse_special=True)
    gen = tiny.generation(ids, 6, Sampler(temperature=0.0, n_probs=3))
    toks = list(gen)
    assert len(gen.logprobs) == len(toks) == 6
    for tok, (lp, top) in zip(toks, gen.logprobs, strict=True):
        assert top[0][0] == tok and abs(top[0][1] - lp) < 1e-5  # greedy picks the best
        assert top[0][1] >= top[1][1] >= top[2][1]


def test_budget_exhausted_inside_a_constraint_is_an_error(tiny):
    from llamay.errors import ConstraintIncompleteError

    with pytest.raises(ConstraintIncompleteError, match="max_tokens") as e:
        tiny.generate("x", max_tokens=3, regex="[a-z]{80}", seed=0)
    assert len(e.value.partial) >= 1 and e.value.partial.isalpha()
    with pytest.raises(ConstraintIncompleteError):
        list(tiny.generate("x", max_tokens=3, regex="[a-z]{80}", seed=0, stream=True))


def test_lenient_schema_warns_what_it_drops(tiny):
    schema = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True, "maxItems": 2}
    with pytest.warns(UserWarning, match="uniqueItems"):
        c = tiny.constraint(json_schema=schema, lenient=True)
    assert any("uniqueItems" in d for d in c.dropped)


def test_regex_errors_say_what_is_wrong_and_where(tiny):
    """llguidance's regex errors span lines (the regex, a caret, `error: ...`): the
    message keeps the cause and the text, and in a schema names the `pattern` keyword."""
    with pytest.raises(ConstraintError, match=r"unclosed group in '\('"):
        tiny.constraint(regex="(")
    with pytest.raises(
        UnsupportedConstraintError, match=r"`pattern` regex.*look-around.*'\(\?<=a\)b'"
    ):
        tiny.constraint(json_schema={"type": "string", "pattern": "(?<=a)b"})
