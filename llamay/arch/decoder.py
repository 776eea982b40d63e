"""The decoder-only transformer most families are: embed → blocks → norm → LM head.

One block serves llama, qwen2/3, qwen3moe, phi3, gemma2/3, olmo2 and starcoder2.
What differs between them is data: the `Config` (rope kind, norm kind, activation,
softcaps, sliding-window pattern, experts) and which optional weights the family
binds. The block applies a piece iff the layer has its weight:

- `attn_norm`, `ffn_norm` (+ `_b`): pre-norms before attention / the MLP (olmo2 has none);
- `post_attention_norm`, `post_ffw_norm`: norms of the sub-block outputs before the
  residual add (gemma, olmo2);
- `wqkv`: fused q/k/v projection, outputs `[q | k | v]` (phi3);
- `wq_b`, `wk_b`, `wv_b`, `wo_b`, `w_up_b`, `w_down_b`: biases (qwen2, starcoder2; llama
  when the file has them);
- `q_norm`, `k_norm`: RMSNorm of q/k before rope, per head if sized head_dim (qwen3,
  gemma3), else over the whole projection (olmo2);
- `w_gate`: a gated MLP; without it `w_up` holds `[gate | up]` (phi3);
- `rope_freqs`: per-dim rope divisors (llama-3 style scaling).

Which kernels run where (chosen at trace time by `llamay.kernels`, from
`jax.default_backend()`, LLAMAY_BACKEND and the config's numerics):

- every matrix (`linear`, the MLPs, experts, the LM head): `llamay.kernels.matmul`:
  GPU/TPU the Pallas quantised matmul (Mosaic GPU for decode rows on Hopper); CPU the
  native kernels (`llamay.kernels_cpu`) where they take the weight, else XLA's CPU forms
  (`llamay.quant.cpu_dot`); llama.cpp numerics ggml's kernels emulated
  (`llamay.quant.ggml_matmul`); Metal and anything else the jnp reference.
- attention (`self_attention` → `llamay.arch.paged.attention`, which unwraps the cache
  view, → `llamay.kernels.attention`): paged decode on GPU/TPU the Pallas kernel
  (causal, exact numerics, up to 16 query tokens); paged on CPU the native kernel where
  it applies; otherwise, and for dense caches everywhere, the references beside the
  Pallas kernel (`kernels_pallas.paged_attention`: gather the pages, then
  `attention_reference`), or in llama.cpp numerics `llamay.kernels.ggml_attention`.

Research variants replace the two sub-layers: `functools.partial(block, attn=..., mlp=...)`
(see `scripts/research_ablate_head.py`). `attn` returns per-head outputs before the
output projection, so a wrapper can ablate heads.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from llamay.arch import ggml_ops
from llamay.arch.base import Architecture, Config, TensorSpec
from llamay.arch.layers import (
    activation,
    apply_rope,
    glu,
    linear,
    linears,
    moe,
    norm,
    rms_norm,
    rope_angles,
    softcap,
)
from llamay.arch.paged import attention, stored, write_kv
from llamay.quant import kv_cache
from llamay.quant.kv_cache import hadamard


def sub_norm(cfg: Config, w: dict, role: str, x: jax.Array) -> jax.Array:
    """The norm bound under `role` (with bias `role_b` if bound); x as is when absent."""
    if role not in w:
        return x
    return norm(cfg.norm, x, w[role], w.get(role + "_b"), cfg.eps, cfg.numerics)


def is_local(cfg: Config, layer: jax.Array) -> jax.Array | bool:
    """Whether `layer` (traced) uses sliding-window attention: llama.cpp's swa pattern,
    layer il is local iff il % pattern < pattern - 1 (gemma2: 2 → even layers; gemma3: 6)."""
    if cfg.swa_pattern < 2 or cfg.window <= 0:
        return False
    return layer % cfg.swa_pattern < cfg.swa_pattern - 1


def local_layers(cfg: Config) -> np.ndarray:
    """Which layers are local, as a static bool array [n_layers] (all False without
    sliding windows): what sizes and indexes the paged pool's local part."""
    return np.array([bool(is_local(cfg, i)) for i in range(cfg.n_layers)], bool)


