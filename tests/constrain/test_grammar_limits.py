"""Hostile constraints are refused before anything is expanded (issue 22.3): the grammar
that took 6 GB, its neighbours in regex and JSON-schema form, and the other limits of
`llamay.constrain.limits`; constraints just inside the limits still work."""

from __future__ import annotations

import time
import tracemalloc

import pytest
from conftest import feed

from llamay.constrain import gbnf, json_schema, limits, regex
from llamay.errors import GrammarLimitError, GrammarSyntaxError

# Refusing must cost nothing: far less Python memory than expanding would (the 1e9
# repetition took 6 GB) and no time.
MEMORY_BOUND = 8 << 20
TIME_BOUND_S = 5.0  # generous: the machine is shared


def refused(build, *args):
    """Build a constraint that must be refused; the error and the peak Python memory."""
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(GrammarLimitError) as e:
            build(*args)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - t0 < TIME_BOUND_S
    assert peak < MEMORY_BOUND, f"{peak} bytes while refusing"
    return str(e.value)


HOSTILE_GBNF = [
    ("root ::= [a-z]{1000000000}", "repetition count 1000000000"),  # the reported one
    ("root ::= [a-z]{0,1000000000}", "repetition count 1000000000"),
    ("root ::= [a-z]{1000000000,}", "repetition count 1000000000"),
    ('root ::= "ab"{100001}', "repetition count 100001"),
    ("root ::= x{" + "9" * 100_000 + "}\nx ::= [a-z]", "repetition count 9999"),
    ("root ::= " + "(" * 1000 + '"x"' + ")" * 1000, "groups nest deeper"),
    ("\n".join(f"r{i} ::= r{i + 1}" for i in range(6000)) + "\nroot ::= r0", "rules"),
    (
        "root ::= r0\n" + "\n".join(f"r{i} ::= r{i + 1}" for i in range(2000)) + '\nr2000 ::= "x"',
        "nest too deeply",
    ),
    ('root ::= "' + "x" * (limits.MAX_TEXT_CHARS + 1) + '"', "characters"),
]


@pytest.mark.parametrize("text,named", HOSTILE_GBNF, ids=range(len(HOSTILE_GBNF)))
def test_hostile_gbnf_refused(byte_tok, text, named):
    msg = refused(gbnf, byte_tok, text)
    assert msg.startswith("GBNF:") and named in msg


HOSTILE_REGEX = [
    ("[a-z]{1000000000}", "repetition count 1000000000"),
    ("(ab){2,1000000000}", "repetition count 1000000000"),
    ("x{ 100001 }", "repetition count 100001"),
    ("(" * 1000 + "x" + ")" * 1000, "groups nest deeper"),
]


@pytest.mark.parametrize("pattern,named", HOSTILE_REGEX, ids=range(len(HOSTILE_REGEX)))
def test_hostile_regex_refused(byte_tok, pattern, named):
    msg = refused(regex, byte_tok, pattern)
    assert msg.startswith("regex:") and named in msg


def test_regex_escapes_and_classes_are_not_quantifiers(byte_tok):
    c = regex(byte_tok, r"a\{1000000000\}[{(]")
    assert feed(c, ["a{1000000000}("])


HOSTILE_SCHEMAS = [
    ({"type": "string", "minLength": 10**9}, "minLength 1000000000"),
    ({"type": "array", "minItems": 10**9}, "minItems 1000000000"),
    ({"type": "object", "minProperties": 1e9}, "minProperties 1000000000.0"),
    ({"type": "array", "contains": {"type": "integer"}, "minContains": 10**9}, "minContains"),
]


@pytest.mark.parametrize("schema,named", HOSTILE_SCHEMAS, ids=range(len(HOSTILE_SCHEMAS)))
def test_hostile_schema_refused(byte_tok, schema, named):
    msg = refused(json_schema, byte_tok, schema)
    assert msg.startswith("JSON schema:") and named in msg


def test_deep_schema_refused_as_dict_and_as_text(byte_tok):
    deep: dict = {"type": "integer"}
    for _ in range(2000):
        deep = {"type": "array", "items": deep}
    assert "nest deeper" in refused(json_schema, byte_tok, deep)
    text = '{"items":' * 100_000 + "{}" + "}" * 100_000  # deeper than json.loads recurses
    assert "nest deeper" in refused(json_schema, byte_tok, text)


