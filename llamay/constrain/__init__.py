"""Constraints for structured output: JSON / JSON Schema / GBNF / Lark / regex on
llguidance, and lexicon / choice tries of our own. Each implements the protocol of
`llamay.sample.constraint` and fails closed (`llamay.errors.ConstraintError`)."""

from llamay.constrain.guidance import (
    GuidanceConstraint,
    any_json,
    gbnf,
    json_object,
    json_schema,
    lark,
    lltokenizer_for,
    regex,
)

__all__ = [
    "GuidanceConstraint",
    "any_json",
    "gbnf",
    "json_object",
    "json_schema",
    "lark",
    "lltokenizer_for",
    "regex",
]
