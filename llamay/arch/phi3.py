"""Phi-3: NEOX rope, fused q/k/v projection (`attn_qkv` outputs [q | k | v]) and fused
gate-up (`ffn_up` outputs [gate | up], SwiGLU).

llama.cpp disables Phi-3's sliding window (the converters do not record its pattern),
so llamay does too. Long-context files (LongRoPE: `rope_factors_long/short` tensors,
context beyond `rope.scaling.original_context_length`) are refused.
"""

from __future__ import annotations

from typing import Any

from llamay.arch import decoder
from llamay.arch.base import Config, hparam, read_config
from llamay.errors import ModelFormatError


def config(meta: dict[str, Any]) -> Config:
    arch = meta["general.architecture"]
    ctx = hparam(meta, arch, "context_length")
    orig = hparam(meta, arch, "rope.scaling.original_context_length", ctx)
    if ctx > orig:
        raise ModelFormatError(
            f"{arch}: context_length {ctx} > rope.scaling.original_context_length {orig}: "
            "a LongRoPE file (rope_factors_long/short), which llamay does not implement"
        )
    return read_config(meta, rope="neox")


ARCH = decoder.family("phi3", config, decoder.tensors(fused_qkv=True, mlp="fused"))
