"""The one check of sampling fields at the HTTP edge, shared by every generation API.

    sampler = make_sampler(temperature=0.7, top_k=40, xtc_threshold=0.1)   # or ApiError 400
    sampler = fit_sampler(sampler, n_vocab, n_ctx)                         # windows clamped

`make_sampler` takes llama.cpp-named fields as the client sent them (JSON numbers,
strings, lists) and refuses, with a 400 naming the field, anything the engine could not
hold: a value of the wrong type, an integer outside int32 or a float that is not a
finite f32 (the engine packs every slot's parameters into int32/f32 arrays, and a value
it cannot pack would fail the whole batch, not just this request). `fit_sampler` then
clamps what is only meaningful up to the model's size (top_k and min_keep to the
vocabulary, the penalty windows to the context: larger values mean the same) and checks
logit_bias token ids against the vocabulary.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping
from typing import Any

from llamay.errors import RequestError
from llamay.sample import Sampler
from llamay.sample.samplers import INT32_RANGE, LETTERS, stage_name
from llamay.serve.errors import ApiError

log = logging.getLogger("llamay.serve")
I32_MIN, I32_MAX = INT32_RANGE
F32_MAX = 3.4028234663852886e38
#: Strings in one list field (DRY breakers, the sampler order) and characters in each.
MAX_STRINGS, MAX_STRING_CHARS = 64, 256
MAX_LOGIT_BIAS = 1 << 16

_FIELDS = {f.name: f.type for f in dataclasses.fields(Sampler)}
#: llama.cpp's sampling fields that every API family takes as extra JSON fields (those
#: with an API-specific shape, seed, logit_bias, the sampler order and n_probs, are read
#: by each API itself).
EXTRA_FIELDS = tuple(f for f in _FIELDS if f not in ("seed", "logit_bias", "samplers", "n_probs"))
_STRING_LISTS = ("dry_sequence_breakers", "samplers")
#: Fields that count tokens of the vocabulary or of the context (values past the model's
#: size mean "all").
_VOCAB_COUNTS = ("top_k", "min_keep")
_CONTEXT_WINDOWS = ("repeat_last_n", "dry_penalty_last_n", "dry_allowed_length")


def _bad(name: str, what: str, value: Any) -> ApiError:
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return ApiError(400, f"{name} must be {what}, not {shown}", param=name)


def _integer(name: str, v: Any) -> int:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not isinstance(v, int) or isinstance(v, bool):
        raise _bad(name, "an integer", v)
    if not I32_MIN <= v <= I32_MAX:
        raise _bad(name, f"an integer in [{I32_MIN}, {I32_MAX}]", v)
    return v


def _number(name: str, v: Any) -> float:
    if not isinstance(v, int | float) or isinstance(v, bool):
        raise _bad(name, "a number", v)
    try:
        f = float(v)
    except OverflowError:  # an int too large for a float
        raise _bad(name, f"a finite number of magnitude at most {F32_MAX:.4g}", v) from None
    if not math.isfinite(f) or abs(f) > F32_MAX:
        raise _bad(name, f"a finite number of magnitude at most {F32_MAX:.4g}", v)
    return f


def _seed(v: Any) -> int | None:
    """llama.cpp's seeds: any integer; negative (its -1, the default) means random."""
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not isinstance(v, int) or isinstance(v, bool):
        raise _bad("seed", "an integer", v)
    return None if v < 0 else v % (2**32)


def _samplers(v: Any) -> tuple[str, ...]:
    """llama-server's sampler order: a list of names (its other names too), or a string
    of its one-letter names ("kt": top_k, then temperature; "top_k;temperature", names
    separated by semicolons, is taken too). As llama-server, a name or letter it does not
    know is left out, with a warning in the log (llama.cpp's infill and adaptive_p
    samplers, which llamay has not, are such names)."""
    if isinstance(v, str) and ";" not in v:
        names = tuple(LETTERS.get(c, c) for c in v)
    else:
        names = _strings("samplers", v.split(";") if isinstance(v, str) else v)
    known = tuple(s for s in names if stage_name(s) is not None)
    if len(known) < len(names):
        unknown = sorted({s for s in names if stage_name(s) is None})
        log.warning("samplers: left out %s, which llamay does not know", unknown)
    return known


