"""Paged decode attention: the Pallas kernels and, first, their jnp references.

References (exact numerics; what every backend without the kernel runs, through
`llamay.kernels.attention`, and the tests' oracle): `attention_reference` over a dense
cache [B, S, K, D] whose slot j holds position j, and `paged_attention_reference(q,
k_pages, v_pages, page_table, q_pos, layer, **kw)`, which gathers each row's pages into
that dense view (`gather_pages`) and runs it. The kernels take the same arguments.

Both kernels walk a row's pages in order with an online softmax (running max m, sum l,
weighted values acc), so no dense view is materialised, and read only the pages
between the row's first visible one (sliding window) and its last real query
position. Per page and kv head: scores = q·kᵀ·scale, softcapped, masked (key j is
visible from query i iff j <= i and, with a window w > 0, i - j < w), as the reference.

- TPU (`platform="tpu"`): grid (rows, pages). `pltpu.PrefetchScalarGridSpec` prefetches
  the page tables, the pool layer, the window and each row's page bounds into SMEM; the
  K/V BlockSpecs' index maps look the page up, so Mosaic DMAs exactly that page. The
  online-softmax state lives in VMEM scratch across the page axis.
- GPU (`platform="gpu"`, Pallas' Triton lowering, which has no scalar prefetch): grid
  (rows, kv heads); the kernel loops over the row's pages, reading each page id from the
  table and the page from the pool ref at that index.

Quantised pages (KV types q8_0, q5_1, q5_0, q4_1, q4_0: uint8 rows of D/32 GGUF blocks,
`llamay.kv.types`; K and V of independent types) are dequantised in the kernel, tile by
tile, to the values of `kv_cache.decode` bit for bit; their reference is the pages
gathered, decoded, then `attention_reference` (`llamay.kernels.attention.
paged_reference`). TPU: the page's [ps, row] byte tile decoded with static slices and
int32 shifts, joined to [ps, D] (`dequantize_tile`). GPU: Triton loads only power-of-two
widths and concatenates no tiles, so `_gpu_quant_kernel` reads each page's bytes 16 (or
1) at a time from the pool ref and keeps q, the scores' partial dots and the output in
pieces of 16 elements (`dequantize_pieces`).

Differences from the reference, both confined to rows whose output is unused: a query
that sees no key gives 0 (the reference: NaN), and padding queries (positions past the
page table) attend only the row's real pages. Causal attention only; the dispatcher
sends non-causal (encoder) and llama.cpp numerics to the reference.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from llamay.gguf.constants import GGMLType
from llamay.quant import kv_cache

F32 = jnp.float32
HIGHEST = jax.lax.Precision.HIGHEST


# -- the references --------------------------------------------------------------------------


def attention_reference(
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
    holds position j, in f32. Key j is visible from a query at position i iff j <= i
    (causal) and i - j < window (sliding window; window <= 0 or None means global).
    Non-causal (encoder) attention sees every slot up to the row's last real query
    position (queries at positions >= S are padding). Scores are scaled, softcapped,
    then masked. Returns [B, T, H, D] in f32."""
    B, T, H, D = q.shape
    S, K = k_cache.shape[1], k_cache.shape[2]
    G = H // K
    qg = q.astype(F32).reshape(B, T, K, G, D)
    scores = jnp.einsum("btkgd,bskd->bkgts", qg, k_cache.astype(F32), precision="highest")
    scores = scores * scale
    if softcap:
        scores = softcap * jnp.tanh(scores / softcap)
    j = jnp.arange(S)[None, None, :]
    i = q_pos[:, :, None]
    if causal:
        visible = j <= i
    else:
        last = jnp.max(jnp.where(q_pos < S, q_pos, -1), axis=1)  # [B]
        visible = jnp.broadcast_to(j <= last[:, None, None], (B, T, S))
    if window is not None:
        w = jnp.asarray(window)
        visible = visible & ((w <= 0) | (i - j < w))
    scores = jnp.where(visible[:, None, None, :, :], scores, -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bkgts,bskd->btkgd", probs, v_cache.astype(F32), precision="highest")
    return out.reshape(B, T, H, D)


def gather_pages(pages: jax.Array, table: jax.Array, layer=None) -> jax.Array:
    """The dense view [B, M·ps, K, D] of each row's pages (of pool layer `layer`)."""
    B, M = table.shape
    at = () if layer is None else (layer,)
    v = pages[(*at, table)]  # [B, M, ps, K, D]: only these pages are read
    return v.reshape(B, M * pages.shape[-3], *pages.shape[-2:])


def paged_attention_reference(q, k_pages, v_pages, page_table, q_pos, layer=None, **kw):
    """Attention of q [B, T, H, D] at positions q_pos [B, T] over paged K/V (one layer's
    pages [P, ps, K, D], or the pool [L, P, ps, K, D] and `layer`) through page_table
    [B, M]: gather, then `attention_reference` (keywords as there)."""
    k = gather_pages(k_pages, page_table, layer)
    v = gather_pages(v_pages, page_table, layer)
    return attention_reference(q, k, v, q_pos, **kw)


# -- the kernels' shared pieces ---------------------------------------------------------------

#: Bytes a block, and where its quants start, of the block KV types the kernels dequantise.
_BLOCKS = {
    GGMLType.Q8_0: (34, 2),
    GGMLType.Q4_0: (18, 2),
    GGMLType.Q4_1: (20, 4),
    GGMLType.Q5_0: (22, 6),
    GGMLType.Q5_1: (24, 8),
}
BLOCK_TYPES = tuple(_BLOCKS)


def _f16_values(h: jax.Array) -> jax.Array:
    """int32 holding f16 bit patterns -> their f32 values, exactly, with 32-bit integer ops
    and one same-width bitcast (no 16-bit types: every Pallas backend lowers these)."""
    sign = (h & 0x8000) << 16
    e, man = (h >> 10) & 0x1F, h & 0x3FF
    bits = jnp.where(
        e == 0x1F, sign | 0x7F800000 | (man << 13), sign | ((e + 112) << 23) | (man << 13)
    )
    normal = jax.lax.bitcast_convert_type(bits, F32)
    sub = jnp.where(sign != 0, -1.0, 1.0).astype(F32) * (man.astype(F32) * F32(2.0**-24))
    return jnp.where(e == 0, sub, normal)


def dequantize_pieces(read, kv_type: GGMLType, d: int) -> list[jax.Array]:
    """The values of rows of d/32 GGUF blocks of a `BLOCK_TYPES` type, as d/16 pieces f32
    [n, 16] (elements 16i..16i+15), from `read(a, w)`: bytes a..a+w-1 of every row as
    int32 [n, w]. Decoded with int32 shifts and masks only (value = d·q, or d·q + m for
    the _1 types: the products exact in f32, the one rounding the + m, so the values are
    `kv_cache.decode`'s bit for bit); pieces of 16 because Triton takes no unaligned
    slice or concatenation of a tile, only loads of power-of-two widths."""
    bb, qoff = _BLOCKS[kv_type]

    def half(a):  # the f16 at byte a of every row
        return _f16_values(read(a, 1) | (read(a + 1, 1) << 8))

    pieces = []
    for b in range(d // 32):
        o = b * bb
        scale = half(o)
        if kv_type == GGMLType.Q8_0:
            for i in (0, 16):
                q = read(o + 2 + i, 16)
                pieces.append(scale * jnp.where(q >= 128, q - 256, q).astype(F32))
            continue
        qs = read(o + qoff, 16)
        lo, hi = qs & 0xF, qs >> 4
        if kv_type in (GGMLType.Q5_0, GGMLType.Q5_1):
            a = o + qoff - 4
            qh = (
                read(a, 1) | (read(a + 1, 1) << 8) | (read(a + 2, 1) << 16) | (read(a + 3, 1) << 24)
            )
            j = jax.lax.broadcasted_iota(jnp.int32, lo.shape, 1)
            lo = lo | (((qh >> j) & 1) << 4)
            hi = hi | (((qh >> (j + 16)) & 1) << 4)
        zero = {GGMLType.Q4_0: 8, GGMLType.Q5_0: 16}.get(kv_type, 0)
        offset = half(o + 2) if kv_type in (GGMLType.Q4_1, GGMLType.Q5_1) else None
        for v in (lo, hi):
            y = scale * (v - zero).astype(F32)
            pieces.append(y if offset is None else y + offset)
    return pieces


def dequantize_tile(x: jax.Array, kv_type: GGMLType | None, d: int) -> jax.Array:
    """A tile of cache rows [n, row] -> f32 [n, d]: float rows widened, uint8 rows of
    blocks decoded (`dequantize_pieces`) and joined along the last axis."""
    if kv_type is None:
        return x.astype(F32)
    xi = x.astype(jnp.int32)
    return jnp.concatenate(dequantize_pieces(lambda a, w: xi[:, a : a + w], kv_type, d), -1)


def online_update(state, q, pos, k, v, start, window, *, scale: float, softcap: float | None):
    """One page of the online softmax for one kv head: q [R, D] at positions pos [R, 1],
    keys/values [ps, D] at positions start..start+ps-1; state (m [R,1], l [R,1], acc [R,D])."""
    m_prev, l_prev, acc_prev = state
    dims = (((1,), (1,)), ((), ()))
    s = jax.lax.dot_general(q, k, dims, precision=HIGHEST, preferred_element_type=F32) * scale
    if softcap:
        s = softcap * jnp.tanh(s / softcap)
    j = start + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
    visible = (j <= pos) & ((window <= 0) | (pos - j < window))
    s = jnp.where(visible, s, -jnp.inf)
    m = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
    safe = jnp.where(m == -jnp.inf, 0.0, m)  # no key seen yet: keep everything at 0
    p = jnp.exp(s - safe)
    alpha = jnp.exp(m_prev - safe)
    l_new = alpha * l_prev + jnp.sum(p, axis=1, keepdims=True)
    pv = jnp.dot(p, v.astype(F32), precision=HIGHEST, preferred_element_type=F32)
    return m, l_new, alpha * acc_prev + pv


def finish(l, acc):
    return jnp.where(l > 0, acc / jnp.where(l > 0, l, 1.0), 0.0)


def _init_state(rows: int, d: int):
    return (
        jnp.full((rows, 1), -jnp.inf, F32),
        jnp.zeros((rows, 1), F32),
        jnp.zeros((rows, d), F32),
    )


# -- TPU: scalar-prefetched page tables, one page per grid step ------------------------------


def _tpu_kernel(meta_ref, table_ref, bounds_ref, q_ref, pos_ref, k_ref, v_ref, o_ref, *scratch,
                n_kv: int, ps: int, scale: float, softcap: float | None,
                types=(None, None)):  # fmt: skip
    m_sc, l_sc, acc_sc = scratch
    b, page = pl.program_id(0), pl.program_id(1)
    first, last = bounds_ref[b, 0], bounds_ref[b, 1]

    @pl.when(page == 0)
    def _init():
        m_sc[...] = jnp.full(m_sc.shape, -jnp.inf, F32)
        l_sc[...] = jnp.zeros(l_sc.shape, F32)
        acc_sc[...] = jnp.zeros(acc_sc.shape, F32)

    @pl.when((page >= first) & (page <= last))
    def _update():
        pos = pos_ref[...]
        for h in range(n_kv):  # the kv heads of this page (static)
            state = (m_sc[h], l_sc[h], acc_sc[h])
            q = q_ref[h].astype(F32)
            k = dequantize_tile(k_ref[:, h, :], types[0], q.shape[-1])
            v = dequantize_tile(v_ref[:, h, :], types[1], q.shape[-1])
            m, l, acc = online_update(
                state, q, pos, k, v, page * ps, meta_ref[1], scale=scale, softcap=softcap
            )
            m_sc[h], l_sc[h], acc_sc[h] = m, l, acc

    @pl.when(page == pl.num_programs(1) - 1)
    def _out():
        for h in range(n_kv):
            o_ref[h] = finish(l_sc[h], acc_sc[h])


def _tpu_call(qh, pos, pool_k, pool_v, table, meta, bounds, *, scale, softcap, interpret, types):
    from jax.experimental.pallas import tpu as pltpu

    B, K, R, D = qh.shape
    ps = pool_k.shape[-3]
    M = table.shape[1]

    def kv_map(b, m, meta, table, bounds):  # this grid step's page (clamped: no new DMA)
        mm = jnp.minimum(jnp.maximum(m, bounds[b, 0]), jnp.maximum(bounds[b, 1], 0))
        return (meta[0], table[b, mm], 0, 0, 0)

    k_spec = pl.BlockSpec((None, None, ps, K, pool_k.shape[-1]), kv_map)
    v_spec = pl.BlockSpec((None, None, ps, K, pool_v.shape[-1]), kv_map)
    row_spec = pl.BlockSpec((None, K, R, D), lambda b, m, *_: (b, 0, 0, 0))
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=3,
        grid=(B, M),
        in_specs=[
            row_spec,
            pl.BlockSpec((None, R, 1), lambda b, m, *_: (b, 0, 0)),
            k_spec,
            v_spec,
        ],  # fmt: skip
        out_specs=row_spec,
        scratch_shapes=[
            pltpu.VMEM((K, R, 1), F32),
            pltpu.VMEM((K, R, 1), F32),
            pltpu.VMEM((K, R, D), F32),
        ],
    )
    kernel = functools.partial(_tpu_kernel, n_kv=K, ps=ps, scale=scale, softcap=softcap,
                               types=types)  # fmt: skip
    params = None
    if not interpret:
        params = pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"))
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(qh.shape, F32),
        grid_spec=grid_spec,
        compiler_params=params,
        interpret=interpret,
        name="paged_attention_tpu",
    )(meta, table, bounds, qh, pos, pool_k, pool_v)


