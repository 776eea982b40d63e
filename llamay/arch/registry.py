"""The families by name: `get_architecture(name)`, and `architecture_of(cfg)` for a config
(its research variant, or its family's). Apart from `base` so that the families, which
import `base`, are never imported back by it."""

from __future__ import annotations

from llamay.arch.base import Architecture
from llamay.arch.bert import ARCH as BERT
from llamay.arch.gemma import GEMMA2, GEMMA3
from llamay.arch.llama import ARCH as LLAMA
from llamay.arch.olmo2 import ARCH as OLMO2
from llamay.arch.phi3 import ARCH as PHI3
from llamay.arch.qwen2 import ARCH as QWEN2
from llamay.arch.qwen3 import ARCH as QWEN3
from llamay.arch.qwen3 import ARCH_MOE as QWEN3MOE
from llamay.arch.starcoder2 import ARCH as STARCODER2
from llamay.errors import UnknownArchitectureError

_FAMILIES: tuple[Architecture, ...] = (
    LLAMA,
    QWEN2,
    QWEN3,
    QWEN3MOE,
    PHI3,
    GEMMA2,
    GEMMA3,
    OLMO2,
    STARCODER2,
    BERT,
)
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


def architecture_of(cfg) -> Architecture:
    """The Architecture a config runs: its research variant, or its family's."""
    impl = getattr(cfg, "impl", None)
    if impl is not None:
        return impl
    return get_architecture(cfg.arch)
