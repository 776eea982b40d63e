"""HTTP errors for every API family: one exception type, one status mapping, and the
error body each family's clients expect.

`to_http_status` maps llamay's exceptions (`llamay.errors`) to statuses; `ApiError` is
what the route handlers raise for their own checks; `error_body(family, ...)` shapes the
JSON as OpenAI, Anthropic, Ollama or llama.cpp's server would.
"""

from __future__ import annotations

from typing import Any

from llamay import errors as E

#: Most specific first: the first isinstance match wins.
_STATUS: tuple[tuple[type[BaseException], int], ...] = (
    (E.ModelNotFoundError, 404),
    (E.InvalidModelNameError, 400),
    (E.FetchError, 502),
    (E.ContextOverflowError, 400),
    (E.KVCacheFullError, 400),
    (E.SnapshotError, 400),
    (E.ConstraintError, 400),
    (E.ChatTemplateError, 400),
    (E.RequestError, 400),
    (E.TokenizerError, 400),
    (E.UnknownArchitectureError, 400),
    (E.ModelFormatError, 400),
    (E.UnsupportedTensorTypeError, 400),
    (E.GGUFError, 400),
    (E.LlamayError, 400),
)


class ApiError(Exception):
    """An HTTP error with a status, a message and (optionally) the offending parameter."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, kind: str | None = None
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind


def to_http_status(exc: BaseException) -> int:
    """The HTTP status for an exception: an `ApiError`'s own, 4xx/5xx for llamay's, else 500."""
    if isinstance(exc, ApiError):
        return exc.status
    for cls, status in _STATUS:
        if isinstance(exc, cls):
            return status
    return 500


def error_fields(exc: BaseException) -> dict[str, Any]:
    """What llama-server adds to a context overflow's error: the prompt's tokens and the
    context's size (its web UI reads them)."""
    if isinstance(exc, E.ContextOverflowError) and exc.n_ctx is not None:
        return {"n_prompt_tokens": exc.n_prompt_tokens, "n_ctx": exc.n_ctx}
    return {}


def error_kind(exc: BaseException) -> str | None:
    """The error's kind where a family names it apart from its status: a missing model,
    a prompt over the context (llama-server's type, OpenAI's code)."""
    if isinstance(exc, E.ContextOverflowError):
        return "exceed_context_size_error"
    return "model_not_found" if isinstance(exc, E.ModelNotFoundError) else None


def not_found(what: str, model: bool = False) -> ApiError:
    """A 404: a missing model (OpenAI's code model_not_found), or another missing thing."""
    return ApiError(404, what, kind="model_not_found" if model else "not_found")


_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "server_error",
}
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


#: llama-server's OpenAI routes without the /v1 prefix.
_OPENAI_UNPREFIXED = ("/chat/completions", "/models", "/responses")


def family_of(path: str) -> str:
    """Which API family a request path belongs to (decides the error body's shape)."""
    if path.startswith("/v1/messages"):
        return "anthropic"
    if path.startswith("/v1/") or path in _OPENAI_UNPREFIXED:
        return "openai"
    if path.startswith("/api/"):
        return "ollama"
    return "llamacpp"


def error_body(
    family: str,
    status: int,
    message: str,
    param: str | None = None,
    kind: str | None = None,
    fields: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`fields`: more of the error object (`error_fields`) for llama.cpp's and OpenAI's
    shapes, which llama-server serves alike."""
    if family == "anthropic":
        return {
            "type": "error",
            "error": {"type": _ANTHROPIC_TYPES.get(status, "api_error"), "message": message},
        }
    if family == "ollama":
        return {"error": message}
    # a 4xx the table does not name (405, 413, ...) is the client's: not a server_error
    etype = _OPENAI_TYPES.get(status) or (
        "invalid_request_error" if status < 500 else "server_error"
    )
    missing = kind in ("model_not_found", "not_found")  # a kind, not a type
    etype = etype if kind is None or missing else kind
    if family == "llamacpp":
        return {"error": {"code": status, "message": message, "type": etype, **(fields or {})}}
    codes = {
        "model_not_found": "model_not_found",
        "exceed_context_size_error": "context_length_exceeded",
    }
    if kind in codes or missing:  # OpenAI's: an invalid request, the code saying which
        etype = _OPENAI_TYPES[400]
    error = {"message": message, "type": etype, "param": param, "code": codes.get(kind)}
    return {"error": {**error, **(fields or {})}}
