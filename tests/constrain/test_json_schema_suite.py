"""The official JSON-Schema-Test-Suite (draft 2020-12) through the JSON-Schema constraint.

For every schema llamay accepts, every valid instance must be accepted and every invalid
one rejected; every other schema must be refused with a ConstraintError naming what it
cannot enforce. Instances are written as canonical JSON (UTF-8, integral numbers without
a fraction: the same JSON-Schema value). The counts are printed (`pytest -s`).

The suite tests JSON Schema's semantics, so it runs with `closed_objects=False` (full
semantics: llamay's default closes objects without `additionalProperties`, a subset of
their instances, checked in test_closed_objects.py). `format` is an annotation in the
suite (the spec's default), so format.json runs with `format="annotation"`; the default,
asserted formats, is checked against jsonschema-rs's format validation in
test_json_schema_formats.py.
"""

from __future__ import annotations

import collections
import json
import re

import pytest
from fixture_data import fixture

from llamay.constrain import json_schema
from llamay.errors import ConstraintError


def _canon(x):
    if isinstance(x, float) and x.is_integer():
        return int(x)
    if isinstance(x, list):
        return [_canon(i) for i in x]
    if isinstance(x, dict):
        return {k: _canon(v) for k, v in x.items()}
    return x


def accepts(c, text: str) -> bool:
    m = c._m
    return m.consume_tokens(list(text.encode())) and m.is_accepting()


@pytest.fixture(scope="module")
def suite():
    d = fixture("json-schema-test-suite", "draft2020-12")
    return sorted(d.glob("*.json"))


def test_json_schema_test_suite(byte_tok, suite):
    n = collections.Counter()
    refused_by = collections.Counter()
    wrong, refused_without_name = [], []
    for path in suite:
        for group in json.loads(path.read_text()):
            fmt = "annotation" if path.name == "format.json" else "assert"
            try:
                json_schema(byte_tok, group["schema"], format=fmt, closed_objects=False)
            except ConstraintError as e:
                n["schemas refused"] += 1
                refused_by[_feature(str(e))] += 1
                n["instances under refused schemas"] += len(group["tests"])
                if len(str(e)) < 20:
                    refused_without_name.append((path.name, group["description"], str(e)))
                continue
            n["schemas accepted"] += 1
            for t in group["tests"]:
                key = (path.name, group["description"], t["description"])
                got = accepts(
                    json_schema(byte_tok, group["schema"], format=fmt, closed_objects=False),
                    json.dumps(_canon(t["data"]), ensure_ascii=False),
                )
                if got == t["valid"]:
                    n["valid accepted" if got else "invalid rejected"] += 1
                else:
                    wrong.append((key, t["valid"]))
    print("\nJSON-Schema-Test-Suite draft2020-12:", dict(n))
    print("refused schemas by feature:", dict(refused_by.most_common()))
    assert not wrong, wrong
    assert not refused_without_name
    assert n["schemas accepted"] > 150 and n["invalid rejected"] > 200


def _feature(msg: str) -> str:
    """The feature a refusal names: the keyword list, or the message's first clause."""
    if "Resource 'http" in msg:
        return "remote $ref (never fetched)"
    m = re.search(r"keyword\(s\) ([^:]*?) cannot", msg)
    if m:
        return m.group(1)
    return re.sub(r"\s*\(pass lenient.*", "", msg.removeprefix("JSON schema: "))[:70]