# -- GPU: one program per (row, kv head), looping over the row's pages ------------------------


def _gpu_kernel(meta_ref, table_ref, bounds_ref, q_ref, pos_ref, k_ref, v_ref, o_ref,
                *, ps: int, scale: float, softcap: float | None, types=(None, None)):  # fmt: skip
    b, h = pl.program_id(0), pl.program_id(1)
    layer, window = meta_ref[0], meta_ref[1]
    q = q_ref[...].astype(F32)  # [R, D]
    pos = pos_ref[...]

    def body(i, state):
        page = table_ref[b, i]
        k = dequantize_tile(k_ref[layer, page, :, h, :], types[0], q.shape[-1])
        v = dequantize_tile(v_ref[layer, page, :, h, :], types[1], q.shape[-1])
        return online_update(state, q, pos, k, v, i * ps, window, scale=scale, softcap=softcap)

    init = _init_state(*q.shape)
    _, l, acc = jax.lax.fori_loop(bounds_ref[b, 0], bounds_ref[b, 1] + 1, body, init)
    o_ref[...] = finish(l, acc)


def _gpu_grid_call(kernel, name, qh, pos, pool_k, pool_v, table, meta, bounds, *, interpret):
    """One program per (row, kv head): `kernel` gets the row's queries [R, D] and
    positions [R, 1] as blocks, the scalars, page table, bounds and pools whole."""
    B, K, R, D = qh.shape
    whole = pl.no_block_spec  # the whole array: the kernel indexes it
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(qh.shape, F32),
        grid=(B, K),
        in_specs=[
            whole,
            whole,
            whole,
            pl.BlockSpec((None, None, R, D), lambda b, h: (b, h, 0, 0)),
            pl.BlockSpec((None, R, 1), lambda b, h: (b, 0, 0)),
            whole,
            whole,
        ],
        out_specs=pl.BlockSpec((None, None, R, D), lambda b, h: (b, h, 0, 0)),
        interpret=interpret,
        name=name,
    )(meta, table, bounds, qh, pos, pool_k, pool_v)


