"""Block formulas written once against an array namespace (numpy or jax.numpy).

`dequantize_blocks(bk, layout, blocks)` maps uint8 [..., block_bytes] to f32
[..., block_elems] with nothing but slices, shifts, masks, reshapes and
broadcasts: no gathers, no per-block Python, so it vectorises in numpy and
fuses into one loop in XLA.

Why the results are bit-exact against ggml/gguf-py whatever the evaluation order
(and whether or not a backend contracts `a*b - c` into an FMA): every scale is
an f16 (11 significant bits) times small integers (sub-scale ≤ 8 bits, quant
≤ 6 bits), so every product is exact in f32 (Q6_K, the widest, needs at most
11 + 7 + 6 = 24 bits). The only rounding is the final `+ m` / `- dmin*m`, one
operation in every formulation.

The quantiser helpers at the bottom (`round_away`, `signed_absmax`,
`nibble_pack`, `bit_pack`) serve both `quantize.py` (numpy, weights) and
`act_quant.py` (jnp, activations).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llamay.gguf.constants import GGMLType
from llamay.quant import iquants
from llamay.quant.layouts import Array, Backend, BlockLayout

# --- bit unpacking -------------------------------------------------------------------


def unpack_bits(bk: Backend, x: Array, shifts: Sequence[int], mask: int, axis: int) -> Array:
    """(x >> s) & mask for every s in `shifts`, stacked on a new axis at `axis` (< 0)."""
    xp = bk.xp
    s = xp.asarray(shifts, dtype=xp.uint8).reshape((len(shifts),) + (1,) * (-axis - 1))
    return (xp.expand_dims(x, axis) >> s) & mask


def _nibbles(bk: Backend, qs: Array) -> Array:
    """[..., 16] bytes -> [..., 32]: all low nibbles, then all high nibbles."""
    return unpack_bits(bk, qs, (0, 4), 0xF, -2).reshape(*qs.shape[:-1], 32)


def _bits_le(bk: Backend, qh: Array) -> Array:
    """[..., n] bytes -> [..., 8n]: bit i of the little-endian word, at index i."""
    return unpack_bits(bk, qh, range(8), 1, -1).reshape(*qh.shape[:-1], 8 * qh.shape[-1])


def _planes(bk: Backend, x: Array, shifts: Sequence[int], mask: int, chunk: int) -> Array:
    """[..., m] -> [..., len(shifts) * m]: x split in `chunk`-byte runs; each run
    gives len(shifts) consecutive runs of values, one per shift (the K-quant order)."""
    runs = x.reshape(*x.shape[:-1], -1, chunk)
    return unpack_bits(bk, runs, shifts, mask, -2).reshape(*x.shape[:-1], -1)


def _f32(bk: Backend, x: Array) -> Array:
    return x.astype(bk.xp.float32)


def _grouped(x: Array, groups: int) -> Array:
    return x.reshape(*x.shape[:-1], groups, x.shape[-1] // groups)


def _scaled(bk: Backend, q: Array, scale: Array, offset: Array | None = None) -> Array:
    """q [..., n*g] grouped by the n entries of scale [..., n]: q*scale (+ offset)."""
    n = scale.shape[-1]
    out = _grouped(_f32(bk, q), n) * scale[..., None]
    if offset is not None:
        out = out + offset[..., None]
    return out.reshape(q.shape)


# --- K-quant scale unpacking ---------------------------------------------------------


def q3k_scales(bk: Backend, s: Array) -> Array:
    """12 bytes -> 16 six-bit scales, as int8 in [-32, 31]."""
    lo = unpack_bits(bk, s[..., 0:8], (0, 4), 0xF, -2).reshape(*s.shape[:-1], 16)
    hi = unpack_bits(bk, s[..., 8:12], (0, 2, 4, 6), 0x3, -2).reshape(*s.shape[:-1], 16)
    return (lo | (hi << 4)).astype(bk.xp.int8) - 32


def q4k_scales_mins(bk: Backend, s: Array) -> tuple[Array, Array]:
    """12 bytes -> 8 six-bit scales and 8 six-bit mins (ggml's get_scale_min_k4)."""
    xp = bk.xp
    a, b, c = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = xp.concatenate([a & 0x3F, (c & 0xF) | ((a >> 6) << 4)], axis=-1)
    mn = xp.concatenate([b & 0x3F, (c >> 4) | ((b >> 6) << 4)], axis=-1)
    return sc, mn


# --- one formula per type ----------------------------------------------------------------

F = dict[str, Array]


def _bitcast(bk: Backend, x: Array, dtype: str) -> Array:
    return bk.from_bytes(bk.to_bytes(x), dtype)


def _f32_field(bk: Backend, f: F) -> Array:
    return f["x"]


def _f16(bk: Backend, f: F) -> Array:
    """f16 -> f32, keeping NaN payloads bit for bit (XLA's convert quiets signalling NaNs)."""
    xp, x = bk.xp, f["x"]
    if bk.f16_keeps_nan_payload:
        return _f32(bk, x)
    h = _bitcast(bk, x, "uint16").astype(xp.uint32)
    nan = _bitcast(bk, ((h & 0x8000) << 16) | 0x7F800000 | ((h & 0x3FF) << 13), "float32")
    return xp.where(xp.isnan(x), nan, _f32(bk, x))


def _bf16(bk: Backend, f: F) -> Array:
    xp = bk.xp
    return _bitcast(bk, f["x"].astype(xp.uint32) << 16, "float32")


def _d(bk: Backend, f: F, name: str = "d") -> Array:
    return _f32(bk, f[name])  # [..., 1]


# Every quantised type is affine per group: value = q · scale + offset, with q small
# integers (int8), and scale and offset f32 per group of `len(q) // len(scale)` elements
# (offset None where there is none). Both products are exact in f32 (module doc), so
# the one rounding is the final add, whichever way a caller groups the sum.
Parts = tuple[Array, Array, Array | None]  # q int8 [..., n·g], scale [..., n], offset or None


def _i8(bk: Backend, x: Array) -> Array:
    return x.astype(bk.xp.int8)


def _neg(x: Array) -> Array:
    return -x  # a + (-b) == a - b exactly: K-quant mins become offsets


def _q4_0(bk: Backend, f: F) -> Parts:
    return _i8(bk, _nibbles(bk, f["qs"])) - 8, _d(bk, f), None


def _q4_1(bk: Backend, f: F) -> Parts:
    return _i8(bk, _nibbles(bk, f["qs"])), _d(bk, f), _d(bk, f, "m")


def _q5(bk: Backend, f: F) -> Array:
    return _i8(bk, _nibbles(bk, f["qs"]) | (_bits_le(bk, f["qh"]) << 4))


def _q5_0(bk: Backend, f: F) -> Parts:
    return _q5(bk, f) - 16, _d(bk, f), None


def _q5_1(bk: Backend, f: F) -> Parts:
    return _q5(bk, f), _d(bk, f), _d(bk, f, "m")


def _q8(bk: Backend, f: F) -> Parts:
    return f["qs"], _d(bk, f), None


def _q2_k(bk: Backend, f: F) -> Parts:
    sc = f["scales"]
    q = _i8(bk, _planes(bk, f["qs"], (0, 2, 4, 6), 0x3, 32))
    return q, _d(bk, f) * _f32(bk, sc & 0xF), _neg(_d(bk, f, "dmin") * _f32(bk, sc >> 4))


def _q3_k(bk: Backend, f: F) -> Parts:
    low = _planes(bk, f["qs"], (0, 2, 4, 6), 0x3, 32)
    high = unpack_bits(bk, f["hmask"], range(8), 1, -2).reshape(low.shape)
    q = low.astype(bk.xp.int8) - ((high ^ 1) << 2).astype(bk.xp.int8)
    return q, _d(bk, f) * _f32(bk, q3k_scales(bk, f["scales"])), None


def _q45_k(bk: Backend, f: F, q: Array) -> Parts:
    sc, mn = q4k_scales_mins(bk, f["scales"])
    return _i8(bk, q), _d(bk, f) * _f32(bk, sc), _neg(_d(bk, f, "dmin") * _f32(bk, mn))


def _q4_k(bk: Backend, f: F) -> Parts:
    return _q45_k(bk, f, _planes(bk, f["qs"], (0, 4), 0xF, 32))


def _q5_k(bk: Backend, f: F) -> Parts:
    low = _planes(bk, f["qs"], (0, 4), 0xF, 32)
    high = unpack_bits(bk, f["qh"], range(8), 1, -2).reshape(low.shape)
    return _q45_k(bk, f, low | (high << 4))


def _q6_k(bk: Backend, f: F) -> Parts:
    ql, qh = f["ql"], f["qh"]
    lead = ql.shape[:-1]
    # ql [..., n=2, half=2, 32] -> nibble planes on a new axis before `half`.
    low = unpack_bits(bk, ql.reshape(*lead, 2, 2, 32), (0, 4), 0xF, -3).reshape(*lead, 256)
    high = _planes(bk, qh, (0, 2, 4, 6), 0x3, 32)
    q = (low | (high << 4)).astype(bk.xp.int8) - 32
    return q, _d(bk, f) * _f32(bk, f["scales"]), None


AFFINE: dict[GGMLType, Callable[[Backend, F], Parts]] = {
    GGMLType.Q4_0: _q4_0,
    GGMLType.Q4_1: _q4_1,
    GGMLType.Q5_0: _q5_0,
    GGMLType.Q5_1: _q5_1,
    GGMLType.Q8_0: _q8,
    GGMLType.Q8_K: _q8,
    GGMLType.Q2_K: _q2_k,
    GGMLType.Q3_K: _q3_k,
    GGMLType.Q4_K: _q4_k,
    GGMLType.Q5_K: _q5_k,
    GGMLType.Q6_K: _q6_k,
    **iquants.PARTS,  # the i-quants, TQ1_0/TQ2_0, MXFP4
}


def affine_parts(bk: Backend, lay: BlockLayout, blocks: Array) -> Parts:
    """uint8 [..., block_bytes] of a quantised type -> (q, scale, offset) per block (above)."""
    return AFFINE[lay.ggml_type](bk, lay.unpack(bk, blocks))


def affine_values(bk: Backend, q: Array, scale: Array, offset: Array | None) -> Array:
    """q · scale + offset, each group of q [..., n·g] by its scale/offset [..., n]: f32."""
    return _scaled(bk, q, scale, offset)


_FLOATS: dict[GGMLType, Callable[[Backend, F], Array]] = {
    GGMLType.F32: _f32_field,
    GGMLType.F16: _f16,
    GGMLType.BF16: _bf16,
}


def dequantize_blocks(bk: Backend, lay: BlockLayout, blocks: Array) -> Array:
    """uint8 [..., block_bytes] -> float32 [..., block_elems]."""
    if lay.ggml_type in _FLOATS:
        return _FLOATS[lay.ggml_type](bk, lay.unpack(bk, blocks))
    if lay.ggml_type in iquants.VALUES:
        return iquants.VALUES[lay.ggml_type](bk, lay.unpack(bk, blocks))
    return affine_values(bk, *affine_parts(bk, lay, blocks))


# --- quantiser helpers -------------------------------------------------------------------


def round_away(bk: Backend, v: Array) -> Array:
    """C's roundf (halves away from zero), exactly.

    Rounds half to even, then moves exact halves that went toward zero one step
    out. Only comparisons touch `v`, so a backend that contracts `x*id - r` into
    an FMA (XLA on GPU) cannot change the tie decision.
    """
    xp = bk.xp
    r = xp.round(v)
    tie_in = xp.abs(v) == xp.abs(r) + 0.5
    return r + xp.where(tie_in, xp.sign(v), xp.zeros_like(v))


Q8_VARIANTS = ("ref", "x86", "arm")


def q8_quants(bk: Backend, x: Array, variant: str = "ref") -> tuple[Array, Array]:
    """One Q8_0/Q8_1 block [..., 32] -> (qs int8 [..., 32], d f32 [..., 1], unrounded).

    `variant` picks which of ggml's implementations to reproduce:
    "ref" = quantize_row_q8_0_ref (id = 1/d, roundf), "x86" = the AVX/AVX2/AVX-512
    path (id = 127/amax, round half to even), "arm" = the NEON path (id = 1/d,
    round half to even). They differ at exact ties, and x86 also where 127/amax and
    1/(amax/127) round differently.
    """
    if variant not in Q8_VARIANTS:
        raise ValueError(f"unknown Q8 variant {variant!r} (one of {Q8_VARIANTS})")
    xp, opaque = bk.xp, bk.opaque
    # XLA rewrites divisions algebraically (a / bcast(c) -> a * (1/c), 1 / (a / b) -> b / a,
    # ...), which is not IEEE division; `opaque` pins each operand as computed.
    amax = xp.max(xp.abs(x), axis=-1, keepdims=True)
    d = amax / opaque(xp.full_like(amax, 127))
    if variant == "x86":
        inv = xp.where(amax != 0, 127 / opaque(amax), 0)
    else:
        inv = xp.where(d != 0, 1 / opaque(d), 0)
    v = x * opaque(inv)
    q = round_away(bk, v) if variant == "ref" else xp.round(v)
    return q.astype(xp.int8), d


def signed_absmax(bk: Backend, x: Array) -> Array:
    """[..., n] -> [..., 1]: the first element of largest magnitude, with its sign
    (ggml's `if (amax < fabsf(v)) { amax = fabsf(v); max = v; }`), without a gather."""
    xp = bk.xp
    a = xp.abs(x)
    first = xp.argmax(a, axis=-1, keepdims=True)
    at = xp.arange(x.shape[-1]) == first
    return xp.max(xp.where(at, x, -xp.inf), axis=-1, keepdims=True)


def nibble_pack(q: Array) -> Array:
    """uint8 [..., 32] in 0..15 (low bits used) -> [..., 16]: element j | element j+16 << 4."""
    return (q[..., :16] & 0xF) | (q[..., 16:] << 4)


def bit_pack(bk: Backend, bits: Array) -> Array:
    """uint8 [..., 8n] of 0/1 -> [..., n] bytes, bit i of the little-endian word at index i."""
    xp = bk.xp
    b = bits.reshape(*bits.shape[:-1], -1, 8) << xp.arange(8, dtype=xp.uint8)
    return xp.sum(b, axis=-1, dtype=xp.uint8)
