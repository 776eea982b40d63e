"""Numpy quantisation of float rows into GGUF blocks (for writing GGUF files and tests).

Byte-equal to gguf-py's `gguf.quants.quantize`, which reproduces ggml's reference
quantisers (`quantize_row_*_ref`) for these types. K-quants are not offered:
ggml's K-quant search is not something gguf-py (our oracle) implements either.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from llamay.errors import UnsupportedTensorTypeError
from llamay.gguf.constants import GGMLType
from llamay.quant.formulas import bit_pack, nibble_pack, q8_quants, signed_absmax
from llamay.quant.layouts import LAYOUTS, NUMPY, Array, Backend, jax_backend
from llamay.quant.np_dequant import map_blocks

if TYPE_CHECKING:
    import jax

Fields = dict[str, np.ndarray]


def _inverse(bk: Backend, d: Array) -> Array:
    xp = bk.xp
    safe = xp.where(d == 0, xp.ones_like(d), d)
    return xp.where(d == 0, xp.zeros_like(d), 1 / bk.opaque(safe))


def _levels(bk: Backend, v: Array, top: int) -> Array:
    """C's `(uint8_t)(v)` then MIN(top, .): truncation toward zero, clamped."""
    xp = bk.xp
    return xp.minimum(xp.trunc(v).astype(xp.uint8), xp.uint8(top))


