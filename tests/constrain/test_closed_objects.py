"""Issue 19 items 2-3 on the constraint side: JSON mode is an object; a schema's objects
without `additionalProperties` are closed by default (as llama.cpp's grammars and OpenAI's
strict mode), whitespace is bounded, and what is generated still satisfies the schema.
Oracles: the JSON-Schema-Test-Suite's own labels, jsonschema-rs / jsonschema."""

from __future__ import annotations

import json
import random

import jsonschema_rs
import pytest
from conftest import feed
from fixture_data import fixture, oracle, tiny_model_file
from test_json_schema_formats import random_instance

from llamay.constrain import json_object, json_schema
from llamay.constrain.schema_rewrite import close_objects
from llamay.errors import ConstraintError
from llamay.sample import Sampler

CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "population": {"type": "integer"}},
    "required": ["city"],
}


def test_json_mode_is_an_object(byte_tok):
    for text in ['{"a": 1}', "{}", '{"x": [1, {"y": null}]}']:
        assert feed(json_object(byte_tok), [text]), text
    for text in ["1.1086695648", '"a string"', "[1]", "null", "true"]:
        assert not feed(json_object(byte_tok), [text]), text


def test_undeclared_keys_refused_by_default(byte_tok):
    extra = '{"city": "Oslo", "address": "Main St"}'
    assert not feed(json_schema(byte_tok, CITY), [extra])
    assert feed(json_schema(byte_tok, CITY), ['{"city": "Oslo", "population": 700000}'])
    assert feed(json_schema(byte_tok, CITY, closed_objects=False), [extra])
    # said explicitly, it stands
    opened = dict(CITY, additionalProperties={"type": "string"})
    assert feed(json_schema(byte_tok, opened), [extra])
    assert not feed(json_schema(byte_tok, opened), ['{"city": "Oslo", "n": 1}'])


def test_nested_objects_and_alternatives_are_closed(byte_tok):
    schema = {
        "type": "object",
        "properties": {"where": CITY, "list": {"type": "array", "items": CITY}},
        "$defs": {"c": CITY},
        "anyOf": [{"required": ["where"]}, {"required": ["list"]}],
    }
    assert feed(json_schema(byte_tok, schema), ['{"where": {"city": "Oslo"}}'])
    assert not feed(json_schema(byte_tok, schema), ['{"where": {"city": "Oslo", "x": 1}}'])
    assert not feed(json_schema(byte_tok, schema), ['{"list": [{"city": "a", "x": 1}]}'])
    union = {"anyOf": [CITY, {"type": "object", "properties": {"id": {"type": "integer"}}}]}
    assert feed(json_schema(byte_tok, union), ['{"id": 3}'])
    assert not feed(json_schema(byte_tok, union), ['{"id": 3, "city": "a"}'])


MERGES = [
    # property sets merged on one instance stay open, so the merge stays satisfiable
    {
        "allOf": [
            {"properties": {"a": {"type": "integer"}}, "required": ["a"]},
            {"properties": {"b": {"type": "integer"}}, "required": ["b"]},
        ]
    },
    {
        "properties": {"a": {"type": "integer"}},
        "required": ["a"],
        "allOf": [{"properties": {"b": {"type": "integer"}}, "required": ["b"]}],
    },
    {
        "$defs": {"base": {"properties": {"a": {"type": "integer"}}, "required": ["a"]}},
        "allOf": [{"$ref": "#/$defs/base"}, {"properties": {"b": {}}, "required": ["b"]}],
    },
    {
        "$defs": {"base": {"properties": {"a": {"type": "integer"}}, "required": ["a"]}},
        "$ref": "#/$defs/base",
        "properties": {"b": {"type": "integer"}},
        "required": ["b"],
    },
    {
        "properties": {"a": {"type": "integer"}},
        "required": ["a"],
        "anyOf": [{"properties": {"b": {"type": "integer"}}, "required": ["b"]}],
    },
]


@pytest.mark.parametrize("schema", MERGES, ids=range(len(MERGES)))
def test_merged_property_sets_stay_satisfiable(byte_tok, schema):
    assert feed(json_schema(byte_tok, schema), ['{"a": 1, "b": 2}'])


def test_closing_keeps_objects_satisfiable(byte_tok):
    """A required key the schema does not declare stays allowed; an object that needs
    more keys than it declares stays open."""
    sloppy = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "b"]}
    assert feed(json_schema(byte_tok, sloppy), ['{"a": 1, "b": "x"}'])
    assert not feed(json_schema(byte_tok, sloppy), ['{"a": 1, "b": "x", "c": 2}'])
    needs_more = {"properties": {"a": {}}, "required": ["a"], "minProperties": 2}
    assert feed(json_schema(byte_tok, needs_more), ['{"a": 1, "z": 2}'])


