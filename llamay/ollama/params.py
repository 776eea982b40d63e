"""An Ollama `params` layer as default sampler settings.

The layer is a JSON object of Ollama options (`{"stop": [...], "temperature": 0.2, ...}`).
The options llamay's sampler has become the defaults of a generation; explicit arguments
still win. `stop` strings end the generated text where they first appear (the stop string
itself is not returned, as in Ollama). Options llamay cannot honour yet (`repeat_penalty`,
`mirostat`, ...) are kept in `unsupported` and named in a warning, never dropped silently.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from llamay.ollama.errors import OllamaStoreError

#: Ollama option → (llamay `generate` argument, type).
_MAPPED: dict[str, tuple[str, type]] = {
    "temperature": ("temperature", float),
    "top_k": ("top_k", int),
    "top_p": ("top_p", float),
    "min_p": ("min_p", float),
    "seed": ("seed", int),
    "num_predict": ("max_tokens", int),
}


@dataclass(frozen=True)
class SamplerDefaults:
    """Generation defaults from a params layer (None: not set, llamay's default applies)."""

    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    seed: int | None = None
    max_tokens: int | None = None  # num_predict (-1 / -2: no limit → None)
    n_ctx: int | None = None  # num_ctx: a load-time setting
    stop: tuple[str, ...] = ()
    unsupported: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_params(cls, params: dict[str, Any], source: str = "params") -> SamplerDefaults:
        """Map an Ollama params object; raises `OllamaStoreError` for a value of a wrong type."""
        values: dict[str, Any] = {}
        unsupported: dict[str, Any] = {}
        stop: tuple[str, ...] = ()
        for key, value in params.items():
            if key == "stop":
                items = [value] if isinstance(value, str) else value
                if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
                    raise OllamaStoreError(f"{source}: 'stop' must be a string or a list of them")
                stop = tuple(s for s in items if s)
            elif key == "num_ctx":
                values["n_ctx"] = _number(source, key, value, int)
            elif key in _MAPPED:
                arg, typ = _MAPPED[key]
                values[arg] = _number(source, key, value, typ)
            else:
                unsupported[key] = value
        if values.get("max_tokens") is not None and values["max_tokens"] < 0:
            values["max_tokens"] = None  # Ollama: -1 = until the context is full
        if values.get("seed") is not None and values["seed"] < 0:
            values["seed"] = None  # Ollama: -1 = random
        if unsupported:
            warnings.warn(
                f"{source}: Ollama option(s) {', '.join(sorted(unsupported))} are not supported "
                "by llamay's sampler yet and have no effect",
                stacklevel=2,
            )
        return cls(**values, stop=stop, unsupported=unsupported)

    def generate_kwargs(self) -> dict[str, Any]:
        """The settings as keyword arguments of `Model.generate` (only those that are set)."""
        out = {}
        for arg in ("temperature", "top_k", "top_p", "min_p", "seed", "max_tokens"):
            v = getattr(self, arg)
            if v is not None:
                out[arg] = v
        return out


def _number(source: str, key: str, value: Any, typ: type) -> int | float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise OllamaStoreError(f"{source}: option {key!r} must be a number, got {value!r}")
    if typ is int:
        if not float(value).is_integer():
            raise OllamaStoreError(f"{source}: option {key!r} must be an integer, got {value!r}")
        return int(value)
    if not math.isfinite(value):
        raise OllamaStoreError(f"{source}: option {key!r} must be finite, got {value!r}")
    return float(value)


def cut_at_stops(pieces: Iterable[str], stops: Iterable[str]) -> Iterator[str]:
    """Stream `pieces` until one of `stops` appears; the stop string and what follows are
    dropped, and the source iterator is closed (so generation ends). Text that could be
    the start of a stop string is held back until it is decided."""
    stops = [s for s in stops if s]
    if not stops:
        yield from pieces
        return
    longest = max(len(s) for s in stops)
    held = ""
    it = iter(pieces)
    try:
        for piece in it:
            held += piece
            hits = [i for i in (held.find(s) for s in stops) if i >= 0]
            if hits:
                if min(hits):
                    yield held[: min(hits)]
                return
            # keep back as much as could still grow into a stop string
            keep = 0
            for k in range(min(longest - 1, len(held)), 0, -1):
                if any(s.startswith(held[-k:]) for s in stops):
                    keep = k
                    break
            if len(held) > keep:
                yield held[: len(held) - keep]
                held = held[len(held) - keep :]
        if held:
            yield held
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()
