"""Constraints on llguidance: JSON, JSON Schema, GBNF (via `llamay.constrain.grammar`),
Lark and regex, behind llamay's constraint protocol (`llamay.sample.constraint`).

Fail closed: a schema keyword llguidance cannot enforce, an unknown string format, a
grammar that does not parse, or any warning llguidance raises while compiling, is an
`UnsupportedConstraintError` / `GrammarSyntaxError` naming it — unless `lenient=True`,
in which case llguidance drops what it cannot enforce and `constraint.dropped` lists it.
Every grammar, regex and schema is checked against `llamay.constrain.limits` first.

One difference from llama.cpp's own grammar sampler, by llguidance's design: text the
grammar forces (a literal, a JSON key) may be produced only as the tokenizer would
tokenize it, where llama.cpp lets the model pick any tokens that spell it. After "Hi",
`root ::= "ab"` gives the one token "ab" here; llama.cpp's greedy sampler may give "a",
"b" (the likelier first token), then the end of generation. The text is the same.
"""

from __future__ import annotations

import json
import re
import weakref
from collections.abc import Sequence

import numpy as np

from llamay.constrain import limits
from llamay.constrain.schema_rewrite import (
    any_key_order,
    close_objects,
    integral_counts,
    strip_formats,
    tighten_formats,
)
from llamay.errors import ConstraintError, GrammarSyntaxError, UnsupportedConstraintError
from llamay.sample.constraint import mask_words

try:
    import llguidance
except ImportError:  # pragma: no cover - a declared dependency
    llguidance = None


def _need():
    if llguidance is None:
        raise ConstraintError(
            "structured output needs the llguidance package (pip install llguidance)"
        )
    return llguidance


class VocabAdapter:
    """What llguidance's TokenizerWrapper reads: every token's bytes (control tokens
    marked with a 0xFF prefix, as llguidance expects), EOS, and an encoder."""

    def __init__(
        self,
        pieces: Sequence[bytes],
        special: Sequence[int],
        eos: int | None,
        encode,
        bos: int | None = None,
    ):
        special = set(special)
        self.tokens = [b"\xff" + p if i in special else p for i, p in enumerate(pieces)]
        self.special_token_ids = sorted(special)
        self.eos_token_id = eos
        self.bos_token_id = bos
        self._encode = encode

    def __call__(self, s):
        if isinstance(s, bytes):
            s = s.decode("utf-8", "replace")
        return list(self._encode(s))


_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def lltokenizer_for(tokenizer, n_vocab: int | None = None):
    """llguidance's tokenizer view of a `llamay.tok.Tokenizer` (cached per tokenizer)."""
    llg = _need()
    key = (n_vocab,)
    per = _CACHE.setdefault(tokenizer, {})
    if key not in per:
        from llamay.tok.vocab import ATTR_CONTROL, ATTR_UNKNOWN, ATTR_UNUSED

        v = tokenizer.vocab
        attrs = np.asarray(v.attrs)
        special = np.flatnonzero(attrs & (ATTR_CONTROL | ATTR_UNKNOWN | ATTR_UNUSED)).tolist()
        pieces = [tokenizer.token_to_piece(i, special=True) for i in range(tokenizer.vocab_size)]
        eos = sorted(tokenizer.stop_ids) or (
            [tokenizer.eos_id] if tokenizer.eos_id is not None else []
        )
        adapter = VocabAdapter(
            pieces,
            special,
            eos[0] if eos else None,
            lambda s: tokenizer.encode(s, add_special=False, parse_special=False),
            tokenizer.bos_id,
        )
        per[key] = llg.LLTokenizer(
            llg.TokenizerWrapper(adapter),
            n_vocab=n_vocab or len(pieces),
            eos_token=eos or None,
        )
    return per[key]


_UNIMPL = re.compile(r"Unimplemented keys: \[(.*?)\]")


