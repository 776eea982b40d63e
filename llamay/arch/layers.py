"""Layers shared by the architecture families: norms, rope, attention, MLPs.

All functions are pure jnp over arrays (and `QTensor`s through `qmatmul`);
shapes use B batch, T query tokens, S cache slots, H heads, K kv heads, D head dim.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from llamay.quant import qmatmul

F32 = jnp.float32


def rms_norm(x: jax.Array, w: jax.Array | None, eps: float) -> jax.Array:
    x = x.astype(F32)
    y = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if w is None else y * w


def rope_angles(positions: jax.Array, n_rot: int, base: float, freq_scale: float = 1.0):
    """cos/sin of pos·base^(−2i/n_rot) for i < n_rot/2: each [*positions.shape, n_rot/2]."""
    inv = base ** (-jnp.arange(0, n_rot, 2, dtype=F32) / n_rot)
    ang = positions.astype(F32)[..., None] * (inv * freq_scale)
    return jnp.cos(ang), jnp.sin(ang)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array, kind: str) -> jax.Array:
    """Rotate the first n_rot dims of x [B, T, H, D] by the angles [B, T, n_rot/2].

    kind "norm": pairs (2i, 2i+1) (llama.cpp's LLAMA_ROPE_TYPE_NORM);
    kind "neox": pairs (i, i + n_rot/2).
    """
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


def write_kv(cache: jax.Array, new: jax.Array, positions: jax.Array) -> jax.Array:
    """Scatter new [B, T, K, D] into cache [B, S, K, D] at slots `positions` [B, T].

    Positions outside [0, S) (padding) are dropped.
    """
    b = jnp.arange(cache.shape[0])[:, None]
    return cache.at[b, positions].set(new.astype(cache.dtype), mode="drop")


def attention(
    q: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    q_pos: jax.Array,
    *,
    scale: float,
    window: jax.Array | int | None = None,
    softcap: float | None = None,
    causal: bool = True,
) -> jax.Array:
    """Grouped-query attention of q [B, T, H, D] over a cache [B, S, K, D] whose slot j
    holds position j. Key j is visible from a query at position i iff j <= i (causal)
    and i - j < window (sliding window; window <= 0 or None means global).
    Returns [B, T, H, D] in f32.
    """
    B, T, H, D = q.shape
    S, K = k_cache.shape[1], k_cache.shape[2]
    G = H // K
    qg = q.astype(F32).reshape(B, T, K, G, D)
    scores = jnp.einsum("btkgd,bskd->bkgts", qg, k_cache.astype(F32), precision="highest")
    scores = scores * scale
    if softcap is not None:
        scores = softcap * jnp.tanh(scores / softcap)
    j = jnp.arange(S)[None, None, :]
    i = q_pos[:, :, None]
    visible = j <= i if causal else jnp.ones_like(j <= i)
    if window is not None:
        w = jnp.asarray(window)
        visible = visible & ((w <= 0) | (i - j < w))
    scores = jnp.where(visible[:, None, None, :, :], scores, -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bkgts,bskd->btkgd", probs, v_cache.astype(F32), precision="highest")
    return out.reshape(B, T, H, D)


def swiglu(x: jax.Array, w_gate, w_up, w_down) -> jax.Array:
    return qmatmul(jax.nn.silu(qmatmul(x, w_gate)) * qmatmul(x, w_up), w_down)
