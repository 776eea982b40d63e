"""StarCoder2: LayerNorm (weight and bias) pre-norms and final norm, biases on every
linear, NEOX rope, an ungated MLP `down(gelu_tanh(up·h + b_up)) + b_down`."""

from __future__ import annotations

from typing import Any

from llamay.arch import decoder
from llamay.arch.base import Config, read_config


def config(meta: dict[str, Any]) -> Config:
    return read_config(meta, rope="neox", norm="layer", gated=False, act="gelu")


ARCH = decoder.family(
    "starcoder2", config, decoder.tensors(biases="all", norm_bias=True, mlp="plain")
)
