"""llama.cpp's grammar integration tables (tests/test-grammar-integration.cpp), restated
as data: (description, grammar or schema, strings that must match, strings that must
not). Token references use the byte vocabulary of conftest.py: llama.cpp's token id k
is our special token 256 + k (`T(k)` in a string, `<[256+k]>` in a grammar)."""

from __future__ import annotations

from conftest import special


def T(k: int) -> int:
    return special(k)


def tk(k: int) -> str:
    return f"<[{special(k)}]>"


# Each string is a list of items: text (fed byte by byte) and token ids.
def s(*items):
    return list(items)


GRAMMARS = [
    (
        "simple grammar",
        """
        root ::= expr
        expr ::= term ("+" term)*
        term ::= number
        number ::= [0-9]+""",
        ["42", "1+2+3+4+5", "123+456"],
        ["+", "/ 3", "1+2+3+4+5+", "12a45"],
    ),
    (
        "simple grammar with tokens",
        f"""
        root ::= {tk(10)} content {tk(11)}
        content ::= (!{tk(11)})*""",
        [
            s(T(10), "hello world", T(11)),
            s(T(10), "text with ", T(12), " other tokens ", T(13), " mixed in", T(11)),
            s(T(10), T(11)),
            s(T(10), T(12), T(13), T(14), T(15), T(11)),
            s(T(10), "a", T(11)),
        ],
        [
            s(T(10), "missing end token"),
            s(T(10)),
            s("missing start token", T(11)),
            s(T(10), T(11), T(11)),
            s(T(11), "wrong order", T(10)),
        ],
    ),
    (
        "medium complexity grammar",
        """
        root ::= expression
        expression ::= term ws (("+"|"-") ws term)*
        term ::= factor ws (("*"|"/") ws factor)*
        factor ::= number | variable | "(" expression ")" | function-call
        number ::= [0-9]+
        variable ::= [a-zA-Z_][a-zA-Z0-9_]*
        function-call ::= variable ws "(" (expression ("," ws expression)*)? ")"
        ws ::= [ \\t\\n\\r]?""",
        [
            "42",
            "1*2*3*4*5",
            "x",
            "x+10",
            "x1+y2",
            "(a+b)*(c-d)",
            "func()",
            "func(x,y+2)",
            "a*(b+c)-d/e",
            "f(g(x),h(y,z))",
            "x + 10",
            "x1 + y2",
            "(a + b) * (c - d)",
            "func()",
            "func(x, y + 2)",
            "a * (b + c) - d / e",
            "f(g(x), h(y, z))",
            "123+456",
            "123*456*789-123/456+789*123",
            "123+456*789-123/456+789*123-456/789+123*456-789/123+456*789-123/456+789*123-456",
        ],
        [
            "+",
            "/ 3x",
            "x + + y",
            "a * / b",
            "func(,)",
            "func(x y)",
            "(a + b",
            "x + y)",
            "a + b * (c - d",
            "42 +",
            "x +",
            "x + 10 +",
            "(a + b) * (c - d",
            "func(",
            "func(x, y + 2",
            "a * (b + c) - d /",
            "f(g(x), h(y, z)",
            "123+456*789-123/456+789*123-456/789+123*456-789/123+456*789-123/456+789*123-456/",
        ],
    ),
    (
        "complex grammar with tokens",
        f"""
        root ::= reasoning+ content tool-call*
        reasoning ::= {tk(10)} (!{tk(11)})* {tk(11)}
        content ::= {tk(20)} (!{tk(21)})* {tk(21)}
        tool-call ::= {tk(12)} name {tk(13)} args {tk(14)}
        name ::= (!{tk(13)})+
        args ::= (!{tk(14)})*""",
        [
            s(
                T(10),
                "I am thinking",
                T(11),
                T(20),
                "hello world!",
                T(21),
                T(12),
                "search",
                T(13),
                "query=test",
                T(14),
            ),
            s(
                T(10),
                "reasoning 1",
                T(11),
                T(10),
                "reasoning 2",
                T(11),
                T(20),
                T(21),
                T(12),
                "tool",
                T(13),
                T(14),
            ),
            s(T(10), T(11), T(20), "content", T(21)),
            s(
                T(10),
                "think",
                T(12),
                " nested",
                T(11),
                T(20),
                T(10),
                "more content",
                T(21),
                T(12),
                "fn",
                T(13),
                "x=1,y=2",
                T(14),
                T(12),
                "fn2",
                T(13),
                T(14),
            ),
            s(
                T(10),
                "reasoning",
                T(11),
                T(10),
                "more",
                T(11),
                T(10),
                "even more",
                T(11),
                T(20),
                "text",
                T(21),
                T(12),
                "a",
                T(13),
                "b",
                T(14),
                T(12),
                "c",
                T(13),
                "d",
                T(14),
            ),
        ],
        [
            s(T(20), "content only", T(21)),
            s(T(10), "no closing reasoning"),
            s(T(10), T(11), T(20), "no closing content"),
            s(T(10), T(11), T(20), T(21), T(12), "incomplete tool"),
            s(T(10), T(11), T(11), T(20), T(21)),
        ],
    ),
    (
        "special characters",
        'root ::= ... "abc" ...',
        ["abcabcabc", "aaaabcccc", "🔵🟠✅abc❌🟠🔵"],
        ["aaabcccc", "aaaaabcccc", "aaaabccc", "aaaabccccc", "🔵🟠✅❌abc❌✅🟠🔵", "🔵🟠abc🟠🔵"],
    ),
    (
        "* quantifier",
        'root ::= "a"*',
        ["", "a", "aaaaa", "a" * 18, "a" * 62],
        ["b", "ab", "aab", "ba", "a" * 62 + "b"],
    ),
    (
        "+ quantifier",
        'root ::= "a"+',
        ["a", "aaaaa", "a" * 18, "a" * 62],
        ["", "b", "ab", "aab", "ba", "a" * 62 + "b"],
    ),
    ("? quantifier", 'root ::= "a"?', ["", "a"], ["b", "ab", "aa", "ba"]),
    (
        "mixed quantifiers",
        """
        root ::= cons+ vowel* cons? (vowel cons)*
        vowel ::= [aeiouy]
        cons ::= [bcdfghjklmnpqrstvwxyz]""",
        ["yes", "no", "noyes", "crwth", "four", "bryyyy"],
        ["yess", "yesno", "forty", "catyyy"],
    ),
    ("simple exact repetition", "root ::= [ab]{4}", ["aaaa", "bbbb", "abab"], ["a", "b", "aaaaa"]),
    (
        "simple min repetition",
        "root ::= [ab]{4,}",
        ["aaaa", "aaaaab", "bbbb", "ababab"],
        ["", "aba"],
    ),
    (
        "simple max repetition",
        "root ::= [ab]{0,4}",
        ["", "a", "aa", "aaa", "aaab"],
        ["aaaaa"],
    ),
    (
        "min / max repetition",
        'root ::= ("0x" [A-F0-9]{2} " "?){3,5}',
        ["0xFF 0x12 0xAB", "0xFF 0x12 0xAB 0x00 0x00"],
        ["", "0xFF", "0xFF 0x12", "0xFF 0x12 0xAB 0x00 0x00 0x00"],
    ),
    ("segfault", "root ::= ( [x]* )*", ["", "x", "xx"], ["y", "yy"]),
    ("hang", "root ::= (((((([^x]*){0,99}){0,99}){0,99}){0,99}){0,99}){0,99}", [], []),
]

