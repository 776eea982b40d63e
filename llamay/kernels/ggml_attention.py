"""llama.cpp's CPU attention, emulated bit for bit (numerics="llamacpp"): the reference
of that numerics, which `llamay.kernels.attention` runs for dense and (after gathering
the pages) paged caches.

An F16 KV cache (flash attention off, llama.cpp's default): q (scaled first in the
families of `llamay.arch.ggml_ops.Q_PRESCALED`) rounded to f16; K·q and P·V as
llamafile's tinyBLAS sums them for a batch of tokens (16 lanes, chunk after chunk, then
`_mm512_reduce_add_ps`) or as ggml_vec_dot_f16 does for one token (4 accumulators of 16
lanes); the softmax of ggml_soft_max_f32 (scores·scale, ggml_v_expf, per-16 sums in
double, times (float)(1.0/sum)), the probabilities rounded to f16. An F32 cache (an
encoder's K/V, which llama.cpp keeps in no cache, or an f32 -ctk/-ctv) takes q and the
probabilities as f32, unrounded. (See `llamay.quant.ggml_float` for why bit for bit, and
how XLA is kept from fusing.)

A quantised K or V cache (q8_0, q4_0, ...: `llamay.kv.types`): llama.cpp's flash attention,
which it requires for a quantised V (`flash_attention`, below).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from llamay.quant import kv_cache
from llamay.quant.act_quant import VEC_DOT_TYPES, quantize_q8_0, quantize_q8_1
from llamay.quant.ggml_float import (
    dot_bf16_vec,
    dot_f16_sgemm,
    dot_f16_vec,
    dot_f32_vec,
    dsum,
    expf,
    fma,
    hsum8,
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

    q_prescaled: llama.cpp's graph scales q before K·q (`ggml_ops.Q_PRESCALED`). A cache
    with a quantised K or V goes to `flash_attention`."""
    if kv_cache.is_quantised(k_cache) or kv_cache.is_quantised(v_cache):
        return flash_attention(q, k_cache, v_cache, q_pos, scale=scale, window=window,
                               softcap=softcap, causal=causal, q_prescaled=q_prescaled)  # fmt: skip
    B, T, H, D = q.shape
    S, K = k_cache.shape[1], k_cache.shape[2]
    G = H // K
    batched = T > 1  # llamafile's sgemm serves >= 2 tokens; one token takes vec_dot
    kq_scale = _f32_scale(scale, D)
    if q_prescaled:
        q = opaque(q.astype(F32) * kq_scale)
        kq_scale = np.float32(1.0)
    # q goes to K's vec_dot type and P to V's: f16 for an f16 cache; an f32 one (an
    # encoder's K/V, which llama.cpp keeps in no cache, or -ctk/-ctv f32) takes f32 as is
    k32, v32 = k_cache.dtype == F32, v_cache.dtype == F32
    q16 = (q.astype(F32) if k32 else q.astype(jnp.float16).astype(F32)).reshape(B, T, K, G, D)
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
    visible = _visible(q_pos, S, causal, window)
    visible = visible[:, None, None, :, :]
    mx = jnp.max(jnp.where(visible, wp, -jnp.inf), axis=-1, keepdims=True)
    mx = jnp.where(jnp.isfinite(mx), mx, 0.0)
    e = jnp.where(visible, v_expf(jnp.where(visible, wp - mx, -200.0)), 0.0)
    chunk = reduce16(e.reshape(*e.shape[:-1], S // 16, 16))  # [B, K, G, T, S/16]
    hi, lo = dsum(chunk)
    inv = jnp.where(hi > 0, recip_pair(hi, lo), 0.0)  # rows with no visible key: padding
    p16 = e * inv[..., None]  # [B, K, G, T, S]
    p16 = p16 if v32 else p16.astype(jnp.float16).astype(F32)
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


# -- a quantised KV cache: llama.cpp's flash attention on CPU -------------------------------
#
# llama.cpp needs flash attention for a quantised V cache (and llamay reads any cache with
# a block type this way). ggml_compute_forward_flash_attn_ext_f16_one_chunk, which serves
# every cache whose K is neither F32 nor F16 (the tiled and split-KV paths take only those),
# per query row: q converted by the K type's vec_dot type's from_float (Q8_0 for Q4_0/Q5_0/
# Q8_0, Q8_1 for Q4_1/Q5_1, f16 for F16), s = vec_dot(K row, q) · scale, then over the
# visible cells in order an online softmax: a new maximum M rescales the accumulator by
# expf(Mold - M) (ggml_vec_scale), v·expf(s - M) is added (ggml_vec_mad: an FMA per
# element; into an f16 accumulator for an F16 V, into f32 after dequantising the row
# otherwise), S = S·ms + vs (contracted to an FMA by GCC); the result VKQ·(1/S).


def _blocks_dot(qa, k_bytes, t):
    """ggml_vec_dot_<t>_q8_x for every (query, key): qa the queries' Q8 activations over
    [B, T, K, G, D]; k_bytes [B, S, K, row] -> scores [B, K, G, T, S] (per block and lane of
    4 elements the exact integer sum, acc_l = fma(d_k·d_q, sum, acc_l) in block order, then
    hsum_float_8, plus Σ m_k·s_q for the _1 types), as `qtensor._q8_block_dot`."""
    from llamay.quant.qtensor import QTensor, weight_blocks

    D = qa.qs.shape[-1]
    qk, dk, mk = weight_blocks(QTensor(k_bytes, t, D))  # [B, S, K, nb, 32], [B, S, K, nb]
    B, S, K, nb = dk.shape
    qq = qa.qs.reshape(*qa.qs.shape[:-1], nb, 8, 4)  # [B, T, K, G, nb, 8, 4]
    kq = qk.reshape(B, S, K, nb, 8, 4)
    acc = jnp.zeros((B, K, qq.shape[3], qq.shape[1], S, 8), F32)
    summs = jnp.zeros(acc.shape[:-1], F32)
    dq = qa.d.reshape(*qa.d.shape[:-1], nb)  # [B, T, K, G, nb]
    for n in range(nb):
        xy = jnp.einsum("btkgci,bskci->bkgtsc", qq[..., n, :, :], kq[:, :, :, n],
                        preferred_element_type=jnp.int32).astype(F32)  # fmt: skip
        dd = (
            jnp.transpose(dq[..., n], (0, 2, 3, 1))[..., None]
            * jnp.transpose(dk[..., n], (0, 2, 1))[:, :, None, None, :]
        )  # [B, K, G, T, S], exact: two f16 values
        acc = fma(dd[..., None], xy, acc, narrow=True)
        if mk is not None:
            sq = jnp.transpose(qa.sums.reshape(*qa.d.shape[:-1], nb)[..., n], (0, 2, 3, 1))
            mn = jnp.transpose(mk[..., n], (0, 2, 1))[:, :, None, None, :]
            summs = summs + sq[..., None] * mn
    y = hsum8(acc)
    return y + summs if mk is not None else y


def _expf(x):
    """libm's expf (`ggml_float.expf`) where it is defined, 0 at -inf, XLA's below -87."""
    ok = x > -87.0
    return jnp.where(ok, expf(jnp.where(ok, x, 0.0)), jnp.exp(x))


def flash_attention(q, k_cache, v_cache, q_pos, *, scale, window=None, softcap=None,
                    causal=True, q_prescaled=False):  # fmt: skip
    """`attention` over a cache with a quantised K and/or V (`llamay.quant.kv_cache`), as
    llama.cpp's CPU flash attention computes it (see above)."""
    B, T, H, D = q.shape
    S, K = k_cache.shape[1], k_cache.shape[2]
    G = H // K
    kt, vt = kv_cache.cache_type(k_cache, D), kv_cache.cache_type(v_cache, D)
    kq_scale = _f32_scale(scale, D)
    if q_prescaled:
        q = opaque(q.astype(F32) * kq_scale)
        kq_scale = np.float32(1.0)
    if softcap:
        kq_scale = np.float32(kq_scale / np.float32(softcap))
    q = q.astype(F32).reshape(B, T, K, G, D)
    dot_type = VEC_DOT_TYPES[kt].name
    if dot_type in ("Q8_0", "Q8_1"):
        quant = quantize_q8_0 if dot_type == "Q8_0" else quantize_q8_1
        scores = _blocks_dot(quant(q, kv_cache.Q8_VARIANT), k_cache, kt)
    else:  # an F16/BF16/F32 K: q rounded to its type, ggml_vec_dot_<type>
        cast = {"F16": jnp.float16, "BF16": jnp.bfloat16}.get(kt.name, F32)
        dot = {"F16": dot_f16_vec, "BF16": dot_bf16_vec}.get(kt.name, dot_f32_vec)
        qr = q.astype(cast).astype(F32)[:, :, :, :, None, :]  # [B, T, K, G, 1, D]
        kk = jnp.transpose(k_cache.astype(F32), (0, 2, 1, 3))[:, None, :, None, :, :]
        scores = jnp.transpose(dot(qr, kk), (0, 2, 3, 1, 4))
    s = opaque(scores * kq_scale)  # [B, K, G, T, S]
    if softcap:
        s = opaque(np.float32(softcap) * jnp.tanh(s))
    visible = _visible(q_pos, S, causal, window)
    f16_acc = vt.name == "F16"
    vals = kv_cache.decode(v_cache, D).astype(F32)  # [B, S, K, D], exact

    def step(carry, xs):
        M, Ssum, acc = carry  # [B, K, G, T], same, [B, K, G, T, D]
        s_j, vis_j, v_j = xs  # [B, K, G, T], [B, T], [B, K, D]
        vis = vis_j[:, None, None, :]
        new_max = s_j > M
        ms = opaque(jnp.where(new_max, _expf(M - s_j), 1.0))
        vs = opaque(jnp.where(new_max, 1.0, _expf(s_j - M)))
        scaled = opaque(acc * ms[..., None])
        if f16_acc:
            scaled = scaled.astype(jnp.float16).astype(F32)
        vv = jnp.broadcast_to(v_j[:, :, None, None, :], acc.shape)
        upd = fma(vv, jnp.broadcast_to(vs[..., None], acc.shape), scaled)
        if f16_acc:
            upd = upd.astype(jnp.float16).astype(F32)
        s_new = fma(Ssum, ms, vs)
        keep = lambda a, b: jnp.where(vis if a.ndim == 4 else vis[..., None], a, b)  # noqa: E731
        return (keep(jnp.where(new_max, s_j, M), M), keep(s_new, Ssum), keep(upd, acc)), None

    init = (
        jnp.full((B, K, G, T), -jnp.inf, F32),
        jnp.zeros((B, K, G, T), F32),
        jnp.zeros((B, K, G, T, D), F32),
    )
    xs = (jnp.moveaxis(s, -1, 0), jnp.moveaxis(visible, -1, 0), jnp.moveaxis(vals, 1, 0))
    (_, Ssum, acc), _ = jax.lax.scan(step, init, xs)
    inv = jnp.where(Ssum == 0, 0.0, 1.0 / opaque(jnp.where(Ssum == 0, 1.0, Ssum)))
    out = opaque(acc * inv[..., None])  # [B, K, G, T, D]
    return jnp.transpose(out, (0, 3, 1, 2, 4)).reshape(B, T, H, D)


def _visible(q_pos: jax.Array, S: int, causal: bool, window) -> jax.Array:
    """[B, T, S]: which of S cache slots each query at `q_pos` [B, T] sees (causal: slots
    up to its position; else up to its row's last real position; within `window` where
    it is positive)."""
    B, T = q_pos.shape
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
    return visible
