"""Supported architectures: each a family module with `config` and pure forward pieces."""

from __future__ import annotations

from llamay.arch.base import Architecture, TensorSpec, hparam
from llamay.arch.llama import ARCH as LLAMA
from llamay.errors import UnknownArchitectureError

_FAMILIES: tuple[Architecture, ...] = (LLAMA,)
REGISTRY: dict[str, Architecture] = {
    name: fam for fam in _FAMILIES for name in (fam.name, *fam.aliases)
}


def get_architecture(name: str | None) -> Architecture:
    if name not in REGISTRY:
        raise UnknownArchitectureError(
            f"architecture {name!r} is not supported; llamay supports: "
            + ", ".join(sorted(REGISTRY))
        )
    return REGISTRY[name]


__all__ = ["Architecture", "TensorSpec", "hparam", "get_architecture", "REGISTRY"]
