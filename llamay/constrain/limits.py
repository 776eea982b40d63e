"""Size limits on grammars, regexes and JSON schemas, checked before anything is built.

A request's constraint is untrusted input: `root ::= [a-z]{1000000000}` must be refused
at once, not expanded. The limits are far above what real constraints use (llama.cpp
refuses a repetition whose expansion reaches 2,000 rules; its JSON grammars are a few
hundred rules) and far below what would cost memory or time:

- `MAX_TEXT_CHARS`: a grammar or regex text;
- `MAX_REPETITION`: a count in `{m}`, `{m,}`, `{m,n}` (GBNF and regex) and a schema's
  `minLength`, `minItems`, `minProperties`, `minContains` (no output this engine can
  generate reaches such a minimum). A schema's *maximum* counts are not limited: llguidance
  compiles them lazily, and huge ones (2**31 - 1) are a common way of writing "no limit";
- `MAX_NESTING`: nested groups `( ... )` in a grammar or regex, nested subschemas in a schema;
- `MAX_RULES`: rules in a grammar;
- `MAX_SCHEMA_NODES`: objects, arrays and values in a JSON schema;
- `MAX_CHOICE_BYTES`: the UTF-8 bytes of a list of choices (each byte a trie node built
  in Python: 64 KiB take about a second and 20 MB).

Each is refused with `GrammarLimitError` naming the limit.
"""

from __future__ import annotations

import json
import re
from typing import Any

from llamay.errors import GrammarLimitError

MAX_TEXT_CHARS = 1 << 20
MAX_REPETITION = 100_000
MAX_NESTING = 100
MAX_RULES = 5_000
MAX_SCHEMA_NODES = 50_000
MAX_CHOICE_BYTES = 1 << 16

_MIN_COUNTS = ("minLength", "minItems", "minProperties", "minContains")


def check_text(what: str, text: str) -> None:
    if len(text) > MAX_TEXT_CHARS:
        raise GrammarLimitError(
            f"{what}: {len(text)} characters, over the limit of {MAX_TEXT_CHARS}"
        )


def check_count(what: str, digits: str) -> int:
    """A repetition count written as `digits`, refused above MAX_REPETITION before it is
    converted (a million-digit count is refused as quickly as a large one)."""
    if len(digits) > len(str(MAX_REPETITION)) or int(digits) > MAX_REPETITION:
        shown = digits if len(digits) <= 20 else digits[:20] + "..."
        raise GrammarLimitError(
            f"{what}: repetition count {shown} is over the limit of {MAX_REPETITION}"
        )
    return int(digits)


def check_nesting(what: str, depth: int, nested: str = "groups") -> None:
    if depth > MAX_NESTING:
        raise GrammarLimitError(f"{what}: {nested} nest deeper than the limit of {MAX_NESTING}")


def check_rules(what: str, n: int) -> None:
    if n > MAX_RULES:
        raise GrammarLimitError(f"{what}: {n} rules, over the limit of {MAX_RULES}")


# A quantifier `{m}`, `{m,}`, `{m,n}` (Rust regex syntax also allows spaces inside).
_REGEX_COUNT = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")


def check_regex(pattern: str) -> None:
    """A regex's length, quantifier counts and group nesting. Escapes and classes are
    skipped, so `\\{` and `[{]` are not quantifiers and `[(]` opens no group."""
    check_text("regex", pattern)
    depth, i, n = 0, 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":  # a class: skip to its closing bracket (a leading ] or ^] is literal)
            i += 1
            if i < n and pattern[i] == "^":
                i += 1
            if i < n and pattern[i] == "]":
                i += 1
            while i < n and pattern[i] != "]":
                i += 2 if pattern[i] == "\\" else 1
            i += 1
            continue
        if c == "(":
            depth += 1
            check_nesting("regex", depth)
        elif c == ")":
            depth = max(0, depth - 1)
        elif c == "{":
            m = _REGEX_COUNT.match(pattern, i)
            if m:
                for g in m.groups():
                    if g:
                        check_count("regex", g)
                i = m.end()
                continue
        i += 1


def check_choices(options: list) -> None:
    n = sum(len(str(o).encode()) for o in options)
    if n > MAX_CHOICE_BYTES:
        raise GrammarLimitError(
            f"choices: {len(options)} choices of {n} bytes in all, over the limit of "
            f"{MAX_CHOICE_BYTES} bytes"
        )


def check_schema(schema: Any) -> None:
    """A JSON schema's size, nesting (of objects and arrays) and minimum counts, in one
    iterative walk (a deeply nested schema cannot exhaust the stack)."""
    stack = [(schema, 1)]
    seen = 1
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            for k in _MIN_COUNTS:
                v = node.get(k)
                if isinstance(v, (int, float)) and not isinstance(v, bool) and v > MAX_REPETITION:
                    raise GrammarLimitError(
                        f"JSON schema: {k} {json.dumps(v)} is over the limit of {MAX_REPETITION}"
                    )
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        check_nesting("JSON schema", depth, "objects and arrays")
        seen += len(children)
        if seen > MAX_SCHEMA_NODES:
            raise GrammarLimitError(
                f"JSON schema: more than {MAX_SCHEMA_NODES} objects, arrays and values"
            )
        stack.extend((c, depth + 1) for c in children)
