"""The llama family (also Mistral-style files, which use the same graph).

As llama.cpp builds it: pre-RMSNorm blocks, NORM rope (adjacent pairs; GGUF
conversion permutes Q/K so this equals HF's rotate-half), grouped-query attention,
SwiGLU MLP, output tied to the token embedding when `output.weight` is absent.
Biases are used where the file has them; llama-3 rope scaling comes as the
optional `rope_freqs.weight` (per-dim divisors).
"""

from __future__ import annotations

from typing import Any

from llamay.arch import decoder
from llamay.arch.base import Config, read_config


def config(meta: dict[str, Any]) -> Config:
    return read_config(meta, rope="norm")


ARCH = decoder.family("llama", config, decoder.tensors(rope_freqs=True), aliases=("mistral",))