def _summary(msg: str) -> str:
    """llguidance's message on one line: its first line, then the cause its `error:`
    line gives and the text the caret points at (a regex parse error spans lines)."""
    lines = [line for line in msg.strip().splitlines() if line.strip()]
    head = lines[0].rstrip().rstrip(":") if lines else msg
    cause = next(
        (x.split("error:", 1)[1].strip() for x in lines if x.strip().startswith("error:")), ""
    )
    if not cause:
        return head
    at = lines[1].strip() if len(lines) > 1 and not lines[1].strip().startswith("^") else ""
    return f"{head}: {cause}" + (f" in {at!r}" if at else "")


def _classify(msg: str, what: str) -> ConstraintError:
    if what.startswith("JSON schema") and "regex parse error" in msg:  # say which keyword
        msg = msg.replace("regex parse error", "a `pattern` regex's parse error", 1)
    m = _UNIMPL.search(msg)
    if m:
        keys = ", ".join(k.strip().strip('"') for k in m.group(1).split(","))
        return UnsupportedConstraintError(
            f"{what}: keyword(s) {keys} cannot be enforced during generation "
            "(remove them, or pass lenient=True to drop them)"
        )
    for pat in ("Unknown format", "not supported", "unsupported", "Unsupported", "Unimplemented"):
        if pat in msg:
            return UnsupportedConstraintError(
                f"{what}: {_summary(msg)} (pass lenient=True to drop it)"
            )
    return GrammarSyntaxError(f"{what}: {_summary(msg)}")


class GuidanceConstraint:
    """One llguidance matcher as a `Constraint`."""

    def __init__(self, lltok, grammar: str, what: str, lenient: bool = False):
        llg = _need()
        self.what = what
        self.vocab_size = lltok.vocab_size
        is_err, msgs = llg.LLMatcher.validate_grammar_with_warnings(grammar, lltok)
        if is_err:
            raise _classify(msgs[0] if msgs else "invalid grammar", what)
        self.dropped: list[str] = list(msgs)
        if msgs and not lenient:
            raise _classify("; ".join(msgs), what)
        self._m = llg.LLMatcher(lltok, grammar, log_level=0)
        if self._m.is_error():
            raise _classify(self._m.get_error(), what)
        self._buf = np.zeros(mask_words(self.vocab_size), np.uint32)

    def mask(self) -> np.ndarray:
        self._m.unsafe_compute_mask_ptr(self._buf.ctypes.data, self._buf.nbytes)
        if self._m.is_error():
            raise ConstraintError(f"{self.what}: {self._m.get_error()}")
        return self._buf

    def advance(self, token: int) -> None:
        if not self._m.consume_token(int(token)):
            raise ConstraintError(
                f"{self.what}: token {token} is not allowed here ({self._m.get_error()})"
            )

    def rollback(self, n: int) -> None:
        """Undo the last `n` tokens advanced (speculative decoding advances over a draft
        for its masks, then rolls back)."""
        if n and not self._m.rollback(int(n)):
            raise ConstraintError(
                f"{self.what}: cannot roll back {n} tokens ({self._m.get_error()})"
            )

    def consume_bytes(self, data: bytes, tokenize) -> bool:
        """Feed text through the tokenizer (tests); False if it is rejected."""
        return self._m.consume_tokens(list(tokenize(data)))

    @property
    def done(self) -> bool:
        return self._m.is_stopped()

    @property
    def accepting(self) -> bool:
        return self._m.is_accepting()

    def reset(self) -> None:
        self._m.reset()


# -- builders ------------------------------------------------------------------------------


FORMAT_MODES = ("assert", "annotation")


def _load_schema(schema):
    if isinstance(schema, str):
        limits.check_text("JSON schema", schema)
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise GrammarSyntaxError(f"JSON schema: not valid JSON ({e})") from None
        except RecursionError:
            limits.check_nesting("JSON schema", limits.MAX_NESTING + 1, "objects and arrays")
    if isinstance(schema, bool):
        if not schema:
            raise UnsupportedConstraintError(
                "JSON schema: `false` admits no instance, so nothing can be generated"
            )
        schema = {}
    if not isinstance(schema, dict):
        raise GrammarSyntaxError("JSON schema: a schema must be an object or a boolean")
    limits.check_schema(schema)
    return schema


