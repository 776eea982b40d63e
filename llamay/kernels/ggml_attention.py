"""llama.cpp's CPU attention, emulated bit for bit (numerics="llamacpp"): the reference
of that numerics, which `llamay.kernels.attention` runs for dense and (after gathering
the pages) paged caches.

An F16 KV cache with flash attention off (llama-cpp-python's default; `flash_attn` takes
`flash_attention`, below, as llama.cpp's `-fa on`): q (scaled first in the
families of `llamay.arch.ggml_ops.Q_PRESCALED`) rounded to f16; K·q and P·V as
llamafile's tinyBLAS sums them for a batch of tokens (16 lanes, chunk after chunk, then
`_mm512_reduce_add_ps`) or as ggml_vec_dot_f16 does for one token (4 accumulators of 16
lanes); the softmax of ggml_soft_max_f32 (scores·scale, ggml_v_expf, per-16 sums in
double, times (float)(1.0/sum)), the probabilities rounded to f16. An F32 cache (an
encoder's K/V, which llama.cpp keeps in no cache, or an f32 -ctk/-ctv) takes q and the
probabilities as f32, unrounded. (See `llamay.quant.ggml_float` for why bit for bit, and
how XLA is kept from fusing.)

A quantised K or V cache (q8_0, q4_0, ...: `llamay.kv.types`): llama.cpp's flash attention,
which it requires for a quantised V (`flash_attention`, below: its three paths).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from llamay.quant import ggml_rows, kv_cache
from llamay.quant.act_quant import VEC_DOT_TYPES, quantize_q8_0, quantize_q8_1
from llamay.quant.ggml_float import (
    dot_bf16_vec,
    dot_f16_sgemm,
    dot_f16_vec,
    dot_f32_vec,
    double_sum,
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
    flash_attn=False,
    threads=1,
):
    """`kernels_pallas.paged_attention.attention_reference` over an f16 cache, as ggml
    computes it (module doc).

    q_prescaled: llama.cpp's graph scales q before K·q (`ggml_ops.Q_PRESCALED`). With
    `flash_attn` (llama.cpp's -fa on), or a cache with a quantised K or V, it is
    `flash_attention`, whose split path depends on llama.cpp's `threads`."""
    if flash_attn or kv_cache.is_quantised(k_cache) or kv_cache.is_quantised(v_cache):
        return flash_attention(q, k_cache, v_cache, q_pos, scale=scale, window=window,
                               softcap=softcap, causal=causal, q_prescaled=q_prescaled,
                               threads=threads)  # fmt: skip
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


# -- llama.cpp's flash attention on CPU (-fa on; a quantised cache) -------------------------
#
# llama.cpp needs flash attention for a quantised V cache (and llamay reads any cache with
# a block type this way); with an F16 cache it is `-fa on` (its tools' default `auto` is on
# for CPU; llama-cpp-python's is off). ggml_compute_forward_flash_attn_ext_f16 takes one of
# three paths per call, by the batch's token count (neq1) and the cells (n_kv), each
# rounding its own way:
#
# one_chunk (a quantised or mixed cache; else 2..63 tokens, or one token over < 512 cells):
#   per query row, q converted by the K type's vec_dot type's from_float (Q8_0 for
#   Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1/Q5_1, f16 for F16), s = vec_dot(K row, q) · scale, then
#   over the visible cells in order an online softmax: a new maximum M rescales the
#   accumulator by expf(Mold - M) (ggml_vec_scale), v·expf(s - M) is added (ggml_vec_mad:
#   an FMA per element; into an f16 accumulator for an F16 V, into f32 after dequantising
#   the row otherwise), S = S·ms + vs (contracted to an FMA by GCC); the result VKQ·(1/S).
# split (one token over n_kv >= 512 cells, K and V both F16 or both F32): the n_kv cells
#   cut into one chunk per thread (ceil(n_kv / threads) each), each chunk a one_chunk pass
#   kept unnormalised (M, S, VKQ as f32), then merged chunk by chunk
#   (ggml_flash_attn_ext_reduce_partials); so the rounding depends on llama.cpp's thread
#   count. n_kv is llama.cpp's: the used cells rounded up to 256 (at least 256).
# tiled (>= 64 tokens, K and V both F16 or both F32): keys in tiles of 64 from cell 0;
#   per tile the scores K·q as an f32 FMA chain over the head dim (q unrounded, simd_gemm),
#   times the scale, masked; per query row the tile's maximum, a rescale of VKQ and S by
#   expf(Mold - M) when it grows, P = ggml_v_expf(s - M) summed as ggml_vec_soft_max_f32
#   does (per 16 lanes, in double, then into the float S); VKQ += P·V as an f32 FMA chain
#   over the tile's keys (simd_gemm). The result VKQ·(1/S).
#
# A call's path follows the step's real token count (`ggml_rows.step_rows`: llama.cpp's
# ubatch when the step is one), so a prefill in chunks of 64..512 tokens dividing 512
# rounds as llama.cpp's ubatches of 512 do.

FA_TILE = 64  # GGML_FA_TILE_Q = GGML_FA_TILE_KV
FA_SPLIT_MIN_CELLS = 512  # one token over at least this many cells: the split path
KV_CELL_PAD = 256  # llama.cpp's n_kv: the used cells rounded up to this


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
                    causal=True, q_prescaled=False, threads=1):  # fmt: skip
    """`attention` as llama.cpp's CPU flash attention computes it (see above): any cache
    type; `threads`, llama.cpp's thread count, decides the split path's chunks."""
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
    visible = _visible(q_pos, S, causal, window)
    args = (q, k_cache, v_cache, visible, kt, vt, kq_scale, softcap)
    if kt.name != vt.name or kt.name not in ("F16", "F32"):
        out = _one_chunk(*args)
    else:
        rows = ggml_rows.step_rows(B * T)
        # a step known to hold more than one token never splits: one pass a row, no merges
        chunk = (
            None if isinstance(rows, int) and rows > 1 else _split_chunk(q_pos, S, rows, threads)
        )
        one = lambda: _one_chunk(*args, chunk=chunk)  # noqa: E731
        if B * T < FA_TILE:  # too few rows for the tiled path, padding or not
            out = one()
        elif isinstance(rows, int):
            out = _tiled(*args) if rows >= FA_TILE else one()
        else:
            out = jax.lax.cond(rows >= FA_TILE, lambda: _tiled(*args), one)
    return jnp.transpose(out, (0, 3, 1, 2, 4)).reshape(B, T, H, D)