def test_negative_places_stay_open():
    inner = {"properties": {"a": {"type": "string"}}}
    schema = {"not": inner, "if": inner, "then": {"required": ["a"]}, "properties": {}}
    closed = close_objects(schema)
    assert "additionalProperties" not in closed["not"]
    assert "additionalProperties" not in closed["if"]
    assert closed["additionalProperties"] is False


def test_whitespace_is_bounded(byte_tok):
    assert feed(json_schema(byte_tok, CITY), ["{\n" + " " * 20 + '"city": "a"}'])
    assert not feed(json_schema(byte_tok, CITY), ["{\n" + " " * 21 + '"city": "a"}'])
    assert not feed(json_schema(byte_tok, CITY), ['{  "city": "a"}'])
    assert not feed(json_object(byte_tok), ['{"a":\n\n1}'])


def test_closed_is_a_subset_on_the_test_suite(byte_tok):
    """Under the default, every suite instance the constraint accepts is one the suite
    labels valid: closing objects never admits an invalid instance."""
    d = fixture("json-schema-test-suite", "draft2020-12")
    checked = 0
    for path in sorted(d.glob("*.json")):
        fmt = "annotation" if path.name == "format.json" else "assert"
        for group in json.loads(path.read_text()):
            try:
                json_schema(byte_tok, group["schema"], format=fmt)
            except ConstraintError:
                continue
            for t in group["tests"]:
                c = json_schema(byte_tok, group["schema"], format=fmt)
                text = json.dumps(t["data"], ensure_ascii=False)
                if c._m.consume_tokens(list(text.encode())) and c._m.is_accepting():
                    assert t["valid"], (path.name, group["description"], t["description"])
                    checked += 1
    assert checked > 300


WALKED = [
    CITY,
    {"type": "object", "properties": {"inner": CITY, "tags": {"type": "array", "items": CITY}}},
    {"anyOf": [CITY, {"type": "object", "properties": {"id": {"type": "integer"}}}]},
    MERGES[0],
]


@pytest.mark.parametrize("schema", WALKED, ids=range(len(WALKED)))
def test_random_walks_satisfy_the_schema(byte_tok, schema):
    oracle = jsonschema_rs.validator_for(schema)
    rng = random.Random(19)
    made = [random_instance(json_schema(byte_tok, schema), rng, soft=40) for _ in range(80)]
    values = [json.loads(b) for b in made if b is not None]
    assert len(values) > 40
    assert [v for v in values if not oracle.is_valid(v)] == []


# -- sampled at temperature 0.7 through the engine ---------------------------------------------

OPEN_SCHEMAS = [  # as clients send them: properties, no additionalProperties
    {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    },
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 10},
            "sunny": {"type": "boolean"},
            "days": {"type": "array", "items": {"enum": ["mon", "tue"]}, "maxItems": 3},
        },
        "required": ["city"],
    },
]


def _declared_only(value, schema) -> bool:
    if isinstance(value, dict):
        props = schema.get("properties", {})
        return set(value) <= set(props) and all(
            _declared_only(v, props[k]) for k, v in value.items()
        )
    if isinstance(value, list):
        return all(_declared_only(v, schema.get("items", {})) for v in value)
    return True


def _sample(model, schema, prompt, seeds, **kw):
    jsonschema = oracle("jsonschema")
    ids = model.tokenize(prompt, add_special=True, parse_special=True)
    outs = []
    for seed in seeds:
        gen = model.generation(
            ids, 120, Sampler(temperature=0.7, seed=seed), model.constraint(json_schema=schema)
        )
        out = model.detokenize(list(gen))
        assert gen.finish_reason == "stop", out
        value = json.loads(out)
        jsonschema.validate(value, schema)
        assert _declared_only(value, schema), out
        outs.append(out)
    return outs


@pytest.fixture(scope="module")
def tiny():
    import llamay

    return llamay.load(tiny_model_file("llama"))


@pytest.mark.parametrize("schema", OPEN_SCHEMAS, ids=range(len(OPEN_SCHEMAS)))
def test_tiny_model_samples_validate(tiny, schema):
    _sample(tiny, schema, "JSON:", range(4))


def test_tiny_model_json_mode_is_an_object(tiny):
    ids = tiny.tokenize("x", add_special=True, parse_special=True)
    for seed in range(3):
        gen = tiny.generation(
            ids, 48, Sampler(temperature=0.7, seed=seed), tiny.constraint(json=True)
        )
        out = tiny.detokenize(list(gen))
        assert out.startswith("{"), out


@pytest.mark.model
@pytest.mark.slow
def test_smollm2_samples_validate(smollm2_path):
    import llamay

    m = llamay.load(smollm2_path)
    for schema, prompt in zip(OPEN_SCHEMAS, ["A person as JSON:", "Weather as JSON:"], strict=True):
        _sample(m, schema, prompt, range(5))