def _gpu_call(qh, pos, pool_k, pool_v, table, meta, bounds, *, scale, softcap, interpret, types):
    ps = pool_k.shape[-3]
    kernel = functools.partial(_gpu_kernel, ps=ps, scale=scale, softcap=softcap, types=types)
    args = (qh, pos, pool_k, pool_v, table, meta, bounds)
    return _gpu_grid_call(kernel, "paged_attention_gpu", *args, interpret=interpret)


# -- GPU over quantised pages: the same loop, every tile in pieces of 16 elements ----------


def _gpu_quant_kernel(meta_ref, table_ref, bounds_ref, q_ref, pos_ref, k_ref, v_ref, o_ref,
                      *, ps: int, scale: float, softcap: float | None, types, d: int):  # fmt: skip
    """As `_gpu_kernel`, for K and/or V pools of block types: each page's rows are read
    16 bytes (or 1) at a time from the pool ref and decoded (`dequantize_pieces`); the
    scores are the sum over the d/16 pieces of q's piece · the keys' piece, the output
    is accumulated piece by piece and stored piece by piece (Triton has no tile
    concatenation)."""
    b, h = pl.program_id(0), pl.program_id(1)
    layer, window = meta_ref[0], meta_ref[1]
    n = d // 16
    qs = [q_ref[:, pl.ds(16 * i, 16)].astype(F32) for i in range(n)]  # [R, 16] each
    pos = pos_ref[...]
    dims = (((1,), (1,)), ((), ()))

    def pieces(ref, page, t):
        if t is None:
            return [ref[layer, page, :, h, pl.ds(16 * i, 16)].astype(F32) for i in range(n)]

        def read(a, w):
            return ref[layer, page, :, h, pl.ds(a, w)].astype(jnp.int32)

        return dequantize_pieces(read, t, d)

    def body(i, state):
        m_prev, l_prev, accs = state
        page = table_ref[b, i]
        ks = pieces(k_ref, page, types[0])
        s = sum(
            jax.lax.dot_general(qp, kp, dims, precision=HIGHEST, preferred_element_type=F32)
            for qp, kp in zip(qs, ks, strict=True)
        )
        s = s * scale
        if softcap:
            s = softcap * jnp.tanh(s / softcap)
        j = i * ps + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
        visible = (j <= pos) & ((window <= 0) | (pos - j < window))
        s = jnp.where(visible, s, -jnp.inf)
        m = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
        safe = jnp.where(m == -jnp.inf, 0.0, m)
        p = jnp.exp(s - safe)
        alpha = jnp.exp(m_prev - safe)
        l_new = alpha * l_prev + jnp.sum(p, axis=1, keepdims=True)
        vs = pieces(v_ref, page, types[1])
        accs = tuple(
            alpha * acc + jnp.dot(p, vp, precision=HIGHEST, preferred_element_type=F32)
            for acc, vp in zip(accs, vs, strict=True)
        )
        return m, l_new, accs

    R = qs[0].shape[0]
    init = (
        jnp.full((R, 1), -jnp.inf, F32),
        jnp.zeros((R, 1), F32),
        tuple(jnp.zeros((R, 16), F32) for _ in range(n)),
    )
    _, l, accs = jax.lax.fori_loop(bounds_ref[b, 0], bounds_ref[b, 1] + 1, body, init)
    for i, acc in enumerate(accs):
        o_ref[:, pl.ds(16 * i, 16)] = finish(l, acc)


