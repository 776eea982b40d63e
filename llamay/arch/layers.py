"""Layers shared by the architecture families: norms, rope, the KV write, MLPs, MoE routing.

All functions are pure jnp over arrays (and weight matrices through the dispatcher
`llamay.kernels.matmul`; attention is `llamay.kernels.attention`);
shapes use B batch, T query tokens, S cache slots, H heads, K kv heads, D head dim,
E experts.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from llamay.arch import ggml_ops
from llamay.arch.base import Rope
from llamay.kernels import matmul, matmuls
from llamay.quant import kv_cache

F32 = jnp.float32

# -- norms and activations ------------------------------------------------------------


def rms_norm(x: jax.Array, w: jax.Array | None, eps: float, numerics: str = "exact") -> jax.Array:
    """x / sqrt(mean(x²) + eps) · w (weights used as stored: GGUF gemma norms already
    carry the +1). numerics "llamacpp": as ggml rounds it (`ggml_ops`)."""
    if numerics == "llamacpp":
        return ggml_ops.rms_norm(x, w, eps)
    x = x.astype(F32)
    y = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if w is None else y * w


def layer_norm(x: jax.Array, w: jax.Array | None, b: jax.Array | None, eps: float) -> jax.Array:
    x = x.astype(F32)
    mu = jnp.mean(x, axis=-1, keepdims=True)
    xc = x - mu
    y = xc * jax.lax.rsqrt(jnp.mean(xc * xc, axis=-1, keepdims=True) + eps)
    y = y if w is None else y * w
    return y if b is None else y + b


def norm(kind: str, x: jax.Array, w, b, eps: float, numerics: str = "exact") -> jax.Array:
    """RMSNorm ("rms", no bias) or LayerNorm ("layer", optional bias)."""
    if kind == "rms":
        return rms_norm(x, w, eps, numerics)
    if kind == "layer":
        if numerics == "llamacpp":
            return ggml_ops.layer_norm(x, w, b, eps)
        return layer_norm(x, w, b, eps)
    raise ValueError(f"unknown norm kind {kind!r}")


def gelu_tanh(x: jax.Array) -> jax.Array:
    """GELU, tanh approximation (ggml_gelu; HF "gelu_pytorch_tanh")."""
    return jax.nn.gelu(x, approximate=True)


ACTIVATIONS = {"silu": jax.nn.silu, "gelu": gelu_tanh}


def activation(name: str, x: jax.Array, numerics: str = "exact") -> jax.Array:
    """ACTIVATIONS[name](x); numerics "llamacpp": as ggml computes it (`ggml_ops`)."""
    if numerics == "llamacpp":
        return ggml_ops.silu(x) if name == "silu" else ggml_ops.gelu(x)
    return ACTIVATIONS[name](x)


def softcap(x: jax.Array, cap: float) -> jax.Array:
    """cap · tanh(x / cap); cap 0 (or None) is the identity."""
    return cap * jnp.tanh(x / cap) if cap else x


def linear(x: jax.Array, w, b: jax.Array | None = None) -> jax.Array:
    """x @ W.T (+ b)."""
    y = matmul(x, w)
    return y if b is None else y + b


def linears(x: jax.Array, ws, bs) -> tuple[jax.Array, ...]:
    """x @ W.T (+ b) for several weights that read the same x (`kernels.matmuls`: one
    native call for them all on CPU)."""
    ys = matmuls(x, tuple(ws))
    return tuple(y if b is None else y + b for y, b in zip(ys, bs, strict=True))


# -- rope ---------------------------------------------------------------------------


def _yarn_corr_dim(n_rot: int, orig_ctx: int, n_rotations: float, base):
    return n_rot * math.log(orig_ctx / (n_rotations * 2 * math.pi)) / (2 * math.log(base))


def rope_angles(
    positions: jax.Array,
    rope: Rope,
    freq_factors: jax.Array | None = None,
    numerics: str = "exact",
    n_pos: int = 0,
):
    """cos/sin for positions [...]: each [..., n_rot/2], as llama.cpp's ggml_rope_ext.

    θ_i = pos · base^(−2i/n_rot) / freq_factors[i], then linear or YaRN scaling;
    YaRN also scales cos and sin by its magnitude correction.
    numerics "llamacpp": as ggml computes them (`ggml_ops`), for positions < n_pos.
    """
    if numerics == "llamacpp":
        return ggml_ops.rope_angles(positions, rope, freq_factors, n_pos)
    n_rot, base = rope.n_rot, rope.base
    i = np.arange(0, n_rot, 2, dtype=np.float64)
    inv = jnp.asarray(base ** (-i / n_rot), F32)
    if freq_factors is not None:
        inv = inv / freq_factors.astype(F32)
    extrap = positions.astype(F32)[..., None] * inv
    theta = extrap * rope.freq_scale
    mscale = rope.attn_factor
    if rope.scaling == "yarn" and rope.freq_scale != 1.0:
        low = max(0.0, math.floor(_yarn_corr_dim(n_rot, rope.orig_ctx, rope.beta_fast, base)))
        high = min(
            n_rot - 1.0, math.ceil(_yarn_corr_dim(n_rot, rope.orig_ctx, rope.beta_slow, base))
        )
        ramp = 1.0 - jnp.clip((i / 2 - low) / max(0.001, high - low), 0.0, 1.0)
        theta = theta * (1 - ramp) + extrap * ramp
        mscale *= 1.0 + 0.1 * math.log(1.0 / rope.freq_scale)
    return jnp.cos(theta) * mscale, jnp.sin(theta) * mscale


def apply_rope(
    x: jax.Array, cos: jax.Array, sin: jax.Array, kind: str, numerics: str = "exact"
) -> jax.Array:
    """Rotate the first n_rot dims of x [B, T, H, D] by the angles [B, T, n_rot/2].

    kind "norm": pairs (2i, 2i+1) (llama.cpp's LLAMA_ROPE_TYPE_NORM);
    kind "neox": pairs (i, i + n_rot/2).
    """
    if numerics == "llamacpp":
        return ggml_ops.apply_rope(x, cos, sin, kind)
    half = cos.shape[-1]
    n_rot = 2 * half
    rot, rest = x[..., :n_rot].astype(F32), x[..., n_rot:]
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    if kind == "norm":
        pairs = rot.reshape(*rot.shape[:-1], half, 2)
        a, b = pairs[..., 0], pairs[..., 1]
        out = jnp.stack([a * c - b * s, a * s + b * c], axis=-1).reshape(rot.shape)
    elif kind == "neox":
        a, b = rot[..., :half], rot[..., half:]
        out = jnp.concatenate([a * c - b * s, a * s + b * c], axis=-1)
    else:
        raise ValueError(f"unknown rope kind {kind!r}")
    return jnp.concatenate([out, rest.astype(F32)], axis=-1) if rest.shape[-1] else out


# -- attention ------------------------------------------------------------------------


def write_kv(cache: jax.Array, new: jax.Array, positions: jax.Array) -> jax.Array:
    """Scatter new [B, T, K, D] into cache [B, S, K, D] at slots `positions` [B, T].

    Positions outside [0, S) (padding) are dropped. A quantised cache [B, S, K, row bytes]
    (`llamay.kv.types`) gets new's rows quantised to its block type.
    """
    b = jnp.arange(cache.shape[0])[:, None]
    return cache.at[b, positions].set(kv_cache.encode(new, cache), mode="drop")


# -- MLPs ------------------------------------------------------------------------------


def glu(x: jax.Array, w_gate, w_up, w_down, act: str = "silu", numerics: str = "exact"):
    """down(act(gate·x) ⊙ up·x); with `w_gate` None, `w_up` is fused [gate | up]
    (phi3's ffn_up: the first half of its outputs is the gate)."""
    if w_gate is None:
        gu = matmul(x, w_up)
        g, u = jnp.split(gu, 2, axis=-1)
    else:
        g, u = matmuls(x, (w_gate, w_up))  # one native call on CPU
    if numerics == "llamacpp":
        glued = ggml_ops.swiglu(g, u) if act == "silu" else ggml_ops.geglu(g, u)
        return matmul(glued, w_down)
    return matmul(ACTIVATIONS[act](g) * u, w_down)


def swiglu(x: jax.Array, w_gate, w_up, w_down) -> jax.Array:
    return glu(x, w_gate, w_up, w_down, "silu")


def geglu(x: jax.Array, w_gate, w_up, w_down) -> jax.Array:
    return glu(x, w_gate, w_up, w_down, "gelu")


def gelu_mlp(x: jax.Array, w_up, b_up, w_down, b_down) -> jax.Array:
    """down(gelu(up·x + b_up)) + b_down (ungated: starcoder2, bert)."""
    return linear(gelu_tanh(linear(x, w_up, b_up)), w_down, b_down)


# -- mixture of experts ----------------------------------------------------------------


def route(x: jax.Array, w_router, n_used: int, renormalize: bool = True):
    """Top-k routing: softmax over the router logits, keep the `n_used` largest
    probabilities (renormalised to sum to 1). Returns (weights [..., k], experts [..., k])."""
    probs = jax.nn.softmax(matmul(x, w_router), axis=-1)
    top_w, top_i = jax.lax.top_k(probs, n_used)
    if renormalize:
        top_w = top_w / jnp.sum(top_w, axis=-1, keepdims=True)
    return top_w, top_i


def expert_matmul(x: jax.Array, w, experts: jax.Array | None = None, per_expert: bool = False):
    """Per-expert x @ W_e.T with W [E, n, k] (one layer's experts, any matrix form)
    through `llamay.kernels.matmul` (so each numerics applies) mapped over the experts.

    experts None: every expert, -> [..., E, n]; experts [..., k'] (ids): only those,
    gathered while still packed, -> [..., k', n]. x is [..., k], or with `per_expert`
    one input per expert [..., E or k', k].
    """

    def one(m):
        if experts is None:
            f = jax.vmap(matmul, in_axes=(-2 if per_expert else None, 0), out_axes=-2)
            return f(x, m)
        # [k' (flat), n, row] of every array of m: gathered packed
        picked = jax.tree.map(lambda a: jnp.take(a, experts.reshape(-1), axis=0), m)
        xs = x if per_expert else jnp.broadcast_to(x[..., None, :], (*experts.shape, x.shape[-1]))
        flat = jax.vmap(matmul)(xs.reshape(-1, xs.shape[-1]), picked)
        return flat.reshape(*experts.shape, flat.shape[-1])

    return w.on_layer(one)


def moe(
    x: jax.Array,
    w_router,
    w_gate,
    w_up,
    w_down,
    n_used: int,
    act: str = "silu",
    gather_limit: int | None = None,
    numerics: str = "exact",
) -> jax.Array:
    """Σ_e w_e · down_e(act(gate_e x) ⊙ up_e x) over each token's top-k experts.

    Two exact ways, chosen statically from the token count N: when N·k is at most the
    expert count E (or `gather_limit`), each token's k experts are gathered while still
    packed and only they are dequantised and applied (decode); otherwise every expert
    runs densely on every token and the unchosen ones get weight 0 (prefill: E
    dequantisations instead of N·k, at E/k times the FLOPs). Both give the same numbers.
    """
    if numerics == "llamacpp":
        return ggml_ops.moe(x, w_router, w_gate, w_up, w_down, n_used, act)
    top_w, top_i = route(x, w_router, n_used)
    lead = x.shape[:-1]
    n_tokens = math.prod(lead)
    n_experts = w_up.shape[-3]
    limit = n_experts if gather_limit is None else gather_limit
    f = ACTIVATIONS[act]
    if n_tokens * n_used <= limit:
        h = f(expert_matmul(x, w_gate, top_i)) * expert_matmul(x, w_up, top_i)  # [..., k, F]
        y = expert_matmul(h, w_down, top_i, per_expert=True)  # [..., k, E_model]
        return jnp.sum(top_w[..., None] * y, axis=-2)
    dense_w = jnp.sum(jax.nn.one_hot(top_i, n_experts, dtype=F32) * top_w[..., None], axis=-2)
    h = f(expert_matmul(x, w_gate)) * expert_matmul(x, w_up)  # [..., E, F]
    y = expert_matmul(h, w_down, per_expert=True)  # [..., E, E_model]
    return jnp.einsum("...e,...ed->...d", dense_w, y, precision="highest")
