"""Qwen2: llama's block with NEOX rope and biases on the q/k/v projections."""

from __future__ import annotations

from typing import Any

from llamay.arch import decoder
from llamay.arch.base import Config, read_config


def config(meta: dict[str, Any]) -> Config:
    return read_config(meta, rope="neox")


ARCH = decoder.family("qwen2", config, decoder.tensors(biases="qkv"))
