"""GBNF, llama.cpp's grammar syntax: parse, check as llama.cpp does, and emit Lark for
llguidance.

Supported (as llama.cpp's `grammars/README.md`): rules `name ::= ...` ending at a
newline, alternation `|`, groups `( )` (which may span lines), `* + ?`, `{m}`, `{m,}`,
`{m,n}`, string literals and character classes with escapes (`\\xHH \\uHHHH \\UHHHHHHHH
\\t \\r \\n \\\\ \\" \\[ \\]`), negated classes `[^...]`, `.`, `#` comments, and token
references `<[id]>`, `<text>` (a single vocabulary token), `!<[id]>` / `!<text>` (any
token but that one). Refused with `GrammarSyntaxError`, as llama.cpp refuses them: a
missing `root`, an undefined rule, left recursion, malformed syntax; and with
`GrammarLimitError`, before anything is expanded, a grammar over the limits of
`llamay.constrain.limits` (text length, repetition counts, nesting, rule count).

The Lark emitted uses one-character lexemes only (a literal becomes a sequence of
characters), so llguidance's greedy lexer never has to choose between overlapping
multi-character terminals: matching is character by character, as in llama.cpp.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from llamay.constrain import limits
from llamay.errors import GrammarLimitError, GrammarSyntaxError

# AST: ("lit", str) ("cls", negated, ((lo, hi), ...)) ("any",) ("ref", name)
# ("tok", id | str, negated) ("group", alts) ("rep", node, min, max | None)


@dataclass
class Grammar:
    rules: dict[str, list[list[tuple]]]  # name -> alternatives -> sequence of nodes
    order: list[str]


_ESC = {"t": "\t", "r": "\r", "n": "\n", "\\": "\\", '"': '"', "[": "[", "]": "]"}


class _Parser:
    def __init__(self, text: str):
        self.s = text
        self.n = len(text)
        self.depth = 0  # groups open at the current position

    def err(self, pos: int, msg: str):
        line = self.s.count("\n", 0, pos) + 1
        near = self.s[pos : pos + 20]
        raise GrammarSyntaxError(f"GBNF: {msg} at line {line} (near {near!r})")

    def space(self, pos: int, newline_ok: bool) -> int:
        s = self.s
        while pos < self.n:
            c = s[pos]
            if c in " \t" or (newline_ok and c in "\r\n"):
                pos += 1
            elif c == "#":
                while pos < self.n and s[pos] not in "\r\n":
                    pos += 1
            else:
                break
        return pos

    @staticmethod
    def is_word(c: str) -> bool:
        return c.isascii() and (c.isalnum() or c in "-_")

    def name(self, pos: int) -> tuple[str, int]:
        end = pos
        while end < self.n and self.is_word(self.s[end]):
            end += 1
        if end == pos:
            self.err(pos, "expecting name")
        return self.s[pos:end], end

    def integer(self, pos: int) -> tuple[int, int]:
        end = pos
        while end < self.n and self.s[end].isdigit() and self.s[end].isascii():
            end += 1
        if end == pos:
            self.err(pos, "expecting integer")
        return limits.check_count("GBNF", self.s[pos:end]), end

    def char(self, pos: int) -> tuple[str, int]:
        s = self.s
        if pos >= self.n:
            self.err(pos, "unexpected end of input")
        if s[pos] != "\\":
            return s[pos], pos + 1
        if pos + 1 >= self.n:
            self.err(pos, "unexpected end of input")
        e = s[pos + 1]
        width = {"x": 2, "u": 4, "U": 8}.get(e)
        if width:
            h = s[pos + 2 : pos + 2 + width]
            if len(h) != width or any(c not in "0123456789abcdefABCDEF" for c in h):
                self.err(pos, f"malformed \\{e} escape")
            cp = int(h, 16)
            if cp > 0x10FFFF:
                self.err(pos, f"escape \\{e}{h} is outside Unicode")
            return chr(cp), pos + 2 + width
        if e in _ESC:
            return _ESC[e], pos + 2
        self.err(pos, f"unknown escape \\{e}")

    def parse(self) -> Grammar:
        rules: dict[str, list] = {}
        order: list[str] = []
        pos = self.space(0, True)
        while pos < self.n:
            name, pos = self.name(pos)
            pos = self.space(pos, False)
            if not self.s.startswith("::=", pos):
                self.err(pos, "expecting ::=")
            pos = self.space(pos + 3, True)
            alts, pos = self.alternates(pos, nested=False)
            if name in rules:
                self.err(pos, f"rule {name!r} is defined twice")
            rules[name] = alts
            limits.check_rules("GBNF", len(rules))
            order.append(name)
            if pos < self.n:
                if self.s[pos] == "\r":
                    pos += 2 if self.s.startswith("\r\n", pos) else 1
                elif self.s[pos] == "\n":
                    pos += 1
                else:
                    self.err(pos, "expecting newline or end")
            pos = self.space(pos, True)
        return Grammar(rules, order)

    def alternates(self, pos: int, nested: bool):
        alts = []
        seq, pos = self.sequence(pos, nested)
        alts.append(seq)
        while pos < self.n and self.s[pos] == "|":
            pos = self.space(pos + 1, True)
            seq, pos = self.sequence(pos, nested)
            alts.append(seq)
        return alts, pos

    def sequence(self, pos: int, nested: bool):
        s, out = self.s, []
        while pos < self.n:
            c = s[pos]
            if c == '"':
                pos += 1
                chars = []
                while pos < self.n and s[pos] != '"':
                    ch, pos = self.char(pos)
                    chars.append(ch)
                if pos >= self.n:
                    self.err(pos, "unexpected end of input in a string literal")
                out.append(("lit", "".join(chars)))
                pos = self.space(pos + 1, nested)
            elif c == "[":
                pos += 1
                neg = pos < self.n and s[pos] == "^"
                pos += neg
                ranges = []
                while pos < self.n and s[pos] != "]":
                    lo, pos = self.char(pos)
                    hi = lo
                    if pos + 1 < self.n and s[pos] == "-" and s[pos + 1] != "]":
                        hi, pos = self.char(pos + 1)
                    ranges.append((ord(lo), ord(hi)))
                if pos >= self.n:
                    self.err(pos, "unexpected end of input in a character class")
                out.append(("cls", neg, tuple(ranges)))
                pos = self.space(pos + 1, nested)
            elif self.is_word(c):
                name, pos = self.name(pos)
                out.append(("ref", name))
                pos = self.space(pos, nested)
            elif c == "(":
                self.depth += 1
                limits.check_nesting("GBNF", self.depth)
                pos = self.space(pos + 1, True)
                alts, pos = self.alternates(pos, nested=True)
                self.depth -= 1
                if pos >= self.n or s[pos] != ")":
                    self.err(pos, "expecting ')'")
                out.append(("group", alts))
                pos = self.space(pos + 1, nested)
            elif c == ".":
                out.append(("any",))
                pos = self.space(pos + 1, nested)
            elif c == "<" or (c == "!" and s.startswith("<", pos + 1)):
                neg = c == "!"
                pos += 1 + neg
                end = s.find(">", pos)
                if end < 0:
                    self.err(pos, "unterminated token reference")
                body = s[pos:end]
                if body.startswith("[") and body.endswith("]"):
                    if not body[1:-1].isdigit():
                        self.err(pos, f"malformed token id <{body}>")
                    out.append(("tok", int(body[1:-1]), neg))
                else:
                    out.append(("tok", f"<{body}>", neg))
                pos = self.space(end + 1, nested)
            elif c in "*+?":
                if not out:
                    self.err(pos, f"expecting preceding item to {c}")
                lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
                out[-1] = ("rep", out[-1], lo, hi)
                pos = self.space(pos + 1, nested)
            elif c == "{":
                if not out:
                    self.err(pos, "expecting preceding item to {")
                pos = self.space(pos + 1, nested)
                lo, pos = self.integer(pos)
                pos = self.space(pos, nested)
                hi = lo
                if pos < self.n and s[pos] == ",":
                    pos = self.space(pos + 1, nested)
                    hi = None
                    if pos < self.n and s[pos].isdigit():
                        hi, pos = self.integer(pos)
                        pos = self.space(pos, nested)
                if pos >= self.n or s[pos] != "}":
                    self.err(pos, "expecting '}'")
                if hi is not None and hi < lo:
                    self.err(pos, f"repetition {{{lo},{hi}}} has max < min")
                out[-1] = ("rep", out[-1], lo, hi)
                pos = self.space(pos + 1, nested)
            else:
                break
        return out, pos


def parse(text: str) -> Grammar:
    """Parse and check a GBNF grammar as llama.cpp does (root, references, left recursion),
    within `llamay.constrain.limits`."""
    limits.check_text("GBNF", text)
    g = _Parser(text).parse()
    if "root" not in g.rules:
        raise GrammarSyntaxError("GBNF: the grammar has no 'root' rule")
    for name, alts in g.rules.items():
        for ref in _refs(alts):
            if ref not in g.rules:
                raise GrammarSyntaxError(f"GBNF: undefined rule {ref!r} (used in {name!r})")
    _check_left_recursion(g)
    return g


def _refs(alts):
    for seq in alts:
        for node in seq:
            yield from _node_refs(node)


def _node_refs(node):
    kind = node[0]
    if kind == "ref":
        yield node[1]
    elif kind == "group":
        yield from _refs(node[1])
    elif kind == "rep":
        yield from _node_refs(node[1])


# -- left recursion, as llama.cpp's detect_left_recursion over its flattened rules ----------


def _check_left_recursion(g: Grammar, all_copies: bool = False) -> None:
    """llama.cpp flattens groups and repetitions into generated rules, then follows
    leftmost rule references; a rule 'may be empty' only if it has an empty alternative.
    Reproduced so the same grammars are refused, with one copy standing for a
    repetition's copies: they are the same items, so the leftmost walk over them finds
    what it finds in the first (llama.cpp writes them out: `{1000000000}` must not;
    `all_copies=True` does too, for tests that compare the two)."""
    rules: list[list[list]] = []  # rule -> alternatives -> items ("T" or rule index)
    index: dict[str, int] = {}
    for name in g.order:
        index[name] = len(rules)
        rules.append([])

    def new_rule(alts) -> int:
        rules.append(alts)
        return len(rules) - 1

    def items(node) -> list:
        kind = node[0]
        if kind == "lit":
            return ["T"] * (len(node[1]) > 0)
        if kind in ("cls", "any", "tok"):
            return ["T"]
        if kind == "ref":
            return [index[node[1]]]
        if kind == "group":
            return [new_rule([flat(seq) for seq in node[1]])]
        _, inner, lo, hi = node
        one = items(inner)
        out = one * (lo if all_copies else min(lo, 1))
        if hi is None:
            rec = new_rule([])
            rules[rec] = [one + [rec], []]
            out = out + [rec]
        elif hi > lo:
            last = None
            for _ in range(hi - lo if all_copies else 1):
                last = new_rule([one + ([last] if last is not None else []), []])
            out = out + [last]
        return out

    def flat(seq) -> list:
        return [it for node in seq for it in items(node)]

    for name in g.order:
        rules[index[name]] = [flat(seq) for seq in g.rules[name]]

    n = len(rules)
    in_progress = [False] * n
    may_be_empty = [False] * n
    names = {i: nm for nm, i in index.items()}

    culprit = []

    def detect(i: int) -> bool:
        if in_progress[i]:
            culprit.append(i)
            return True
        in_progress[i] = True
        if any(len(alt) == 0 for alt in rules[i]):
            may_be_empty[i] = True
        for alt in rules[i]:
            for it in alt:
                if it == "T":
                    break
                if detect(it):
                    return True
                if not may_be_empty[it]:
                    break
        in_progress[i] = False
        return False

    for i in range(n):
        try:
            found = detect(i)
        except RecursionError:
            raise GrammarLimitError(
                "GBNF: rule references nest too deeply to check for left recursion"
            ) from None
        if found:
            who = names.get(culprit[0], "a group or repetition")
            raise GrammarSyntaxError(
                f"GBNF: left recursion in rule {who!r} (llama.cpp refuses left-recursive "
                "grammars; rewrite it right-recursively, e.g. `a ::= x a?`)"
            )


# -- Lark ----------------------------------------------------------------------------------


def _mangle(name: str) -> str:
    out = []
    for c in name:
        if c.islower() or c.isdigit():
            out.append(c)
        elif c.isupper():
            out.append("_u" + c.lower())
        elif c == "-":
            out.append("_d")
        else:
            out.append("__")
    return "r_" + "".join(out)


def _hex(cp: int) -> str:
    return "\\x{" + format(cp, "x") + "}"


def _char(cp: int) -> str:
    c = chr(cp)
    if c.isascii() and c.isalnum():
        return f'"{c}"'
    return "/" + _hex(cp) + "/"


def _class(neg: bool, ranges) -> str:
    body = "".join(_hex(lo) if lo == hi else f"{_hex(lo)}-{_hex(hi)}" for lo, hi in ranges)
    if not ranges:  # [] matches nothing, [^] anything
        return "/(?s:.)/" if neg else "/[^\\x{0}-\\x{10ffff}]/"
    return f"/[{'^' if neg else ''}{body}]/"


def to_lark(g: Grammar, token_id: Callable[[str], int | None] | None = None) -> str:
    """Lark text for llguidance; `token_id` resolves `<text>` references to ids."""

    def tok(ref, neg):
        if isinstance(ref, str):
            tid = token_id(ref) if token_id else None
            if tid is None:
                raise GrammarSyntaxError(
                    f"GBNF: token reference {ref} is not a single token of this vocabulary"
                )
            ref = tid
        return f"<[^{ref}]>" if neg else f"<[{ref}]>"

    def node(nd) -> str:
        kind = nd[0]
        if kind == "lit":
            if not nd[1]:
                return '""'
            parts = [_char(ord(c)) for c in nd[1]]
            return parts[0] if len(parts) == 1 else "(" + " ".join(parts) + ")"
        if kind == "cls":
            return _class(nd[1], nd[2])
        if kind == "any":
            return "/(?s:.)/"
        if kind == "ref":
            return _mangle(nd[1])
        if kind == "tok":
            return tok(nd[1], nd[2])
        if kind == "group":
            return "(" + alts(nd[1]) + ")"
        _, inner, lo, hi = nd
        x = node(inner)
        if (lo, hi) == (0, None):
            return f"({x})*"
        if (lo, hi) == (1, None):
            return f"({x})+"
        if (lo, hi) == (0, 1):
            return f"({x})?"
        return f"({x}){{{lo},{'' if hi is None else hi}}}"

    def seq(s) -> str:
        return " ".join(node(n) for n in s) if s else '""'

    def alts(a) -> str:
        return " | ".join(seq(s) for s in a)

    lines = ["start: " + _mangle("root")]
    lines += [f"{_mangle(name)}: {alts(g.rules[name])}" for name in g.order]
    return "\n".join(lines) + "\n"


def gbnf_to_lark(text: str, token_id: Callable[[str], int | None] | None = None) -> str:
    return to_lark(parse(text), token_id)
