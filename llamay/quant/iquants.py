"""The i-quants (IQ1_S … IQ4_XS), the ternary types (TQ1_0, TQ2_0) and MXFP4 as affine parts.

Each type's block formula (ggml's `dequantize_row_*`) is written as `formulas.AFFINE`'s
(q int8, scale f32 per group, None): value = q · scale. The codebook types store, per
group of 4 or 8 elements, an index into a grid (`iq_tables`) whose entries are small
integers; their signs, where stored apart, multiply in; IQ1_S/IQ1_M add ±1/8 to every
grid value, so q = 8·grid ± 1 and the scale carries the 1/8.

Bit-exact against ggml's `to_float` and gguf-py's `dequantize`: every product in ggml's
formula is exact in f32 (an f16 scale, 11 significant bits, times a sub-scale of ≤ 6
bits times a grid value of ≤ 8 bits), except IQ4_XS, whose d · (ls - 32) · kvalue can
need 25 bits: there ggml rounds dl = d · (ls - 32) first and then dl · kvalue, and
`affine_values` multiplies in that same order (scale first, then the quant).

Unlike the K-quants these need gathers (grid lookups by index); the tables are small
(≤ 2048 × 8 bytes) and constant.
"""

from __future__ import annotations

import base64
import functools
from collections.abc import Callable, Sequence

import numpy as np

from llamay.gguf.constants import GGMLType
from llamay.quant import iq_tables
from llamay.quant.layouts import Array, Backend

F = dict[str, Array]
Parts = tuple[Array, Array, None]


def split_bits(bk: Backend, x: Array, shifts: Sequence[int], mask: int) -> Array:
    """[..., n] -> [..., n, len(shifts)]: (x >> s) & mask for each s, on the last axis."""
    xp = bk.xp
    s = xp.asarray(shifts, dtype=x.dtype)
    return (x[..., None] >> s) & mask


def _flat(x: Array) -> Array:
    return x.reshape(*x.shape[:-2], x.shape[-2] * x.shape[-1])


def _i8(bk: Backend, x: Array) -> Array:
    return x.astype(bk.xp.int8)


def _f32(bk: Backend, x: Array) -> Array:
    return x.astype(bk.xp.float32)


def _take(bk: Backend, table: np.ndarray, index: Array) -> Array:
    """table[index] along axis 0 (index any shape, any unsigned int type)."""
    xp = bk.xp
    return xp.take(xp.asarray(table), index.astype(xp.int32), axis=0)


@functools.cache
def grid(name: str) -> np.ndarray:
    """ggml's iq*_grid table `name` as int8 [entries, elements] (`iq_tables`)."""
    values, bits, shape, b64 = iq_tables.GRIDS[name]
    packed = np.frombuffer(base64.b64decode("".join(b64)), np.uint8)
    per = 8 // bits
    index = (packed[:, None] >> (np.arange(per, dtype=np.uint8) * bits)) & ((1 << bits) - 1)
    return np.asarray(values, np.int8)[index.reshape(shape)]


@functools.cache
def ksigns() -> np.ndarray:
    """ggml's ksigns_iq2xs: 7 stored sign bits plus an 8th making the count of 1s even,
    as 8 multipliers ±1: int8 [128, 8]."""
    i = np.arange(128)
    parity = np.array([bin(v).count("1") & 1 for v in i])
    byte = i | (parity << 7)
    bit = (byte[:, None] >> np.arange(8)) & 1
    return (1 - 2 * bit).astype(np.int8)


def _sign_bits(bk: Backend, signs: Array) -> Array:
    """[..., n] bytes -> int8 [..., n, 8]: -1 where bit j of the byte is set, else 1."""
    return 1 - 2 * _i8(bk, split_bits(bk, signs, range(8), 1))


def _d(bk: Backend, f: F) -> Array:
    return _f32(bk, f["d"])  # [..., 1]


