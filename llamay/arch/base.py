"""What every architecture family provides, and the metadata helpers they share.

A family is data plus pure functions: `config(meta)` reads GGUF metadata into a
frozen config; `tensors` names the GGUF tensors bound into the weight pytree;
`embed`, `block` and `head` are the forward pass, which `llamay.model` composes
(`block` runs under `lax.scan` over stacked per-layer weights).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from llamay.errors import ModelFormatError

_REQUIRED = object()


def hparam(meta: dict[str, Any], arch: str, key: str, default: Any = _REQUIRED) -> Any:
    """`{arch}.{key}` from GGUF metadata; a missing required key is a ModelFormatError."""
    full = f"{arch}.{key}"
    if full in meta:
        return meta[full]
    if default is _REQUIRED:
        raise ModelFormatError(f"GGUF metadata lacks {full!r}, which the {arch} architecture needs")
    return default


@dataclass(frozen=True)
class TensorSpec:
    """A GGUF tensor bound into the weight pytree under `role`.

    `name` may contain `{i}` (per-layer tensors). `optional` tensors may be absent.
    """

    role: str
    name: str
    optional: bool = False

    @property
    def per_layer(self) -> bool:
        return "{i}" in self.name


@dataclass(frozen=True)
class Architecture:
    name: str
    config: Callable[[dict[str, Any]], Any]
    tensors: tuple[TensorSpec, ...]
    embed: Callable  # (cfg, w, tokens [B,T]) -> x [B,T,E]
    block: Callable  # (cfg, lw, x, positions, k_cache, v_cache, layer) -> (x, k_cache, v_cache)
    head: Callable  # (cfg, w, x [B,T,E]) -> logits [B,T,V]
    aliases: tuple[str, ...] = field(default=())