def _strings(name: str, v: Any) -> tuple[str, ...]:
    if not isinstance(v, list | tuple) or not all(isinstance(s, str) for s in v):
        raise _bad(name, "a list of strings", v)
    if len(v) > MAX_STRINGS or any(len(s) > MAX_STRING_CHARS for s in v):
        raise _bad(name, f"at most {MAX_STRINGS} strings of {MAX_STRING_CHARS} characters", v)
    return tuple(v)


def _logit_bias(v: Any) -> tuple[tuple[int, float], ...]:
    items = list(v.items()) if isinstance(v, Mapping) else v
    if not isinstance(items, list | tuple):
        raise _bad("logit_bias", "a list of [token id, bias] pairs", v)
    out = []
    for item in items:
        if not isinstance(item, list | tuple) or len(item) != 2:
            raise _bad("logit_bias", "a list of [token id, bias] pairs", item)
        tok, bias = item
        tok = _integer("logit_bias", tok)
        if isinstance(bias, float) and bias == -math.inf:  # a banned token
            out.append((tok, bias))
        else:
            out.append((tok, _number("logit_bias", bias)))
    if len(out) > MAX_LOGIT_BIAS:
        raise _bad("logit_bias", f"at most {MAX_LOGIT_BIAS} entries", f"{len(out)} entries")
    return tuple(out)


def extra_params(extras: Mapping[str, Any] | None) -> dict[str, Any]:
    """The llama.cpp sampling fields among a request's undeclared fields (unchecked)."""
    return {k: extras[k] for k in EXTRA_FIELDS if k in (extras or {})}


def llama_constraint(extras: Mapping[str, Any] | None) -> dict[str, Any]:
    """llama-server's own constraint fields on chat and completion requests: `grammar`
    (GBNF) or `json_schema`, as `Model.constraint` keywords."""
    extras = extras or {}
    grammar, schema = extras.get("grammar"), extras.get("json_schema")
    if grammar is not None and not isinstance(grammar, str):
        raise ApiError(400, "grammar must be a GBNF string", param="grammar")
    if schema is not None and not isinstance(schema, dict):
        raise ApiError(400, "json_schema must be a JSON schema object", param="json_schema")
    return {k: v for k, v in (("grammar", grammar), ("json_schema", schema)) if v is not None}


def checked_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """`params` (llama.cpp's Sampler field names; None: the default) as values the engine
    can hold, or an `ApiError` 400 naming the first field that is not."""
    out: dict[str, Any] = {}
    for name, v in params.items():
        if v is None:
            continue
        kind = _FIELDS.get(name)
        if kind is None:
            raise ApiError(400, f"unknown sampling parameter {name!r}", param=name)
        if name == "seed":
            out[name] = _seed(v)
        elif name == "logit_bias":
            out[name] = _logit_bias(v)
        elif name == "samplers":
            out[name] = _samplers(v)
        elif name in _STRING_LISTS:
            out[name] = _strings(name, v)
        elif kind == "int":
            out[name] = _integer(name, v)
        elif kind == "float":
            out[name] = _number(name, v)
        else:  # a field added to Sampler without a check here
            raise ApiError(400, f"sampling parameter {name!r} is not accepted over HTTP")
    # llama.cpp's meanings of values its samplers take and llamay's refuse: a temperature
    # at or below 0 picks the best token (greedy), a top_k at or below 0 is off
    if out.get("temperature", 0.0) < 0:
        out["temperature"] = 0.0
    if out.get("top_k", 0) < 0:
        out["top_k"] = 0
    return {k: v for k, v in out.items() if v is not None}


def make_sampler(**params: Any) -> Sampler:
    """A `Sampler` from the given llama.cpp-named parameters (None: the default),
    checked as `checked_params` does; Sampler's own range checks become 400s too."""
    try:
        return Sampler(**checked_params(params))
    except (ValueError, RequestError) as e:
        raise ApiError(400, str(e)) from None


def fit_sampler(sampler: Sampler, n_vocab: int, n_ctx: int) -> Sampler:
    """`sampler` with its counts clamped to the model (same meaning) and its logit_bias
    ids checked against the vocabulary."""
    for tok, _ in sampler.logit_bias:
        if not 0 <= tok < n_vocab:
            raise ApiError(
                400,
                f"logit_bias names token {tok}, outside the vocabulary (0..{n_vocab - 1})",
                param="logit_bias",
            )
    changes = {f: n_vocab for f in _VOCAB_COUNTS if getattr(sampler, f) > n_vocab}
    changes |= {f: n_ctx for f in _CONTEXT_WINDOWS if getattr(sampler, f) > n_ctx}
    return dataclasses.replace(sampler, **changes) if changes else sampler
