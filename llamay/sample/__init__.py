"""Samplers (data), the on-device sampler chain, and the constraint protocol."""

from llamay.sample.chain import (
    final_logits,
    log_probs,
    read_logprobs,
    sample,
    top_logprobs,
    unpack_mask,
)
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
    "log_probs",
    "parse_order",
    "read_logprobs",
    "sample",
    "seed_keys",
    "top_logprobs",
    "unpack_mask",
]
