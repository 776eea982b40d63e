"""SmolLM2-135M: 50 generations under assorted JSON schemas, each output validated with
`jsonschema` (the issue's acceptance test). Model-backed and slow on CPU."""

from __future__ import annotations

import json

import pytest
from fixture_data import oracle

from llamay.sample import Sampler

pytestmark = [pytest.mark.model, pytest.mark.slow]

SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    {
        "type": "array",
        "items": {"type": "string", "enum": ["red", "green", "blue"]},
        "minItems": 1,
        "maxItems": 4,
    },
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 16},
            "temperature": {"type": "number", "minimum": -50, "maximum": 60},
            "sunny": {"type": "boolean"},
        },
        "required": ["city", "temperature", "sunny"],
        "additionalProperties": False,
    },
    {
        "anyOf": [
            {"type": "integer", "minimum": 1, "maximum": 9},
            {"type": "string", "pattern": "^[a-z]{2,5}$"},
        ]
    },
    {
        "type": "object",
        "properties": {
            "title": {"type": "string", "maxLength": 24},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
            "date": {"type": "string", "format": "date"},
        },
        "required": ["title", "tags", "date"],
        "additionalProperties": False,
    },
]
PROMPTS = ["A person:", "Colours:", "Weather report:", "A value:", "A blog post:"]


def test_fifty_schema_generations_validate(smollm2_path):
    jsonschema = oracle("jsonschema")
    import llamay

    m = llamay.load(smollm2_path)
    n = 0
    for schema, prompt in zip(SCHEMAS, PROMPTS, strict=True):
        ids = m.tokenize(prompt, add_special=True, parse_special=True)
        for seed in range(10):
            gen = m.generation(
                ids, 200, Sampler(temperature=0.8, seed=seed), m.constraint(json_schema=schema)
            )
            out = m.detokenize(list(gen))
            assert gen.finish_reason == "stop", (schema, out)
            jsonschema.validate(json.loads(out), schema)
            n += 1
    assert n == 50