def json_schema_grammar(
    schema,
    lenient: bool = False,
    whitespace_flexible: bool = True,
    format: str = "assert",
    dropped: list[str] | None = None,
    closed_objects: bool = True,
) -> str:
    """llguidance's grammar for `schema`. `format="assert"` (default) enforces string
    formats (an unknown one is refused); "annotation" ignores them, as JSON Schema 2020-12
    does by default. `closed_objects` (default): objects that declare `properties` and
    leave `additionalProperties` unsaid get no undeclared keys, as llama.cpp's grammars
    and OpenAI's strict mode (`schema_rewrite.close_objects`); False: full JSON-Schema
    semantics. What a lenient compile leaves unenforced is appended to `dropped`."""
    llg = _need()
    if format not in FORMAT_MODES:
        raise ValueError(f"format must be one of {FORMAT_MODES}, not {format!r}")
    schema = _load_schema(schema)
    schema = integral_counts(schema)
    if closed_objects:
        schema = close_objects(schema)
    schema = strip_formats(schema) if format == "annotation" else tighten_formats(schema)
    schema, notes = any_key_order(schema, lenient)
    if dropped is not None:
        dropped.extend(notes)
    # Whitespace between JSON tokens is llama.cpp's `space` rule (one blank, or a newline
    # and up to 20 of indentation),
    # so a model cannot stall inside a constraint by emitting blanks forever.
    opts = {"lenient": lenient, "whitespace_flexible": whitespace_flexible}
    if whitespace_flexible:
        opts["whitespace_pattern"] = r"(?:\x20|\x0A[\x20\x09]{0,20})?"
    try:
        return llg.LLMatcher.grammar_from_json_schema(json.dumps(schema), overrides=opts)
    except ValueError as e:
        raise GrammarSyntaxError(f"JSON schema: {e}") from None


def json_schema(
    lltok,
    schema,
    lenient: bool = False,
    format: str = "assert",
    closed_objects: bool = True,
) -> GuidanceConstraint:
    """JSON conforming to `schema` (a dict, JSON text, or True for any JSON); `format`
    and `closed_objects` as in `json_schema_grammar`."""
    dropped: list[str] = []
    grammar = json_schema_grammar(
        schema, lenient, format=format, dropped=dropped, closed_objects=closed_objects
    )
    c = GuidanceConstraint(lltok, grammar, "JSON schema", lenient)
    c.dropped = dropped + c.dropped
    return c


def any_json(lltok) -> GuidanceConstraint:
    """Any JSON value (an object, array, string, number...)."""
    return GuidanceConstraint(lltok, json_schema_grammar({}), "JSON")


def json_object(lltok) -> GuidanceConstraint:
    """A JSON object: JSON mode (`json=True`), as OpenAI's `response_format: json_object`
    and Ollama's `format: "json"` specify it."""
    return GuidanceConstraint(lltok, json_schema_grammar({"type": "object"}), "JSON object")


def gbnf(lltok, text: str, token_id=None) -> GuidanceConstraint:
    """A grammar in llama.cpp's GBNF."""
    from llamay.constrain.grammar import gbnf_to_lark

    lark = gbnf_to_lark(text, token_id)
    return GuidanceConstraint(lltok, _need().LLMatcher.grammar_from_lark(lark), "GBNF grammar")


def lark(lltok, text: str) -> GuidanceConstraint:
    """A grammar in llguidance's Lark dialect."""
    limits.check_text("Lark grammar", text)
    return GuidanceConstraint(lltok, _need().LLMatcher.grammar_from_lark(text), "Lark grammar")


def regex(lltok, pattern: str) -> GuidanceConstraint:
    """Text matching `pattern` whole (Rust regex syntax)."""
    limits.check_regex(pattern)
    return GuidanceConstraint(lltok, _need().LLMatcher.grammar_from_regex(pattern), "regex")
