"""llama.cpp's grammar integration tables through llamay's GBNF and JSON-Schema paths
(cases restated in llamacpp_grammar_cases.py), plus GBNF syntax llama.cpp documents."""

from __future__ import annotations

import pytest
from conftest import EOS, feed, special
from llamacpp_grammar_cases import GRAMMARS, PRODUCT_SCHEMA, REJECTED, SCHEMAS, SPEC_OVER_LLAMACPP

from llamay.constrain import gbnf, json_schema, regex
from llamay.errors import GrammarSyntaxError, UnsupportedConstraintError


def items(x):
    return [x] if isinstance(x, str) else x


@pytest.mark.parametrize("desc, grammar, good, bad", GRAMMARS, ids=[g[0] for g in GRAMMARS])
def test_llamacpp_grammar_table(byte_tok, desc, grammar, good, bad):
    for x in good:
        assert feed(gbnf(byte_tok, grammar), items(x)), f"{desc}: should match {x!r}"
    for x in bad:
        assert not feed(gbnf(byte_tok, grammar), items(x)), f"{desc}: should not match {x!r}"


@pytest.mark.parametrize("desc, grammar", REJECTED, ids=[r[0] for r in REJECTED])
def test_llamacpp_rejected_grammars(byte_tok, desc, grammar):
    with pytest.raises(GrammarSyntaxError, match="root|undefined rule 'numero'|left recursion"):
        gbnf(byte_tok, grammar)


@pytest.mark.parametrize("desc, schema, good, bad", SCHEMAS, ids=[s[0] for s in SCHEMAS])
def test_llamacpp_schema_table(byte_tok, desc, schema, good, bad):
    for x in good:
        assert feed(json_schema(byte_tok, schema), [x]), f"{desc}: should match {x!r}"
    for x in bad:
        got = feed(json_schema(byte_tok, schema), [x])
        assert got == ((desc, x) in SPEC_OVER_LLAMACPP), f"{desc}: {x!r}"


def test_unenforceable_keyword_is_refused_by_name(byte_tok):
    with pytest.raises(UnsupportedConstraintError, match="uniqueItems"):
        json_schema(byte_tok, PRODUCT_SCHEMA)
    c = json_schema(byte_tok, PRODUCT_SCHEMA, lenient=True)
    assert any("uniqueItems" in d for d in c.dropped)
    ok = '{"productId": 1, "productName": "A green door", "price": 12.50}'
    assert feed(c, [ok])


@pytest.mark.parametrize(
    "grammar, good, bad",
    [
        ('root ::= "\\x41\\u00e9\\n\\"" # a comment\n', ['Aé\n"'], ["A"]),
        ("root ::= [^a-c\\]] [\\x30-\\x32]", ["d0", "z2"], ["a0", "]0", "d3"]),
        ('root ::= ( "a"\n  | "b" )+ "."', ["ab.", "a."], ["c.", "ab"]),
        ('root ::= "x"{2} "y"{1,}', ["xxy", "xxyyy"], ["xy", "xx"]),
        ('root ::= a-b_C\na-b_C ::= "q"', ["q"], ["Q"]),
    ],
)
def test_gbnf_syntax(byte_tok, grammar, good, bad):
    for x in good:
        assert feed(gbnf(byte_tok, grammar), [x]), x
    for x in bad:
        assert not feed(gbnf(byte_tok, grammar), [x]), x


def test_token_text_reference(byte_tok):
    names = {"<think>": special(3)}
    c = gbnf(byte_tok, "root ::= <think> (!<think>)* <think>", token_id=names.get)
    assert feed(c, [special(3), "hm", special(4), special(3)])
    with pytest.raises(GrammarSyntaxError, match="<nope>"):
        gbnf(byte_tok, "root ::= <nope>", token_id=names.get)


@pytest.mark.parametrize(
    "grammar, where",
    [
        ('root ::= "abc', "end of input"),
        ("root ::= [abc", "end of input"),
        ('root ::= "\\q"', "unknown escape"),
        ("root ::= * x", "preceding item"),
        ('root = "a"', "::="),
        ('root ::= ("a"', "')'"),
        ('root ::= "a"{3,1}', "max < min"),
    ],
)
def test_gbnf_syntax_errors_name_the_problem(byte_tok, grammar, where):
    with pytest.raises(GrammarSyntaxError, match="line 1") as e:
        gbnf(byte_tok, grammar)
    assert where in str(e.value)


def test_regex_and_eos(byte_tok):
    c = regex(byte_tok, r"[0-9]{3}-[a-z]+")
    assert feed(c, ["123-abc"])
    m = c.mask()
    assert (int(m[EOS // 32]) >> (EOS % 32)) & 1  # accepting: end-of-sequence allowed
    assert not feed(regex(byte_tok, r"[0-9]{3}-[a-z]+"), ["12-abc"])
