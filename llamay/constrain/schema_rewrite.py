"""JSON-Schema rewrites applied before llguidance compiles a schema.

llguidance emits an object's properties in one fixed order. Inside one `properties`
keyword that order is the user's (e.g. "reasoning" before "answer") and is kept. Where
the schema itself defines no order, any order the spec allows must be accepted:

- a `const` / `enum` object: its keys may come in any order, so the value becomes an
  `enum` of its key permutations (nested objects included);
- properties from several places merged by `allOf` (and the node's own `properties`):
  the blocks may come in any order, so the node becomes an `anyOf` over the orders of
  its `allOf` members, the node's own property keywords moved into one of them (allOf is
  a conjunction, so moving and reordering its members keeps the schema's meaning).

Both grow factorially, so they are capped; beyond the cap the schema is refused with a
named error (or, when lenient, left in the fixed order and reported as dropped).

Objects are closed by default (`close_objects`): where a schema declares `properties`
but says nothing of `additionalProperties`, undeclared keys are not generated — llama.cpp's
json-schema-to-grammar and OpenAI's strict mode do the same. What is generated is still
valid under the schema (a subset of its instances). An object is left open where closing
it could admit an instance the schema rejects — inside `not` and `if` (closing changes what
they reject or select) — or refuse keys another part requires: where two property sets
apply to one instance (a node's own `properties` beside an `allOf` / `anyOf` / `oneOf` /
`then` / `else` / `dependentSchemas` member or a `$ref` that declares some, or several
`allOf` members), and the `$defs` entries those places refer to.
`json_schema(..., closed_objects=False)` keeps full JSON-Schema semantics.

`format` is asserted by default (generated dates really are dates); `strip_formats`
turns it into the spec's default, an annotation. Asserted, a few of llguidance's formats
are looser than the RFCs and are tightened by a `pattern` beside them (found against
jsonschema-rs's format checks): an email's local part is at most 64 octets (RFC 5321),
February 29 only in leap years, and a time has no leap second (RFC 3339 allows :60 only
at 23:59 UTC; we never emit it).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable
from typing import Any

from llamay.errors import UnsupportedConstraintError

MAX_KEY_ORDERS = 720  # permutations of one const / enum value (6 keys)
MAX_ALLOF_GROUPS = 4  # 4! = 24 alternatives

# Keywords whose value is one subschema, a map of subschemas, or a list of subschemas.
_ONE = (
    "additionalProperties",
    "items",
    "contains",
    "not",
    "if",
    "then",
    "else",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contentSchema",
    "additionalItems",
)
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_LIST = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
# What a node's own object-property block consists of (moved together: additionalProperties
# only sees the properties / patternProperties beside it).
_BLOCK = ("properties", "patternProperties", "additionalProperties", "required")


def _map_schema(node: Any, fn: Callable[..., dict], path: tuple | None = None) -> Any:
    """Apply `fn` bottom-up to every subschema (not to const / enum / default values).
    With `path` given (the root's: `()`), `fn(node, path)` also gets where the node is:
    the keywords, property names and list indices leading to it."""
    if not isinstance(node, dict):
        return node
    out = dict(node)
    at = (lambda *p: path + p) if path is not None else (lambda *p: None)
    for k in _ONE:
        if isinstance(out.get(k), dict):
            out[k] = _map_schema(out[k], fn, at(k))
    for k in _MAP:
        if isinstance(out.get(k), dict):
            out[k] = {name: _map_schema(s, fn, at(k, name)) for name, s in out[k].items()}
    for k in _LIST:
        if isinstance(out.get(k), list):
            out[k] = [_map_schema(s, fn, at(k, i)) for i, s in enumerate(out[k])]
    return fn(out) if path is None else fn(out, path)


def strip_formats(schema: Any) -> Any:
    """`format` as an annotation (JSON Schema 2020-12's default): removed everywhere."""
    return _map_schema(schema, lambda n: {k: v for k, v in n.items() if k != "format"})


_COUNTS = (
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "minProperties",
    "maxProperties",
    "minContains",
    "maxContains",
)


def integral_counts(schema: Any) -> Any:
    """Counts written as integral floats (`"maxItems": 2.0`) as the integers they are in
    JSON Schema; llguidance wants an integer."""

    def fix(n: dict) -> dict:
        return {
            k: int(v) if k in _COUNTS and isinstance(v, float) and v.is_integer() else v
            for k, v in n.items()
        }

    return _map_schema(schema, fix)


_LEAP_YEAR = r"(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)"
# A date's month is not 02, or its day is not 29, or its year is a leap year.
_NO_FALSE_LEAP_DAY = rf"^(?:.{{5}}(?:[^0].|0[^2])|.{{8}}(?:[^2].|2[^9])|{_LEAP_YEAR})"
_NO_LEAP_SECOND = r"^.{6}[0-5]"  # HH:MM: then the seconds' first digit
FORMAT_TIGHTENING = {
    "email": [r"^[^@]{1,64}@"],  # llguidance has no quoted local part: no @ in it
    "date": [_NO_FALSE_LEAP_DAY],
    "date-time": [_NO_FALSE_LEAP_DAY, "^.{11}" + _NO_LEAP_SECOND[1:]],
    "time": [_NO_LEAP_SECOND],
}


def _tighten(n: dict) -> dict:
    fmt = n.get("format")
    extra = FORMAT_TIGHTENING.get(fmt, []) if isinstance(fmt, str) else []
    return dict(n, allOf=[*n.get("allOf", []), *({"pattern": p} for p in extra)]) if extra else n


def tighten_formats(schema: Any) -> Any:
    """Asserted formats made as strict as their RFCs (see the module docstring)."""
    return _map_schema(schema, _tighten)


def _key_orders(value: Any) -> list[Any]:
    """Every rendering of a JSON value with its objects' keys in any order."""
    if isinstance(value, list):
        return [list(p) for p in itertools.product(*(_key_orders(v) for v in value))]
    if not isinstance(value, dict):
        return [value]
    per_key = {k: _key_orders(v) for k, v in value.items()}
    out = []
    for order in itertools.permutations(value):
        for vals in itertools.product(*(per_key[k] for k in order)):
            out.append(dict(zip(order, vals, strict=True)))
    return out


def _n_key_orders(value: Any) -> int:
    if isinstance(value, list):
        return math.prod(_n_key_orders(v) for v in value)
    if isinstance(value, dict):
        return math.factorial(len(value)) * math.prod(_n_key_orders(v) for v in value.values())
    return 1


class _Rewriter:
    def __init__(self, lenient: bool):
        self.lenient = lenient
        self.dropped: list[str] = []

    def refuse(self, what: str) -> None:
        if not self.lenient:
            raise UnsupportedConstraintError(
                f"JSON schema: {what} (pass lenient=True to accept it in one key order)"
            )
        self.dropped.append(f"{what}: accepted in one key order only")

    def enum_values(self, values: list) -> list:
        out, seen = [], set()
        for v in values:
            n = _n_key_orders(v)
            if n > MAX_KEY_ORDERS:
                self.refuse(f"a const/enum object with {n} key orders (over {MAX_KEY_ORDERS})")
                variants = [v]
            else:
                variants = _key_orders(v)
            for r in variants:
                key = json.dumps(r)
                if key not in seen:
                    seen.add(key)
                    out.append(r)
        return out

    def node(self, n: dict) -> dict:
        if "const" in n and _n_key_orders(n["const"]) > 1:
            n = dict(n)
            if "enum" in n:  # both: keep the enum as a conjunct
                n["allOf"] = [*n.get("allOf", []), {"enum": self.enum_values(n.pop("enum"))}]
            n["enum"] = self.enum_values([n.pop("const")])
        elif isinstance(n.get("enum"), list) and any(_n_key_orders(v) > 1 for v in n["enum"]):
            n = dict(n, enum=self.enum_values(n["enum"]))
        return self.allof_orders(n)

    def allof_orders(self, n: dict) -> dict:
        members = n.get("allOf")
        if not isinstance(members, list):
            return n
        own = {k: n[k] for k in _BLOCK if k in n}
        groups = [m for m in members if isinstance(m, dict) and _declares_properties(m)]
        if len(groups) + ("properties" in own or "patternProperties" in own) < 2:
            return n
        rest = [m for m in members if not (isinstance(m, dict) and _declares_properties(m))]
        if own:
            groups = [own, *groups]
        if len(groups) > MAX_ALLOF_GROUPS:
            self.refuse(f"allOf merging {len(groups)} property sets (over {MAX_ALLOF_GROUPS})")
            return n
        out = {k: v for k, v in n.items() if k not in _BLOCK and k != "allOf"}
        alternatives = [{"allOf": [*order, *rest]} for order in itertools.permutations(groups)]
        if "anyOf" in out:  # keep the node's own anyOf as a conjunct
            own_any = {"anyOf": out.pop("anyOf")}
            alternatives = [{"allOf": [*a["allOf"], own_any]} for a in alternatives]
        out["anyOf"] = alternatives
        return out


def _declares_properties(s: dict) -> bool:
    return any(k in s for k in ("properties", "patternProperties", "$ref"))


# Where closing an object could admit what the schema rejects (see the module docstring).
_NEGATIVE = ("not", "if")
_DEF_REF = ("#/$defs/", "#/definitions/")


def _in_place(n: dict):
    """(path step, subschema) of the subschemas that apply to the same instance as `n`."""
    for k in ("allOf", "anyOf", "oneOf"):
        if isinstance(n.get(k), list):
            yield from (((k, i), m) for i, m in enumerate(n[k]) if isinstance(m, dict))
    for k in ("then", "else"):
        if isinstance(n.get(k), dict):
            yield (k,), n[k]
    if isinstance(n.get("dependentSchemas"), dict):
        for k, m in n["dependentSchemas"].items():
            if isinstance(m, dict):
                yield ("dependentSchemas", k), m


def _open_places(schema: dict) -> tuple[set[tuple], set[tuple]]:
    """Paths of the objects that stay open, and the ($defs, name) entries that do: where
    two property sets apply to one instance (a node's own and an in-place subschema's, or
    several allOf members), and every `$ref` target from an open place, `not` or `if`."""
    places: set[tuple] = set()

    def mark(n: dict, path: tuple) -> dict:
        own = "properties" in n or "patternProperties" in n
        declaring = [(step, m) for step, m in _in_place(n) if _declares_properties(m)]
        merged = [step for step, _ in declaring if step[0] == "allOf"]
        if (own or "$ref" in n) and declaring or len(merged) > 1:
            places.add(path)
            places.update(path + step for step, _ in declaring)
        if own and "$ref" in n:
            places.add(path)
        return n

    _map_schema(schema, mark, ())
    defs: set[tuple] = set()

    def refs(n: dict, path: tuple) -> dict:
        ref = n.get("$ref")
        if isinstance(ref, str) and (path in places or _negative(path)):
            for prefix in _DEF_REF:
                if ref.startswith(prefix):
                    defs.add((prefix[2:-1], ref[len(prefix) :]))
        return n

    _map_schema(schema, refs, ())
    return places, defs


def _negative(path: tuple) -> bool:
    return any(p in _NEGATIVE for p in path if isinstance(p, str))


def close_objects(schema: Any) -> Any:
    """`additionalProperties: false` where an object declares `properties` and the schema
    leaves additionalProperties (and unevaluatedProperties) unsaid, except in the places
    the module docstring names."""
    if not isinstance(schema, dict):
        return schema
    places, defs = _open_places(schema)

    def close(n: dict, path: tuple) -> dict:
        if "properties" not in n or "additionalProperties" in n or "unevaluatedProperties" in n:
            return n
        if path in places or _negative(path) or (len(path) == 2 and path in defs):
            return n
        props = n["properties"]
        if not isinstance(props, dict):
            return n
        # Required keys the schema does not declare stay allowed (as any value), and an
        # object that needs more keys than it declares stays open: closing must never make
        # a satisfiable object unsatisfiable.
        required = [k for k in n.get("required", []) if isinstance(k, str) and k not in props]
        props = {**props, **dict.fromkeys(required, {})} if required else props
        least = n.get("minProperties")
        if isinstance(least, (int, float)) and least > len(props) and "patternProperties" not in n:
            return n
        return dict(n, properties=props, additionalProperties=False)

    return _map_schema(schema, close, ())


def any_key_order(schema: Any, lenient: bool = False) -> tuple[Any, list[str]]:
    """The schema rewritten so key orders it leaves open are all accepted; and what a
    lenient rewrite left in one order."""
    r = _Rewriter(lenient)
    return _map_schema(schema, r.node), r.dropped
