"""OLMo 2: no pre-norms; RMSNorm of q and k over the whole projection (weights sized
n_head·head_dim) before NEOX rope; the attention and MLP outputs are RMS-normed
(`post_attention_norm`, `post_ffw_norm`) before the residual add; SwiGLU."""

from __future__ import annotations

from typing import Any

from llamay.arch import decoder
from llamay.arch.base import Config, read_config


def config(meta: dict[str, Any]) -> Config:
    return read_config(meta, rope="neox")


ARCH = decoder.family(
    "olmo2", config, decoder.tensors(pre_norms=False, post_norms=True, qk_norm=True)
)