def _gpu_quant_call(qh, pos, pool_k, pool_v, table, meta, bounds, *, scale, softcap, interpret,
                    types):  # fmt: skip
    ps, d = pool_k.shape[-3], qh.shape[-1]
    kernel = functools.partial(_gpu_quant_kernel, ps=ps, scale=scale, softcap=softcap,
                               types=types, d=d)  # fmt: skip
    args = (qh, pos, pool_k, pool_v, table, meta, bounds)
    return _gpu_grid_call(kernel, "paged_attention_gpu_quant", *args, interpret=interpret)


# -- the wrapper: the reference's signature (plus the platform) ------------------------


def pool_types(k_pages, v_pages, d: int) -> tuple[GGMLType | None, GGMLType | None]:
    """(K, V) block types of two pools for heads of d (None: a float pool); ValueError
    for a pool the kernels do not read."""

    def one(pages):
        if not kv_cache.is_quantised(pages):
            if pages.shape[-1] != d:
                raise ValueError(f"paged_attention: pages {pages.shape} for heads of {d}")
            return None
        t = kv_cache.cache_type(pages, d)
        if t not in BLOCK_TYPES:
            raise ValueError(f"paged_attention: no kernel reads a {t.name} KV cache")
        return t

    return one(k_pages), one(v_pages)