def test_huge_maximum_counts_compile_lazily(byte_tok):
    """Maximum counts are not limited ("maxLength": 2**31 - 1 is a common "no limit"):
    llguidance compiles them without expanding, and they still bound nothing short."""
    tracemalloc.start()
    try:
        c = json_schema(byte_tok, {"type": "string", "maxLength": 2**31 - 1})
        s = json_schema(byte_tok, {"type": "array", "maxItems": 10**9, "items": {"const": 1}})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MEMORY_BOUND
    assert feed(c, ['"' + "x" * 300 + '"'])
    assert feed(s, ["[" + ",".join(["1"] * 300) + "]"])


def test_counts_at_the_limit_still_work(byte_tok):
    n = limits.MAX_REPETITION
    big = gbnf(byte_tok, f'root ::= "a"{{{n}}} | "b"{{2,{n}}}')
    assert feed(big, ["b" * 500])
    exact = gbnf(byte_tok, 'root ::= ("ab" | "c"){3} [0-9]{2,4}')
    assert feed(exact, ["abcab12"])
    assert not feed(gbnf(byte_tok, 'root ::= ("ab" | "c"){3} [0-9]{2,4}'), ["abc12"])
    assert feed(regex(byte_tok, f"x{{1,{n}}}y"), ["x" * 200 + "y"])
    assert feed(json_schema(byte_tok, {"type": "string", "minLength": 3}), ['"abc"'])


def test_left_recursion_through_a_large_repetition_is_still_found(byte_tok):
    """The left-recursion check walks one copy of a repetition's items, so it still
    finds recursion behind empty-able copies (`e{50000} root`)."""
    for n in (3, 50_000):
        with pytest.raises(GrammarSyntaxError, match="left recursion"):
            gbnf(byte_tok, f'root ::= e{{{n}}} root "x" | "y"\ne ::= "z" | ""')
    ok = gbnf(byte_tok, 'root ::= e{50000} root "x" | "y"\ne ::= "z"')  # e is never empty
    assert feed(ok, ["y"])


def test_huge_schema_refused(byte_tok):
    wide = {"type": "object", "properties": {f"k{i}": {"type": "integer"} for i in range(60_000)}}
    assert "more than" in refused(json_schema, byte_tok, wide)


def test_huge_choice_list_refused():
    from llamay.constrain.choice import choices

    pieces = [bytes([i]) for i in range(256)]
    options = [f"option number {i}" for i in range(20_000)]  # 330 kB: minutes of trie
    assert "choices:" in refused(choices, pieces, [], options)
    c = choices(pieces, [], [f"label {i}" for i in range(1000)])  # 8 kB: fine
    assert c.trie.n_nodes > 1000


def _random_grammar(rng) -> str:
    """Three rules of terminals, references, groups, empty literals and small bounded
    or unbounded repetitions: the shapes llama.cpp's left-recursion check walks."""
    names = ["root", "a", "b"]

    def item(depth: int) -> str:
        r = rng.random()
        if r < 0.25:
            x = rng.choice(['"x"', '""', "[a-c]"])
        elif r < 0.55 or depth > 2:
            x = rng.choice(names)
        else:
            alts = [" ".join(item(depth + 1) for _ in range(rng.randint(1, 2))) for _ in "ab"]
            x = "(" + " | ".join(alts) + ")"
        q = rng.random()
        if q < 0.2:
            lo = rng.randint(0, 3)
            x += rng.choice([f"{{{lo}}}", f"{{{lo},}}", f"{{{lo},{lo + rng.randint(0, 3)}}}"])
        elif q < 0.35:
            x += rng.choice("*+?")
        return x

    rules = []
    for name in names:
        alts = [" ".join(item(0) for _ in range(rng.randint(1, 3))) for _ in range(2)]
        rules.append(f"{name} ::= " + " | ".join(alts))
    return "\n".join(rules)


def test_left_recursion_check_equals_llamacpps_written_out_copies():
    """One copy per repetition finds left recursion exactly when llama.cpp's expansion
    (every copy written out) does, on 2,000 random grammars."""
    import random

    from llamay.constrain.grammar import _check_left_recursion, _Parser

    rng = random.Random(22)
    verdicts = set()
    for _ in range(2000):
        g = _Parser(_random_grammar(rng)).parse()
        got = []
        for all_copies in (False, True):
            try:
                _check_left_recursion(g, all_copies=all_copies)
                got.append(None)
            except GrammarSyntaxError as e:
                got.append(str(e))
        assert got[0] == got[1], g.rules
        verdicts.add(got[0] is None)
    assert verdicts == {True, False}  # both outcomes were exercised
