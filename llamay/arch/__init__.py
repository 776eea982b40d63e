"""Supported architectures: each a family module with `config` and pure forward pieces."""

from __future__ import annotations

from llamay.arch.base import Architecture, Config, Rope, TensorSpec, hparam
from llamay.arch.registry import REGISTRY, architecture_of, get_architecture

__all__ = [
    "Architecture",
    "Config",
    "REGISTRY",
    "Rope",
    "TensorSpec",
    "architecture_of",
    "get_architecture",
    "hparam",
]
