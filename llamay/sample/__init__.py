"""Samplers (data), the on-device sampler chain, and the constraint protocol."""

from llamay.sample.chain import final_logits, sample, unpack_mask
from llamay.sample.samplers import (
    DEFAULT_ORDER,
    GREEDY,
    HISTORY,
    STAGES,
    Sampler,
    SamplerState,
    SamplingParams,
    parse_order,
    seed_keys,
)

__all__ = [
    "DEFAULT_ORDER",
    "GREEDY",
    "HISTORY",
    "STAGES",
    "Sampler",
    "SamplerState",
    "SamplingParams",
    "final_logits",
    "parse_order",
    "sample",
    "seed_keys",
    "unpack_mask",
]
