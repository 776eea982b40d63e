"""Gemma 2 and Gemma 3, as llama.cpp's gemma2/gemma3 graphs compute them.

Both: the token embedding scaled by √n_embd, pre- and post-norms around attention and
the MLP (RMSNorm; GGUF conversion already added Gemma's +1 to the norm weights, so
they are used as stored), NEOX rope, GeGLU (tanh GELU), tied output, and local
(sliding-window) layers interleaved with global ones. Attention scale 1/√head_dim
(= transformers' query_pre_attn_scalar for these sizes), except for the 27B models,
which use 1/√(n_embd/n_head), as llama.cpp decides by layer count.

- gemma2: attention scores softcapped (`attn_logit_softcapping`, before the mask),
  final logits softcapped (`final_logit_softcapping`); layer il is local iff il is even.
- gemma3: per-head RMSNorm of q and k before rope; no attention softcap (a final
  softcap only if the file sets one); llama.cpp's hard-coded pattern 6: layer il is
  local iff il % 6 < 5. Local layers use rope base 10000 without scaling
  (`rope.freq_base_swa` if the file has it), global layers the file's base and scaling.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from llamay.arch import decoder
from llamay.arch.base import Config, Rope, hparam, read_config

_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


def _gemma(meta: dict[str, Any], swa_pattern: int, **fields) -> Config:
    arch = meta["general.architecture"]
    cfg = read_config(
        meta,
        rope="neox",
        act="gelu",
        window=hparam(meta, arch, "attention.sliding_window", 0),
        swa_pattern=swa_pattern,
        final_softcap=float(hparam(meta, arch, "final_logit_softcapping", 0.0)),
        **fields,
    )
    scale = (cfg.d_model / cfg.n_heads) ** -0.5 if cfg.n_layers == _27B_LAYERS[arch] else 0.0
    return replace(cfg, embed_scale=math.sqrt(cfg.d_model), attn_scale=scale)


def config_gemma2(meta: dict[str, Any]) -> Config:
    softcap = float(hparam(meta, "gemma2", "attn_logit_softcapping", 0.0))
    return _gemma(meta, 2, attn_softcap=softcap)


def config_gemma3(meta: dict[str, Any]) -> Config:
    cfg = _gemma(meta, 6)
    base = float(hparam(meta, "gemma3", "rope.freq_base_swa", 10000.0))
    return replace(cfg, rope_swa=Rope(kind="neox", base=base, n_rot=cfg.rope.n_rot))


GEMMA2 = decoder.family("gemma2", config_gemma2, decoder.tensors(post_norms=True))

GEMMA3 = decoder.family("gemma3", config_gemma3, decoder.tensors(post_norms=True, qk_norm=True))