def _half_step(bk: Backend, d: Array, ls: Array, step: float) -> Array:
    """d · (0.5 + ls) · step, as ggml orders it (each product exact anyway)."""
    return d * (0.5 + _f32(bk, ls)) * step


# --- codebook types -----------------------------------------------------------------


def _iq2_xxs(bk: Backend, f: F) -> Parts:
    qs = f["qs"].reshape(*f["qs"].shape[:-1], 8, 2)  # u32 pairs per 32 elements
    idx = split_bits(bk, qs[..., 0], (0, 8, 16, 24), 0xFF)  # [..., 8, 4]
    sgn = split_bits(bk, qs[..., 1], (0, 7, 14, 21), 0x7F)
    q = _take(bk, grid("IQ2XXS_GRID"), idx) * _take(bk, ksigns(), sgn)  # [..., 8, 4, 8]
    scale = _half_step(bk, _d(bk, f), qs[..., 1] >> 28, 0.25)
    return _flat(_flat(q)), scale, None


def _iq2_xs(bk: Backend, f: F) -> Parts:
    qs = f["qs"]  # u16 [..., 32]: 9-bit grid index, 7-bit sign index
    q = _take(bk, grid("IQ2XS_GRID"), qs & 511) * _take(bk, ksigns(), qs >> 9)
    scale = _half_step(bk, _d(bk, f), _flat(split_bits(bk, f["scales"], (0, 4), 0xF)), 0.25)
    return _flat(q), scale, None


def _iq2_s(bk: Backend, f: F) -> Parts:
    xp = bk.xp
    high = _flat(split_bits(bk, f["qh"], (0, 2, 4, 6), 0x3)).astype(xp.uint16)
    q = _take(bk, grid("IQ2S_GRID"), f["qs"].astype(xp.uint16) | (high << 8))
    q = q * _sign_bits(bk, f["signs"])
    scale = _half_step(bk, _d(bk, f), _flat(split_bits(bk, f["scales"], (0, 4), 0xF)), 0.25)
    return _flat(q), scale, None


def _iq3_xxs(bk: Backend, f: F) -> Parts:
    w = f["scales"]  # u32 [..., 8]: 4 7-bit sign indices and a 4-bit scale per 32
    lead = w.shape[:-1]
    values = _take(bk, grid("IQ3XXS_GRID"), f["qs"]).reshape(*lead, 8, 4, 8)
    signs = _take(bk, ksigns(), split_bits(bk, w, (0, 7, 14, 21), 0x7F))  # [..., 8, 4, 8]
    scale = _half_step(bk, _d(bk, f), w >> 28, 0.5)
    return (values * signs).reshape(*lead, 256), scale, None


def _iq3_s(bk: Backend, f: F) -> Parts:
    xp = bk.xp
    lead = f["qs"].shape[:-1]
    high = _flat(split_bits(bk, f["qh"], range(8), 1)).astype(xp.uint16)
    values = _take(bk, grid("IQ3S_GRID"), f["qs"].astype(xp.uint16) | (high << 8))
    q = values.reshape(*lead, 32, 8) * _sign_bits(bk, f["signs"])
    ls = _flat(split_bits(bk, f["scales"], (0, 4), 0xF))
    return q.reshape(*lead, 256), _d(bk, f) * _f32(bk, 1 + 2 * ls.astype(xp.int32)), None


def _iq1_q(bk: Backend, index: Array, negative_delta: Array) -> Array:
    """8 · (grid value ± 1/8) as int8 [..., n, 8]; `negative_delta` [..., n] or broadcastable."""
    xp = bk.xp
    g = _take(bk, grid("IQ1S_GRID"), index)
    return 8 * g + xp.where(negative_delta, -1, 1).astype(xp.int8)[..., None]


