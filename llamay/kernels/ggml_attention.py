"""llama.cpp's CPU attention, emulated bit for bit (numerics="llamacpp"): the reference
of that numerics, which `llamay.kernels.attention` runs for dense and (after gathering
the pages) paged caches.

An F16 KV cache (flash attention off, llama.cpp's default): q (scaled first in the
families of `llamay.arch.ggml_ops.Q_PRESCALED`) rounded to f16; K·q and P·V as
llamafile's tinyBLAS sums them for a batch of tokens (16 lanes, chunk after chunk, then
`_mm512_reduce_add_ps`) or as ggml_vec_dot_f16 does for one token (4 accumulators of 16
lanes); the softmax of ggml_soft_max_f32 (scores·scale, ggml_v_expf, per-16 sums in
double, times (float)(1.0/sum)), the probabilities rounded to f16. (See
`llamay.quant.ggml_float` for why bit for bit, and how XLA is kept from fusing.)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from llamay.quant.ggml_float import (
    dot_f16_sgemm,
    dot_f16_vec,
    dsum,
    opaque,
    recip_pair,
    reduce16,
    v_expf,
)

F32 = jnp.float32


def _f32_scale(scale: float, head_dim: int) -> np.float32:
    """The scale as llama.cpp computes it in f32: 1.0f / sqrtf(head_dim) by default."""
    default = np.float32(1.0) / np.sqrt(np.float32(head_dim))
    return default if abs(scale - head_dim**-0.5) < 1e-12 else np.float32(scale)


def attention(
    q,
    k_cache,
    v_cache,
    q_pos,
    *,
    scale,
    window=None,
    softcap=None,
    causal=True,
    q_prescaled=False,
):
    """`kernels_pallas.paged_attention.attention_reference` over an f16 cache, as ggml
    computes it (module doc).

    q_prescaled: llama.cpp's graph scales q before K·q (`ggml_ops.Q_PRESCALED`)."""
    B, T, H, D = q.shape
    S, K = k_cache.shape[1], k_cache.shape[2]
    G = H // K
    batched = T > 1  # llamafile's sgemm serves >= 2 tokens; one token takes vec_dot
    kq_scale = _f32_scale(scale, D)
    if q_prescaled:
        q = opaque(q.astype(F32) * kq_scale)
        kq_scale = np.float32(1.0)
    q16 = q.astype(jnp.float16).astype(F32).reshape(B, T, K, G, D)
    kc = k_cache.astype(F32)
    qk = q16[:, :, :, :, None, :]  # [B, T, K, G, 1, D]
    kk = jnp.transpose(kc, (0, 2, 1, 3))[:, None, :, None, :, :]  # [B, 1, K, 1, S, D]
    dot = dot_f16_sgemm if batched and D % 16 == 0 else dot_f16_vec
    scores = dot(qk, kk)  # [B, T, K, G, S]
    scores = jnp.transpose(scores, (0, 2, 3, 1, 4))  # [B, K, G, T, S]
    if softcap:  # ggml_scale by 1/cap, ggml_tanh, ggml_scale by cap (tanh not bit for bit)
        capped = jnp.tanh(opaque(scores * (np.float32(1) / np.float32(softcap))))
        scores = opaque(capped * np.float32(softcap))
    wp = opaque(scores * kq_scale)
    j = jnp.arange(S)[None, None, :]
    i = q_pos[:, :, None]
    if causal:
        visible = j <= i
    else:
        last = jnp.max(jnp.where(q_pos < S, q_pos, -1), axis=1)
        visible = jnp.broadcast_to(j <= last[:, None, None], (B, T, S))
    if window is not None:
        w = jnp.asarray(window)
        visible = visible & ((w <= 0) | (i - j < w))
    visible = visible[:, None, None, :, :]
    mx = jnp.max(jnp.where(visible, wp, -jnp.inf), axis=-1, keepdims=True)
    mx = jnp.where(jnp.isfinite(mx), mx, 0.0)
    e = jnp.where(visible, v_expf(jnp.where(visible, wp - mx, -200.0)), 0.0)
    chunk = reduce16(e.reshape(*e.shape[:-1], S // 16, 16))  # [B, K, G, T, S/16]
    hi, lo = dsum(chunk)
    inv = jnp.where(hi > 0, recip_pair(hi, lo), 0.0)  # rows with no visible key: padding
    p16 = (e * inv[..., None]).astype(jnp.float16).astype(F32)  # [B, K, G, T, S]
    out = _pv(p16, v_cache.astype(F32), batched)  # [B, K, G, T, D]
    return jnp.transpose(out, (0, 3, 1, 2, 4)).reshape(B, T, H, D)


def _pv(p: jax.Array, v: jax.Array, batched: bool) -> jax.Array:
    """Σ_s p[..., s]·v[s, d] in ggml's order: p [B, K, G, T, S], v [B, S, K, D]."""
    B, K, G, T, S = p.shape
    D = v.shape[-1]
    n = S // 16
    pc = jnp.moveaxis(p.reshape(B, K, G, T, n, 16), 4, 0)  # [n, B, K, G, T, 16]
    vc = jnp.transpose(v.reshape(B, n, 16, K, D), (1, 0, 3, 4, 2))  # [n, B, K, D, 16]

    def prod(pi, vi):  # -> [B, K, G, T, D, 16]
        return pi[:, :, :, :, None, :] * vi[:, :, None, None, :, :]

    if batched:

        def step(acc, xs):
            return acc + prod(*xs), None

        acc, _ = jax.lax.scan(step, prod(pc[0], vc[0]), (pc[1:], vc[1:]))
        return reduce16(acc)
    # ggml_vec_dot_f16 over llama.cpp's n_kv (a multiple of 256): chunk c goes to
    # accumulator c % 4, in order; zero padding to a multiple of 64 changes no sum.
    pad = -n % 4
    if pad:
        pc = jnp.concatenate([pc, jnp.zeros((pad, *pc.shape[1:]), pc.dtype)])
        vc = jnp.concatenate([vc, jnp.zeros((pad, *vc.shape[1:]), vc.dtype)])
    n4 = (n + pad) // 4
    pc4 = pc.reshape(n4, 4, *pc.shape[1:])
    vc4 = vc.reshape(n4, 4, *vc.shape[1:])

    def step4(accs, xs):
        pi, vi = xs
        return tuple(accs[j] + prod(pi[j], vi[j]) for j in range(4)), None

    init = tuple(prod(pc4[0, j], vc4[0, j]) for j in range(4))
    accs, _ = jax.lax.scan(step4, init, (pc4[1:], vc4[1:]))
    return reduce16((accs[0] + accs[2]) + (accs[1] + accs[3]))
