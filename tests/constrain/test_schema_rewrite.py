"""The schema rewrites done before llguidance compiles: they must not change what a schema
means (checked with `jsonschema` on the whole JSON-Schema-Test-Suite), and must make the
key orders a schema leaves open acceptable."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import referencing.exceptions
from fixture_data import fixture

from llamay.constrain import json_schema
from llamay.constrain.schema_rewrite import (
    MAX_ALLOF_GROUPS,
    any_key_order,
    integral_counts,
    tighten_formats,
)
from llamay.errors import UnsupportedConstraintError


def _accepts(c, text: str) -> bool:
    return c._m.consume_tokens(list(text.encode())) and c._m.is_accepting()


def test_rewrites_keep_the_meaning_of_every_suite_schema():
    d = fixture("json-schema-test-suite", "draft2020-12")
    compared = changed = 0
    for path in sorted(d.glob("*.json")):
        for group in json.loads(path.read_text()):
            schema = group["schema"]
            new, _ = any_key_order(integral_counts(schema), lenient=True)
            before = jsonschema.Draft202012Validator(schema)
            after = jsonschema.Draft202012Validator(new)
            changed += new != schema
            for t in group["tests"]:
                try:
                    want = before.is_valid(t["data"])
                except (referencing.exceptions.Unresolvable, re.error):
                    continue  # remote refs (never fetched), \p{..} regexes (Python's re)
                assert after.is_valid(t["data"]) == want, (
                    path.name,
                    group["description"],
                    t["description"],
                )
                compared += 1
    assert compared > 1000 and changed >= 5


def test_const_object_in_any_key_order(byte_tok):
    schema = {"const": {"a": 1, "b": {"c": [{"d": 1, "e": 2}]}}}
    for text in (
        '{"a":1,"b":{"c":[{"d":1,"e":2}]}}',
        '{"b":{"c":[{"e":2,"d":1}]},"a":1}',
    ):
        assert _accepts(json_schema(byte_tok, schema), text)
    assert not _accepts(json_schema(byte_tok, schema), '{"b":{"c":[{"e":2,"d":1}]}}')
    assert not _accepts(json_schema(byte_tok, schema), '{"a":1,"a":1,"b":{"c":[]}}')


def test_too_many_key_orders_are_refused_or_dropped_when_lenient(byte_tok):
    big = {"const": {k: 0 for k in "abcdefg"}}  # 7! orders
    with pytest.raises(UnsupportedConstraintError, match="key orders"):
        json_schema(byte_tok, big)
    c = json_schema(byte_tok, big, lenient=True)
    assert any("one key order" in d for d in c.dropped)
    assert _accepts(c, json.dumps(big["const"], separators=(",", ":")))


def test_allof_blocks_in_any_order_own_properties_in_declared_order(byte_tok):
    schema = {
        "properties": {"x": {"type": "integer"}},
        "required": ["x"],
        "allOf": [
            {"properties": {"a": {"type": "string"}, "b": {"type": "string"}}},
            {"properties": {"y": {"type": "null"}}, "required": ["y"]},
        ],
    }
    ok = ['{"x":1,"a":"","b":"","y":null}', '{"y":null,"a":"","x":1}', '{"a":"","y":null,"x":1}']
    for text in ok:
        assert _accepts(json_schema(byte_tok, schema), text), text
    # inside one `properties` the declared order holds (the user's generation order)
    assert not _accepts(json_schema(byte_tok, schema), '{"x":1,"b":"","a":"","y":null}')
    assert not _accepts(json_schema(byte_tok, schema), '{"x":"1","y":null}')


def test_allof_with_too_many_property_sets_is_refused(byte_tok):
    schema = {"allOf": [{"properties": {f"p{i}": {}}} for i in range(MAX_ALLOF_GROUPS + 1)]}
    with pytest.raises(UnsupportedConstraintError, match="allOf merging 5 property sets"):
        json_schema(byte_tok, schema)


def test_property_named_format_is_not_a_format():
    schema = {"properties": {"format": {"type": "string", "format": "date"}}}
    tight = tighten_formats(schema)
    assert set(tight["properties"]) == {"format"}
    assert "allOf" in tight["properties"]["format"] and "allOf" not in tight


def test_integral_float_counts():
    assert integral_counts({"items": {"maxLength": 2.0}, "minItems": 1.5}) == {
        "items": {"maxLength": 2},
        "minItems": 1.5,
    }