def _iq1_s(bk: Backend, f: F) -> Parts:
    xp = bk.xp
    qh = f["qh"]  # u16 [..., 8]: per 32 elements 4 × 3 high index bits, a 3-bit scale, the sign
    high = _flat(split_bits(bk, qh, (0, 3, 6, 9), 0x7))
    index = f["qs"].astype(xp.uint16) | (high << 8)  # [..., 32]
    neg = xp.repeat((qh & 0x8000) != 0, 4, axis=-1)
    q = _iq1_q(bk, index, neg)
    ls = _f32(bk, 2 * ((qh >> 12) & 7) + 1)
    return _flat(q), _d(bk, f) * ls * iq_tables.IQ1_DELTA, None


def _iq1_m(bk: Backend, f: F) -> Parts:
    xp = bk.xp
    sc = f["scales"]  # u16 [..., 4]: 4 3-bit sub-scales each, the f16 d in the top nibbles
    top = sc >> 12
    d_bits = top[..., 0:1] | (top[..., 1:2] << 4) | (top[..., 2:3] << 8) | (top[..., 3:4] << 12)
    d = _f32(bk, bk.from_bytes(bk.to_bytes(d_bits.astype(xp.uint16)), "float16"))
    nib = _flat(split_bits(bk, f["qh"], (0, 4), 0xF))  # [..., 32]: one per grid entry
    index = f["qs"].astype(xp.uint16) | ((nib & 7).astype(xp.uint16) << 8)
    q = _iq1_q(bk, index, (nib & 8) != 0)
    ls = _f32(bk, 2 * _flat(split_bits(bk, sc, (0, 3, 6, 9), 0x7)) + 1)  # [..., 16]
    return _flat(q), d * ls * iq_tables.IQ1_DELTA, None


# --- non-linear 4-bit types ------------------------------------------------------------


def _nibbles(bk: Backend, qs: Array, run: int) -> Array:
    """[..., m] bytes in runs of `run`: each run's low nibbles, then its high nibbles."""
    runs = qs.reshape(*qs.shape[:-1], -1, run)
    both = split_bits(bk, runs, (0, 4), 0xF)  # [..., m/run, run, 2]
    return bk.xp.swapaxes(both, -1, -2).reshape(qs.shape[:-1] + (2 * qs.shape[-1],))


def _iq4_nl(bk: Backend, f: F) -> Parts:
    q = _take(bk, np.asarray(iq_tables.IQ4NL_VALUES, np.int8), _nibbles(bk, f["qs"], 16))
    return q, _d(bk, f), None


def _iq4_xs(bk: Backend, f: F) -> Parts:
    xp = bk.xp
    low = _flat(split_bits(bk, f["scales_l"], (0, 4), 0xF))  # [..., 8]
    high = split_bits(bk, f["scales_h"], range(0, 16, 2), 0x3)[..., 0, :]  # [..., 8]
    ls = (low.astype(xp.int32) | (high.astype(xp.int32) << 4)) - 32
    q = _take(bk, np.asarray(iq_tables.IQ4NL_VALUES, np.int8), _nibbles(bk, f["qs"], 16))
    return q, _d(bk, f) * _f32(bk, ls), None


def _e8m0_half(bk: Backend, f: F) -> Array:
    """ggml_e8m0_to_fp32_half: 2^(e - 128) as f32 (subnormal below e = 2): [..., 1]."""
    xp = bk.xp
    e = f["e"].astype(xp.uint32)
    bits = xp.where(e < 2, xp.uint32(0x00200000) << e, (e - 1) << 23).astype(xp.uint32)
    return bk.from_bytes(bk.to_bytes(bits), "float32")


def _mxfp4(bk: Backend, f: F) -> Parts:
    """e8m0 exponent (halved) × e2m1 value (doubled, `MXFP4_VALUES`)."""
    q = _take(bk, np.asarray(iq_tables.MXFP4_VALUES, np.int8), _nibbles(bk, f["qs"], 16))
    return q, _e8m0_half(bk, f), None


# |e2m1 · 2| = m · 2^s for nibble & 7: 0, 1, 2, 3, 4, 6, 8, 12.
_E2M1_M = np.array([0, 1, 1, 3, 1, 3, 1, 3], np.int32)
_E2M1_S = np.array([0, 0, 1, 0, 2, 1, 3, 2], np.int32)