def _split_chunk(q_pos: jax.Array, S: int, rows, threads: int) -> jax.Array:
    """[B]: the cells of each row's chunk on the split path (a step of one token, `rows`,
    over n_kv >= 512 cells: ceil(n_kv / threads)), else more than the cache (one chunk:
    one_chunk). n_kv is llama.cpp's for a row whose cells hold positions 0..last (at
    least 256, the used cells rounded up to 256)."""
    last = jnp.max(jnp.where(q_pos < S, q_pos, -1), axis=1)  # [B]
    n_kv = jnp.maximum(KV_CELL_PAD, -(-(last + 1) // KV_CELL_PAD) * KV_CELL_PAD)
    split = (rows == 1) & (n_kv >= FA_SPLIT_MIN_CELLS)
    return jnp.where(split, -(-n_kv // max(int(threads), 1)), S + 1).astype(jnp.int32)


def _scores(q, k_cache, kt, kq_scale, softcap):
    """one_chunk's s [B, K, G, T, S]: vec_dot(K row, q in K's vec_dot type) · scale."""
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
    s = opaque(scores * kq_scale)
    return opaque(np.float32(softcap) * jnp.tanh(s)) if softcap else s


def _one_chunk(q, k_cache, v_cache, visible, kt, vt, kq_scale, softcap, chunk=None):
    """ggml's one_chunk pass per query row -> [B, K, G, T, D]; with `chunk` [B] (cells a
    chunk), the split path: a pass per chunk of cells, merged as
    ggml_flash_attn_ext_reduce_partials merges them."""
    B, T, K, G, D = q.shape
    S = k_cache.shape[1]
    s = _scores(q, k_cache, kt, kq_scale, softcap)  # [B, K, G, T, S]
    f16_acc = vt.name == "F16"
    vals = kv_cache.decode(v_cache, D).astype(F32)  # [B, S, K, D], exact
    empty = (
        jnp.full((B, K, G, T), -jnp.inf, F32),
        jnp.zeros((B, K, G, T), F32),
        jnp.zeros((B, K, G, T, D), F32),
    )

    def step(carry, xs):
        part, final = carry
        s_j, vis_j, v_j, j = xs  # [B, K, G, T], [B, T], [B, K, D], cell index
        if chunk is not None:  # a chunk's first cell: its predecessor's pass merged, reset
            start = ((j % chunk == 0) & (j > 0))[:, None, None, None]
            final = _where4(start, _merge(final, part), final)
            part = _where4(start, empty, part)
        M, Ssum, acc = part  # [B, K, G, T], same, [B, K, G, T, D]
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
        part = _where4(vis, (jnp.where(new_max, s_j, M), s_new, upd), part)
        return (part, final), None

    xs = (jnp.moveaxis(s, -1, 0), jnp.moveaxis(visible, -1, 0), jnp.moveaxis(vals, 1, 0),
          jnp.arange(S, dtype=jnp.int32))  # fmt: skip
    (part, final), _ = jax.lax.scan(step, (empty, empty), xs)
    _, Ssum, acc = part if chunk is None else _merge(final, part)
    return _normalise(acc, Ssum)


def _where4(mask, new, old):
    """new where mask [B, K, G, T] (broadcast over D for the accumulator), else old."""
    return tuple(jnp.where(mask if a.ndim == 4 else mask[..., None], a, b)
                 for a, b in zip(new, old, strict=True))  # fmt: skip


def _merge(final, part):
    """ggml_flash_attn_ext_reduce_partials adding one chunk's (M, S, VKQ) to the running
    one (a chunk with S == 0 skipped): VKQ = VKQ·so + VKQc·sn as GCC contracts it
    (fma(VKQ, so, VKQc·sn)), likewise S."""
    Mf, Sf, Vf = final
    Mc, Sc, Vc = part
    Mn = jnp.maximum(Mf, Mc)
    so, sn = opaque(_expf(Mf - Mn)), opaque(_expf(Mc - Mn))
    Vn = fma(Vf, so[..., None], opaque(Vc * sn[..., None]))
    Sn = fma(Sf, so, opaque(Sc * sn))
    return _where4(Sc != 0, (Mn, Sn, Vn), final)


def _normalise(acc, Ssum):
    """VKQ·(1/S) (0 where no key was visible)."""
    inv = jnp.where(Ssum == 0, 0.0, 1.0 / opaque(jnp.where(Ssum == 0, 1.0, Ssum)))
    return opaque(acc * inv[..., None])


def _tiled(q, k_cache, v_cache, visible, kt, vt, kq_scale, softcap):
    """ggml_compute_forward_flash_attn_ext_tiled per query row -> [B, K, G, T, D] (an
    F16 or F32 cache, K and V of one type; see above)."""
    B, T, K, G, D = q.shape
    S = k_cache.shape[1]
    pad = -S % FA_TILE
    k32 = jnp.pad(k_cache.astype(F32), ((0, 0), (0, pad), (0, 0), (0, 0)))
    v32 = jnp.pad(v_cache.astype(F32), ((0, 0), (0, pad), (0, 0), (0, 0)))
    visible = jnp.pad(visible, ((0, 0), (0, 0), (0, pad)))
    n_tiles = (S + pad) // FA_TILE
    narrow = kt.name == "F16"  # f32 q times an f16 value: exact in 35 bits

    # scores: simd_gemm's FMA chain over the head dim, from 0
    qd = jnp.moveaxis(q, -1, 0)[..., None]  # [D, B, T, K, G, 1]
    kd = jnp.transpose(k32, (3, 0, 2, 1))[:, :, None, :, None, :]  # [D, B, 1, K, 1, S]

    def dot_step(acc, xs):
        return fma(xs[0], xs[1], acc, narrow=narrow), None

    acc0 = jnp.zeros((B, T, K, G, S + pad), F32)
    kq, _ = jax.lax.scan(dot_step, acc0, (qd, kd))
    s = opaque(jnp.transpose(kq, (0, 2, 3, 1, 4)) * kq_scale)  # [B, K, G, T, S']
    if softcap:
        s = opaque(jnp.tanh(s) * np.float32(softcap))
    s = jnp.where(visible[:, None, None, :, :], s, -jnp.inf)
    st = jnp.moveaxis(s.reshape(B, K, G, T, n_tiles, FA_TILE), 4, 0)
    vt_ = jnp.transpose(v32.reshape(B, n_tiles, FA_TILE, K, D), (1, 2, 0, 3, 4))

    def tile(carry, xs):
        M, Ssum, acc = carry  # [B, K, G, T], same, [B, K, G, T, D]
        s_t, v_t = xs  # [B, K, G, T, 64], [64, B, K, D]
        t_max = jnp.max(s_t, axis=-1)
        skip = t_max == -jnp.inf
        m_new = jnp.maximum(M, t_max)
        grow = (m_new > M) & ~skip
        ms = opaque(_expf(jnp.where(grow, M - m_new, 0.0)))
        acc = jnp.where(grow[..., None], opaque(acc * ms[..., None]), acc)
        Ssum = jnp.where(grow, opaque(Ssum * ms), Ssum)
        M = jnp.where(skip, M, m_new)
        live = jnp.isfinite(s_t)
        p = jnp.where(live, v_expf(jnp.where(live, s_t - M[..., None], -200.0)), 0.0)
        sums = reduce16(p.reshape(*p.shape[:-1], FA_TILE // 16, 16))  # [B, K, G, T, 4]
        # (float)(S + Σ sums), the sum in double: RN of the exact sum
        Ssum = jnp.where(skip, Ssum, double_sum([Ssum[..., None], sums]))
        pk = jnp.moveaxis(p, -1, 0)[..., None]  # [64, B, K, G, T, 1]
        vk = v_t[:, :, :, None, None, :]  # [64, B, K, 1, 1, D]

        def mad(a, xs):
            return fma(xs[0], jnp.broadcast_to(xs[1], a.shape), a, narrow=narrow), None

        acc, _ = jax.lax.scan(mad, acc, (pk, vk))
        return (M, Ssum, acc), None

    init = (
        jnp.full((B, K, G, T), -jnp.inf, F32),
        jnp.zeros((B, K, G, T), F32),
        jnp.zeros((B, K, G, T, D), F32),
    )
    (_, Ssum, acc), _ = jax.lax.scan(tile, init, (st, vt_))
    return _normalise(acc, Ssum)


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
