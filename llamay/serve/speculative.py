"""Speculative decoding at the HTTP edge, as llama-server has it.

- A request's draft settings: llama-server's `speculative.n_max`, `speculative.n_min`,
  `speculative.p_min` (flat dotted keys, or a nested `speculative` object), and the
  older `n_draft` for n_max; they override the server's `--draft-max`/`--draft-min`/
  `--draft-p-min` for that request (`n_max` 0: no drafts for it).
- `timings.draft_n` / `timings.draft_n_accepted` in `/completion` responses, present
  when the request drafted (llama-server adds them only then).
- The server's `--model-draft` (a draft model's path or name, or `ngram`), applied to the
  default model (`Models(speculative=...)`, `speculation`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llamay.engine.speculative import (
    DRAFT_MAX,
    DRAFT_MIN,
    DRAFT_P_MIN,
    Speculation,
    check_draft_params,
)
from llamay.errors import RequestError
from llamay.serve.errors import ApiError

_FIELDS = {"n_max": "draft_max", "n_min": "draft_min", "p_min": "draft_p_min"}


def request_draft(extras: Mapping[str, Any] | None) -> dict[str, Any]:
    """The request's draft settings as `Request` fields (draft_max, draft_min,
    draft_p_min); {} when it sets none. ApiError 400 for a bad value."""
    extras = extras or {}
    nested = extras.get("speculative")
    if nested is not None and not isinstance(nested, Mapping):
        raise ApiError(
            400, "speculative must be an object (n_max, n_min, p_min)", param="speculative"
        )
    out: dict[str, Any] = {}
    for key, field in _FIELDS.items():
        v = extras.get(f"speculative.{key}", (nested or {}).get(key))
        if v is not None:
            out[field] = v
    if "draft_max" not in out and extras.get("n_draft") is not None:
        out["draft_max"] = extras["n_draft"]
    try:
        check_draft_params(out.get("draft_max"), out.get("draft_min"), out.get("draft_p_min"))
    except RequestError as e:
        name = str(e).split(" ", 1)[0]
        param = {"draft_max": "speculative.n_max", "draft_min": "speculative.n_min"}.get(
            name, "speculative.p_min"
        )
        raise ApiError(400, str(e), param=param) from None
    return out


def draft_timings(handle) -> dict[str, int]:
    """llama-server's `draft_n` and `draft_n_accepted` timings, when the request drafted."""
    u = getattr(handle, "usage", None)
    n = getattr(u, "draft_n", 0)
    return {"draft_n": n, "draft_n_accepted": u.draft_n_accepted} if n else {}


def speculation(draft, load, draft_max=None, draft_min=None, p_min=None) -> Speculation:
    """The engine's Speculation for `--model-draft` `draft` ("ngram", or a model path or
    name `load(draft)` loads) with the server's --draft-max/--draft-min/--draft-p-min."""
    model = draft if draft == "ngram" else load(draft)
    return Speculation(
        model,
        DRAFT_MAX if draft_max is None else draft_max,
        DRAFT_MIN if draft_min is None else draft_min,
        DRAFT_P_MIN if p_min is None else p_min,
    )