# Grammars llama.cpp refuses to build.
REJECTED = [
    (
        "missing root",
        """
        rot ::= expr
        expr ::= term ("+" term)*
        term ::= number
        number ::= [0-9]+""",
    ),
    (
        "missing reference",
        """root ::= expr
        expr ::= term ("+" term)*
        term ::= numero
        number ::= [0-9]+""",
    ),
    ("simple left recursion", 'root ::= "a" | root "a"'),
    (
        "medium left recursion",
        """
        root ::= asdf
        asdf ::= "a" | asdf "a"
        """,
    ),
    (
        "hard left recursion",
        """
        root ::= asdf
        asdf ::= "a" | foo "b"
        foo ::= "c" | asdf "d" | "e\"""",
    ),
    (
        "hardest left recursion",
        """
        root ::= asdf
        asdf ::= "a" | foo "b"
        foo ::= "c" | empty asdf "d" | "e"
        empty ::= "blah" | """,
    ),
]

INT_SCHEMAS = [
    (
        "min 0",
        {"type": "integer", "minimum": 0},
        ["0", "10", "12", "10000"],
        [
            "-1",
            "-10",
            "-10000",
            "-100000000000000000000000000000000",
            "100000000000000000000000000000000",
            "00",
            "01",
            "-0",
        ],
    ),
    (
        "min 2",
        {"type": "integer", "minimum": 2},
        ["2", "3", "4", "10", "20", "1234567890000000"],
        ["0", "1", "-1", "-100", "0", "1", "01", "02", "12345678900000000"],
    ),
    (
        "min 456",
        {"type": "integer", "minimum": 456},
        ["456", "4560", "457", "460", "500"],
        ["455", "356", "50", "050", "-1", "-456"],
    ),
    (
        "min -123",
        {"type": "integer", "minimum": -123},
        ["-123", "-122", "-11", "-1", "0", "1", "123", "1234", "2345"],
        ["-1234", "-124"],
    ),
    ("max 9999", {"type": "integer", "maximum": 9999}, ["-99999", "0", "9999"], ["10000", "99991"]),
    (
        "max -9999",
        {"type": "integer", "maximum": -9999},
        ["-10000", "-9999"],
        ["-9998", "0", "9999"],
    ),
    (
        "min 5 max 30",
        {"type": "integer", "minimum": 5, "maximum": 30},
        ["5", "10", "30"],
        ["05", "4", "-1", "31", "123", "0123"],
    ),
    (
        "min 1 max 900719925474091",
        {"type": "integer", "exclusiveMinimum": 0, "maximum": 900719925474091},
        ["1", "2", "10", "900719925474090", "900719925474091"],
        ["0", "01", "900719925474092", "9007199254740910"],
    ),
    (
        "min -1 max 1",
        {"type": "integer", "minimum": -1, "maximum": 1},
        ["-1", "0", "1"],
        ["-11", "-10", "-2", "2", "10", "11"],
    ),
    (
        "min -123 max 42",
        {"type": "integer", "minimum": -123, "maximum": 42},
        ["-123", "-122", "-13", "-11", "-2", "-1", "0", "1", "5", "10", "39", "40", "42"],
        ["-0123", "-124", "-1123", "-200", "43", "123", "0123"],
    ),
    (
        "exclusive min / max",
        {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10000},
        ["1", "9999"],
        ["0", "01", "10000", "99999"],
    ),
]

