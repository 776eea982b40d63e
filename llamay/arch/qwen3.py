"""Qwen3 and Qwen3-MoE: NEOX rope, per-head RMSNorm of q and k before rope
(`attn_q_norm`/`attn_k_norm`, sized head_dim = `attention.key_length`, which may differ
from n_embd / n_head).

qwen3moe replaces the MLP by top-k experts: softmax over the router logits, the
`expert_used_count` largest kept and renormalised to sum to 1, each expert a SwiGLU
(`ffn_{gate,up,down}_exps`, stacked [E, out, in] per layer). See `layers.moe` for how
the experts run (gathered per token for decode, dense over all experts for prefill).
"""

from __future__ import annotations

from typing import Any

from llamay.arch import decoder
from llamay.arch.base import Config, hparam, read_config


def config(meta: dict[str, Any]) -> Config:
    return read_config(meta, rope="neox")


def config_moe(meta: dict[str, Any]) -> Config:
    arch = meta["general.architecture"]
    return read_config(
        meta,
        rope="neox",
        n_experts=hparam(meta, arch, "expert_count"),
        n_experts_used=hparam(meta, arch, "expert_used_count"),
        expert_ffn=hparam(meta, arch, "expert_feed_forward_length", 0),
    )


ARCH = decoder.family("qwen3", config, decoder.tensors(qk_norm=True))

ARCH_MOE = decoder.family("qwen3moe", config_moe, decoder.tensors(qk_norm=True, mlp="moe"))