def _qk_norm(cfg: Config, lw: dict, role: str, x: jax.Array, n: int) -> jax.Array:
    """x [B, T, n·D] → [B, T, n, D], RMS-normed over the projection or per head if bound."""
    B, T, _ = x.shape
    w = lw.get(role)
    per_head = w is not None and w.shape[-1] == cfg.head_dim
    if w is not None and not per_head:
        x = rms_norm(x, w, cfg.eps, cfg.numerics)
    x = x.reshape(B, T, n, cfg.head_dim)
    return rms_norm(x, w, cfg.eps, cfg.numerics) if per_head else x


def project_qkv(cfg: Config, lw: dict, h: jax.Array):
    """q [B, T, H, D], k and v [B, T, K, D], with biases and q/k norms where bound."""
    B, T, _ = h.shape
    H, K, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    if "wqkv" in lw:
        qkv = linear(h, lw["wqkv"], lw.get("wqkv_b"))
        q, k, v = jnp.split(qkv, [H * D, (H + K) * D], axis=-1)
    else:
        roles = ("wq", "wk", "wv")
        q, k, v = linears(h, [lw[r] for r in roles], [lw.get(r + "_b") for r in roles])
    q = _qk_norm(cfg, lw, "q_norm", q, H)
    k = _qk_norm(cfg, lw, "k_norm", k, K)
    return q, k, v.reshape(B, T, K, D)


def self_attention(cfg: Config, lw: dict, h, positions, k_cache, v_cache, layer):
    """Project, rope, write this step's K/V into the cache, attend.

    Returns (per-head outputs [B, T, H, D] before the output projection, k_cache, v_cache).
    """
    q, k, v = project_qkv(cfg, lw, h)
    local = is_local(cfg, layer)
    if cfg.rope is not None:
        num, n_pos = cfg.numerics, k_cache.shape[1]
        cos, sin = rope_angles(positions, cfg.rope, lw.get("rope_freqs"), num, n_pos)
        if cfg.rope_swa is not None:
            cos_l, sin_l = rope_angles(positions, cfg.rope_swa, None, num, n_pos)
            cos, sin = jnp.where(local, cos_l, cos), jnp.where(local, sin_l, sin)
        q = apply_rope(q, cos, sin, cfg.rope.kind, num)
        k = apply_rope(k, cos, sin, cfg.rope.kind, num)
    # a quantised cache: llama.cpp's Hadamard rotation of q, k (and v, then the output)
    rot_k, rot_v = kv_cache.rotations(stored(k_cache), stored(v_cache), k.shape[-1])
    q, k, v = hadamard(q, rot_k), hadamard(k, rot_k), hadamard(v, rot_v)
    k_cache = write_kv(k_cache, k, positions)
    v_cache = write_kv(v_cache, v, positions)
    window = jnp.where(local, cfg.window, 0) if cfg.swa_pattern else None
    o = attention(
        q,
        k_cache,
        v_cache,
        positions,
        scale=cfg.scale,
        window=window,
        softcap=cfg.attn_softcap,
        causal=cfg.causal,
        numerics=cfg.numerics,
        q_prescaled=cfg.arch in ggml_ops.Q_PRESCALED,
        flash_attn=cfg.flash_attn,
        threads=cfg.ggml_threads,
    )
    return hadamard(o, rot_v), k_cache, v_cache


def mlp(cfg: Config, lw: dict, h: jax.Array, layer) -> jax.Array:
    """The feed-forward sub-layer: top-k experts, gated (SwiGLU/GeGLU), or plain."""
    if cfg.n_experts:
        return moe(
            h,
            lw["router"],
            lw["w_gate_exps"],
            lw["w_up_exps"],
            lw["w_down_exps"],
            cfg.n_experts_used,
            cfg.act,
            numerics=cfg.numerics,
        )
    if cfg.gated:
        return glu(h, lw.get("w_gate"), lw["w_up"], lw["w_down"], cfg.act, cfg.numerics)
    up = activation(cfg.act, linear(h, lw["w_up"], lw.get("w_up_b")), cfg.numerics)
    return linear(up, lw["w_down"], lw.get("w_down_b"))


def out_proj(lw: dict, o: jax.Array) -> jax.Array:
    """Per-head outputs [B, T, H, D] through the attention output projection."""
    return linear(o.reshape(*o.shape[:2], -1), lw["wo"], lw.get("wo_b"))