def _symmetric(bk: Backend, x: Array, levels: int) -> tuple[Array, Array]:
    """Q4_0/Q5_0: scale from the signed max, quants offset by levels/2."""
    d = signed_absmax(bk, x) / bk.opaque(bk.xp.full_like(x[..., :1], -(levels // 2)))
    xid = bk.opaque(x * _inverse(bk, d))  # one rounding, then the add (no contraction)
    return d, _levels(bk, xid + np.float32(levels // 2 + 0.5), levels - 1)


def _affine(bk: Backend, x: Array, levels: int) -> tuple[Array, Array, Array]:
    """Q4_1/Q5_1: scale and min from the range."""
    lo, hi = x.min(axis=-1, keepdims=True), x.max(axis=-1, keepdims=True)
    d = (hi - lo) / bk.opaque(bk.xp.full_like(lo, levels - 1))
    xid = bk.opaque((x - lo) * _inverse(bk, d))
    return d, lo, _levels(bk, xid + np.float32(0.5), levels - 1)


def _q4_0(bk: Backend, x: Array) -> Fields:
    d, q = _symmetric(bk, x, 16)
    return {"d": d, "qs": nibble_pack(q)}


def _q4_1(bk: Backend, x: Array) -> Fields:
    d, m, q = _affine(bk, x, 16)
    return {"d": d, "m": m, "qs": nibble_pack(q)}


def _q5_0(bk: Backend, x: Array) -> Fields:
    d, q = _symmetric(bk, x, 32)
    return {"d": d, "qh": bit_pack(bk, q >> 4), "qs": nibble_pack(q)}


def _q5_1(bk: Backend, x: Array) -> Fields:
    d, m, q = _affine(bk, x, 32)
    return {"d": d, "m": m, "qh": bit_pack(bk, q >> 4), "qs": nibble_pack(q)}


def _q8_0(bk: Backend, x: Array, variant: str = "ref") -> Fields:
    qs, d = q8_quants(bk, x, variant)
    return {"d": d, "qs": qs}


def _bf16(bk: Backend, x: Array) -> Fields:
    """ggml_compute_fp32_to_bf16: NaNs made quiet, otherwise round to nearest even."""
    n = x.view(np.uint32)
    n = np.where((n & 0x7FFFFFFF) > 0x7F800000, (n & 0xFFFF0000) | (64 << 16), n)
    n = (n.astype(np.uint64) + (0x7FFF + ((n >> 16) & 1))) >> 16
    return {"x": n.astype(np.uint16)}


_QUANTIZERS: dict[GGMLType, Callable[..., Fields]] = {
    GGMLType.F32: lambda bk, x: {"x": x},
    GGMLType.F16: lambda bk, x: {"x": x},
    GGMLType.BF16: _bf16,
    GGMLType.Q4_0: _q4_0,
    GGMLType.Q4_1: _q4_1,
    GGMLType.Q5_0: _q5_0,
    GGMLType.Q5_1: _q5_1,
    GGMLType.Q8_0: _q8_0,
}
# The 32-element block types `quantize_jnp` writes (a quantised KV cache's types).
JNP_TYPES = (GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0)


def quantize_jnp(x: jax.Array, ggml_type: GGMLType | int, q8_variant: str = "ref") -> jax.Array:
    """`quantize` in jnp, for use inside jit: float [..., n] -> uint8 [..., row_bytes] for
    the block types of `JNP_TYPES` (the same formulas; `q8_variant` picks which of ggml's
    Q8_0 quantisers, `formulas.q8_quants`). `ggml_type` must be static."""
    import jax.numpy as jnp

    t = GGMLType(ggml_type)
    if t not in JNP_TYPES:
        raise UnsupportedTensorTypeError(
            f"no jnp quantiser for GGML type {t.name} (there is one for "
            f"{', '.join(u.name for u in JNP_TYPES)})"
        )
    lay, bk = LAYOUTS[t], jax_backend()
    if x.shape[-1] % lay.block_elems:
        raise ValueError(f"cannot quantise shape {x.shape} to {t.name}: the last dim must be "
                         f"a multiple of {lay.block_elems}")  # fmt: skip
    blocks = x.astype(jnp.float32).reshape(*x.shape[:-1], -1, lay.block_elems)
    fields = _q8_0(bk, blocks, q8_variant) if t == GGMLType.Q8_0 else _QUANTIZERS[t](bk, blocks)
    return lay.pack(bk, fields).reshape(*x.shape[:-1], -1)


def quantize(x: np.ndarray, ggml_type: GGMLType | int) -> np.ndarray:
    """float32 [..., n_cols] -> uint8 [..., row_bytes] in `ggml_type`'s block layout.

    n_cols must be a multiple of the type's block size. Raises
    UnsupportedTensorTypeError for types without a quantiser here.
    """
    try:
        t = GGMLType(ggml_type)
        fn = _QUANTIZERS[t]
    except (ValueError, KeyError):
        names = ", ".join(t.name for t in _QUANTIZERS)
        raise UnsupportedTensorTypeError(
            f"llamay cannot quantise to GGML type {ggml_type!r} (it can: {names})"
        ) from None
    lay = LAYOUTS[t]
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 0 or x.shape[-1] % lay.block_elems:
        raise ValueError(
            f"cannot quantise shape {x.shape} to {t.name}: the last dim must be a "
            f"multiple of {lay.block_elems}"
        )
    blocks = x.reshape(*x.shape[:-1], -1, lay.block_elems)
    out = map_blocks(lambda b: lay.pack(NUMPY, fn(NUMPY, b)), blocks, lay.block_bytes, np.uint8)
    return out.reshape(*x.shape[:-1], -1)


def random_blocks(
    ggml_type: GGMLType, rows: int, cols: int, seed: int = 0, scales=(-0.1, 0.1)
) -> np.ndarray:
    """GGUF bytes [rows, row_bytes] of a random well-formed weight (for tests and benches):
    every quant bit pattern, float fields (scales, mins) uniform in `scales`; float types
    are N(0, 0.02)."""
    rng = np.random.default_rng(seed)
    lay = LAYOUTS[ggml_type]
    if ggml_type in (GGMLType.F16, GGMLType.F32):
        values = rng.standard_normal((rows, cols)) * 0.02
        return values.astype(lay.fields[0].dtype).view(np.uint8)
    n_blocks = cols // lay.block_elems
    raw = rng.integers(0, 256, (rows, n_blocks, lay.block_bytes), dtype=np.uint8)
    pos = 0
    for f in lay.fields:
        if f.dtype in ("float16", "float32"):
            vals = rng.uniform(*scales, (rows, n_blocks, f.count)).astype(f.dtype)
            raw[..., pos : pos + f.nbytes] = vals.view(np.uint8)
        pos += f.nbytes
    return raw.reshape(rows, -1)