def _rows(tg: int, platform: str) -> int:
    """Query rows per kv head, padded: a sublane multiple (TPU), a power of two >= 16 (GPU)."""
    if platform == "gpu":
        return max(16, pl.next_power_of_2(tg))
    return -(-tg // 8) * 8


def page_bounds(q_pos: jax.Array, window, ps: int, n_pages: int) -> jax.Array:
    """[B, 2] int32: each row's first and last page holding a visible key (last = -1: none).
    Positions past the table (padding) do not count."""
    valid = (q_pos >= 0) & (q_pos < n_pages * ps)
    big = jnp.int32(n_pages * ps)
    hi = jnp.max(jnp.where(valid, q_pos, -1), axis=1)
    lo = jnp.min(jnp.where(valid, q_pos, big), axis=1)
    w = jnp.asarray(0 if window is None else window, jnp.int32)
    first = jnp.where(w > 0, jnp.maximum(lo - w + 1, 0), 0) // ps
    last = jnp.where(hi >= 0, hi // ps, -1)
    return jnp.stack([jnp.minimum(first, n_pages - 1), last], axis=1).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("scale", "softcap", "platform", "interpret"))
def paged_attention_pallas(
    q: jax.Array,
    k_pages: jax.Array,
    v_pages: jax.Array,
    page_table: jax.Array,
    q_pos: jax.Array,
    layer: jax.Array | int | None = None,
    *,
    scale: float,
    window: jax.Array | int | None = None,
    softcap: float | None = None,
    platform: str = "tpu",
    interpret=False,
) -> jax.Array:
    """Causal attention of q [B, T, H, D] at q_pos [B, T] over the pages [P, ps, K, row] (or
    the pool [L, P, ps, K, row] and `layer`) named by page_table [B, M]. -> [B, T, H, D] f32.
    K and V pools of any KV type each (`pool_types`): float rows of D, or uint8 rows of D/32
    blocks of a `BLOCK_TYPES` type, dequantised tile by tile in the kernel."""
    B, T, H, D = q.shape
    ps, K = k_pages.shape[-3], k_pages.shape[-2]
    M = page_table.shape[1]
    if H % K or k_pages.shape[:-1] != v_pages.shape[:-1]:
        raise ValueError(f"paged_attention: q {q.shape} does not fit pages {k_pages.shape}")
    types = pool_types(k_pages, v_pages, D)
    if layer is None:
        k_pages, v_pages, layer = k_pages[None], v_pages[None], 0
    G, TG = H // K, T * (H // K)
    R = _rows(TG, platform)
    qh = q.astype(F32).reshape(B, T, K, G, D).transpose(0, 2, 1, 3, 4).reshape(B, K, TG, D)
    qh = jnp.pad(qh, ((0, 0), (0, 0), (0, R - TG), (0, 0)))
    pos = jnp.broadcast_to(q_pos[:, :, None], (B, T, G)).reshape(B, TG).astype(jnp.int32)
    pos = jnp.pad(pos, ((0, 0), (0, R - TG)), constant_values=-1)[..., None]
    w = jnp.asarray(0 if window is None else window, jnp.int32)
    meta = jnp.stack([jnp.asarray(layer, jnp.int32), w])
    bounds = page_bounds(q_pos, window, ps, M)
    call = {"tpu": _tpu_call, "gpu": _gpu_call}[platform]
    if platform == "gpu" and types != (None, None):
        if D % 16:
            raise ValueError(f"paged_attention: quantised pages need D % 16 == 0, not {D}")
        call = _gpu_quant_call
    out = call(
        qh, pos, k_pages, v_pages, page_table.astype(jnp.int32), meta, bounds,
        scale=scale, softcap=softcap, interpret=interpret, types=types,
    )  # fmt: skip
    out = out[:, :, :TG].reshape(B, K, T, G, D).transpose(0, 2, 1, 3, 4)
    return out.reshape(B, T, H, D)