ADDRESS = {
    "number": {"type": "number"},
    "street_name": {"type": "string"},
    "street_type": {"enum": ["Street", "Avenue", "Boulevard"]},
}

SCHEMAS = INT_SCHEMAS + [
    ("empty schema (object)", {}, ["{}", '{"foo": "bar"}'], ["", "[]", "null", '""', "true"]),
    (
        "exotic formats (list)",
        {
            "items": [
                {"format": "date"},
                {"format": "uuid"},
                {"format": "time"},
                {"format": "date-time"},
            ]
        },
        [
            '["2012-04-23", "12345678-1234-1234-1234-1234567890ab", "18:25:43.511Z", '
            '"2012-04-23T18:25:43.511Z"]'
        ],
        ['["foo", "bar"]', '["12345678-1234-1234-1234-1234567890ab"]'],
    ),
    ("string", {"type": "string"}, ['"foo"', '"bar"', '""'], ["{}", '"foo": "bar"']),
    (
        "string w/ min length 1",
        {"type": "string", "minLength": 1},
        ['"foo"', '"bar"'],
        ['""', "{}", '"foo": "bar"'],
    ),
    (
        "string w/ min length 3",
        {"type": "string", "minLength": 3},
        ['"foo"', '"bar"', '"foobar"'],
        ['""', '"f"', '"fo"'],
    ),
    (
        "string w/ max length",
        {"type": "string", "maxLength": 3},
        ['"foo"', '"bar"', '""', '"f"', '"fo"'],
        ['"foobar"'],
    ),
    (
        "string w/ min & max length",
        {"type": "string", "minLength": 1, "maxLength": 4},
        ['"foo"', '"bar"', '"f"', '"barf"'],
        ['""', '"barfo"', '"foobar"'],
    ),
    ("boolean", {"type": "boolean"}, ["true", "false"], ['""', '"true"', "True", "FALSE"]),
    (
        "integer",
        {"type": "integer"},
        ["0", "12345", "1234567890123456"],
        ["", "01", "007", "12345678901234567  "],
    ),
    ("string const", {"const": "foo"}, ['"foo"'], ["foo", '"bar"']),
    ("non-string const", {"const": True}, ["true"], ["", "foo", '"true"']),
    (
        "enum",
        {"enum": ["red", "amber", "green", None, 42, ["foo"]]},
        ['"red"', "null", "42", '["foo"]'],
        ["", "420", "true", "foo"],
    ),
    (
        "simple pattern",
        {"pattern": "^[a-zA-Z0-9_-]*$"},
        ['""', '"He_llo-12"'],
        ['"!"', '"Hello World"'],
    ),
    (
        "pattern with escapes",
        {"pattern": "^a\\^\\$\\.\\[\\]\\(\\)\\|\\{\\}\\*\\+\\?b$"},
        ['"a^$.[]()|{}*+?b"'],
        ['"ab"'],
    ),
    (
        "array or null of strings",
        {"type": ["array", "null"], "items": {"type": "string"}},
        ["null", "[]", '["123"]', '["foo", "bar"]'],
        ["", "[123]", '"foo"', '["foo", 42]'],
    ),
    (
        "min+max items",
        {"items": {"type": ["number", "integer"]}, "minItems": 3, "maxItems": 5},
        ["[1, 2, 3]", "[1, 2, 3, 4]", "[1, 2, 3, 4, 5]"],
        ["[1, 2]", "[1, 2, 3, 4, 5, 6]", "1"],
    ),
    (
        "object properties",
        {"type": "object", "properties": ADDRESS},
        [
            '{ "number": 1600, "street_name": "Pennsylvania", "street_type":"Avenue"}',
            '{ "street_name": "Pennsylvania" }',
            '{ "number": 1600, "street_name": "Pennsylvania" }',
            "{}",
            '{ "number": 1600, "street_name": "Pennsylvania", "street_type": "Avenue" }',
        ],
        [
            '{ "number": "1600", "street_name": "Pennsylvania", "street_type":"Avenue"}',
            '{ "street_name": "Pennsylvania", "number": 1600 }',
            '{ "number": 1600, "street_name": "Pennsylvania", "street_type":"Avenue", '
            '"direction":"NW"}',
        ],
    ),
    (
        "additional properties can't override other properties",
        {
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "additionalProperties": True,
        },
        ['{"a": 42}', '{"c": ""}', '{"a": 42, "c": ""}', '{"a_": ""}'],
        ["", '{"a": ""}', '{"a": "", "b": ""}'],
    ),
    (
        "object properties, additionalProperties: true",
        {"type": "object", "properties": ADDRESS, "additionalProperties": True},
        [
            "{}",
            '{"number":1600,"street_name":"Pennsylvania","street_type":"Avenue"}',
            '{ "street_name": "Pennsylvania" }',
            '{ "number": 1600, "street_name": "Pennsylvania" }',
            '{ "number": 1600, "street_name": "Pennsylvania", "street_type":"Avenue", '
            '"direction":"NW"}',
            '{ "number": 1600, "street_name": "Pennsylvania", "street_type": "Avenue" }',
        ],
        [
            '{ "number": "1600", "street_name": "Pennsylvania", "street_type":"Avenue"}',
            '{ "street_name": "Pennsylvania", "number": 1600, "street_type":"Avenue"}',
        ],
    ),
    (
        "optional props in original order, additionalProperties: false",
        {"type": "object", "properties": ADDRESS, "additionalProperties": False},
        [
            '{ "street_name": "Pennsylvania" }',
            '{ "number": 1600, "street_type":"Avenue"}',
            '{ "number": 1600, "street_name": "Pennsylvania" }',
            '{ "number": 1600, "street_name": "Pennsylvania", "street_type":"Avenue"}',
            '{ "number": 1600, "street_name": "Pennsylvania", "street_type": "Avenue" }',
        ],
        [
            '{ "street_type": "Avenue", "number": 1600 }',
            '{ "number": 1600, "street_name": "Pennsylvania", "street_type": "Avenue", '
            '"direction": "NW" }',
        ],
    ),
    (
        "required + optional props each in original order",
        {
            "properties": {
                "b": {"type": "string"},
                "a": {"type": "string"},
                "d": {"type": "string"},
                "c": {"type": "string"},
            },
            "required": ["a", "b"],
            "additionalProperties": False,
        },
        [
            '{"b": "foo", "a": "bar"}',
            '{"b":"foo","a":"bar","d":"qux"}',
            '{"b":"foo", "a":"bar", "d":"qux", "c":"baz"}',
        ],
        [
            '{"a": "foo", "b": "bar"}',
            '{"b": "bar"}',
            '{"a": "foo", "c": "baz"}',
            '{"a":"foo", "b":"bar", "c":"baz", "d":"qux"}',
        ],
    ),
]

# Where llguidance follows the JSON Schema specification and llama.cpp's own
# schema-to-grammar converter is stricter by convention: these strings are valid
# instances, so they are accepted (llama.cpp's table lists them as failing).
SPEC_OVER_LLAMACPP = {
    ("min 0", "100000000000000000000000000000000"): "llama.cpp caps integer digits",
    ("min 2", "12345678900000000"): "llama.cpp caps integer digits",
    ("min+max items", "1"): "items/minItems do not imply type array",
    ("empty schema (object)", "[]"): "{} admits every JSON value",
    ("empty schema (object)", "null"): "{} admits every JSON value",
    ("empty schema (object)", '""'): "{} admits every JSON value",
    ("empty schema (object)", "true"): "{} admits every JSON value",
}

# The "required props" product schema uses uniqueItems, which cannot be enforced: it is
# refused by name rather than generated without it.
PRODUCT_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "productId": {"type": "integer"},
        "productName": {"type": "string"},
        "price": {"type": "number", "exclusiveMinimum": 0},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "uniqueItems": True},
    },
    "required": ["productId", "productName", "price"],
}