def block(cfg: Config, lw, x, positions, k_cache, v_cache, layer, *, attn=self_attention, mlp=mlp):
    h = sub_norm(cfg, lw, "attn_norm", x)
    o, k_cache, v_cache = attn(cfg, lw, h, positions, k_cache, v_cache, layer)
    x = x + sub_norm(cfg, lw, "post_attention_norm", out_proj(lw, o))
    h = sub_norm(cfg, lw, "ffn_norm", x)
    x = x + sub_norm(cfg, lw, "post_ffw_norm", mlp(cfg, lw, h, layer))
    return x, k_cache, v_cache


def embed(cfg: Config, w, tokens: jax.Array, positions: jax.Array) -> jax.Array:
    x = w["tok_embd"].rows(tokens)
    return x * cfg.embed_scale if cfg.embed_scale else x


def head(cfg: Config, w, x: jax.Array) -> jax.Array:
    """Final norm, LM head (the token embedding when `output` is absent), final softcap."""
    logits = linear(sub_norm(cfg, w, "output_norm", x), w.get("output", w["tok_embd"]))
    return softcap(logits, cfg.final_softcap)


def family(name: str, config, tensors: tuple[TensorSpec, ...], aliases=()) -> Architecture:
    """A decoder family: its config reader and tensor table with this module's forward."""
    return Architecture(name, config, tensors, embed, block, head, aliases=tuple(aliases))


def tensors(
    *,
    pre_norms: bool = True,
    post_norms: bool = False,
    qk_norm: bool = False,
    fused_qkv: bool = False,
    mlp: str = "gated",
    biases: str = "optional",
    norm_bias: bool = False,
    rope_freqs: bool = False,
) -> tuple[TensorSpec, ...]:
    """The GGUF tensor table of a decoder family (llama.cpp's names).

    mlp: "gated" (ffn_gate/up/down), "fused" (ffn_up = [gate | up], ffn_down), "plain"
    (ffn_up, ffn_down), "moe" (router + stacked experts). biases: "none", "optional"
    (bound when the file has them, as llama.cpp does for llama), "qkv" (required
    q/k/v biases), "all" (required on every linear). norm_bias: LayerNorm biases.
    """
    t = [
        TensorSpec("tok_embd", "token_embd.weight"),
        TensorSpec("output_norm", "output_norm.weight"),
        TensorSpec("output", "output.weight", optional=True),
    ]
    if rope_freqs:
        t.append(TensorSpec("rope_freqs", "rope_freqs.weight", optional=True, every_layer=True))

    def lin(role: str, name: str, bias_required: bool):
        t.append(TensorSpec(role, f"blk.{{i}}.{name}.weight"))
        if biases != "none":
            t.append(TensorSpec(role + "_b", f"blk.{{i}}.{name}.bias", optional=not bias_required))

    def nrm(role: str, name: str):
        t.append(TensorSpec(role, f"blk.{{i}}.{name}.weight"))
        if norm_bias:
            t.append(TensorSpec(role + "_b", f"blk.{{i}}.{name}.bias"))

    if norm_bias:
        t.append(TensorSpec("output_norm_b", "output_norm.bias"))
    if pre_norms:
        nrm("attn_norm", "attn_norm")
    if fused_qkv:
        lin("wqkv", "attn_qkv", biases == "all")
    else:
        for role, name in (("wq", "attn_q"), ("wk", "attn_k"), ("wv", "attn_v")):
            lin(role, name, biases in ("qkv", "all"))
    if qk_norm:
        nrm("q_norm", "attn_q_norm")
        nrm("k_norm", "attn_k_norm")
    lin("wo", "attn_output", biases == "all")
    if post_norms:
        nrm("post_attention_norm", "post_attention_norm")
    if pre_norms:
        nrm("ffn_norm", "ffn_norm")
    if mlp == "moe":
        t.append(TensorSpec("router", "blk.{i}.ffn_gate_inp.weight"))
        for role, name in (("w_gate_exps", "gate"), ("w_up_exps", "up"), ("w_down_exps", "down")):
            t.append(TensorSpec(role, f"blk.{{i}}.ffn_{name}_exps.weight"))
    else:
        if mlp == "gated":
            lin("w_gate", "ffn_gate", biases == "all")
        lin("w_up", "ffn_up", biases == "all")
        lin("w_down", "ffn_down", biases == "all")
    if post_norms:
        nrm("post_ffw_norm", "post_ffw_norm")
    return tuple(t)