def mxfp4_values(bk: Backend, f: F) -> Array:
    """MXFP4 values as f32 [..., 32], their bits built with integer operations.

    Equal to q · scale of `_mxfp4`, but where that product meets a subnormal (blocks
    whose e < 2, or results below 2^-126) XLA CPU flushes it to zero: the value
    m · 2^(e - 128 + s) is assembled as an IEEE bit pattern instead."""
    xp = bk.xp
    nib = _nibbles(bk, f["qs"], 16).astype(xp.int32)
    m = _take(bk, _E2M1_M, nib & 7)
    p = f["e"].astype(xp.int32) - 128 + _take(bk, _E2M1_S, nib & 7)  # value = m · 2^p
    one, three = m == 1, m == 3
    lead = xp.where(three, p + 1, p)  # the exponent of the leading bit
    normal = xp.where(three, ((lead + 127) << 23) | (1 << 22), (lead + 127) << 23)
    tiny = m << xp.clip(p + 149, 0, 31)  # subnormal: m · 2^-149 · 2^(p + 149)
    mag = xp.where(lead >= -126, normal, tiny)
    mag = xp.where(lead + 127 >= 255, 0x7F800000, mag)
    mag = xp.where(one | three, mag, 0)
    sign = ((nib & 8) != 0) & (mag != 0)
    bits = mag.astype(xp.uint32) | (sign.astype(xp.uint32) << 31)
    return bk.from_bytes(bk.to_bytes(bits), "float32")


# Types whose values need more than q · scale on every backend (see mxfp4_values).
VALUES: dict[GGMLType, Callable[[Backend, F], Array]] = {GGMLType.MXFP4: mxfp4_values}


# --- ternary types ------------------------------------------------------------------


def _trits(bk: Backend, x: Array, powers: Sequence[int]) -> Array:
    """TQ1_0's base-3 digits: byte b holds digit k as ((b·3^k mod 256) · 3) >> 8, in 0..2.
    [..., m] -> [..., len(powers) · m], digit-major."""
    xp = bk.xp
    p = xp.asarray(powers, dtype=xp.uint16)[:, None]
    v = (x[..., None, :].astype(xp.uint16) * p) & 0xFF
    return ((v * 3) >> 8).reshape(*x.shape[:-1], len(powers) * x.shape[-1])


def _tq1_0(bk: Backend, f: F) -> Parts:
    xp, qs = bk.xp, f["qs"]
    digits = xp.concatenate(
        [
            _trits(bk, qs[..., :32], (1, 3, 9, 27, 81)),
            _trits(bk, qs[..., 32:48], (1, 3, 9, 27, 81)),
            _trits(bk, f["qh"], (1, 3, 9, 27)),
        ],
        axis=-1,
    )
    return _i8(bk, digits) - 1, _d(bk, f), None


def _tq2_0(bk: Backend, f: F) -> Parts:
    qs = f["qs"]
    runs = qs.reshape(*qs.shape[:-1], 2, 32)
    q = bk.xp.swapaxes(split_bits(bk, runs, (0, 2, 4, 6), 0x3), -1, -2)  # [..., 2, 4, 32]
    return _i8(bk, q.reshape(*qs.shape[:-1], 256)) - 1, _d(bk, f), None


_T = GGMLType
PARTS: dict[GGMLType, Callable[[Backend, F], Parts]] = {
    _T.IQ2_XXS: _iq2_xxs,
    _T.IQ2_XS: _iq2_xs,
    _T.IQ2_S: _iq2_s,
    _T.IQ3_XXS: _iq3_xxs,
    _T.IQ3_S: _iq3_s,
    _T.IQ1_S: _iq1_s,
    _T.IQ1_M: _iq1_m,
    _T.IQ4_NL: _iq4_nl,
    _T.IQ4_XS: _iq4_xs,
    _T.MXFP4: _mxfp4,
    _T.TQ1_0: _tq1_0,
    _T.TQ2_0: _tq2_0,
}
