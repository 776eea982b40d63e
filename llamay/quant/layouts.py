"""GGUF block layouts: the fields of one block of each GGML type, in byte order.

One table serves every codec in this package. A `BlockLayout` says where each
field of a block sits and how to read it; `unpack` turns a uint8 array of blocks
[..., block_bytes] into named, typed field arrays [..., count], and `pack` does
the reverse. Both work on numpy and on jax arrays through a `Backend`, which
holds the little that differs between the two (reinterpreting bytes as another
dtype, keeping the compiler from rewriting a division).

How the quant bits map to values (element `o` of a block; see `formulas.py`):

- Q4_0/Q4_1: `qs[j]` low nibble is element j, high nibble element j+16.
- Q5_0/Q5_1: as Q4, plus bit o of the little-endian `qh` word is bit 4 of element o.
- Q8_0/Q8_K: `qs[o]` as int8. (Q8_1 is left out: it never occurs in files, and
  `BLOCK_SIZES` still gives its old 40-byte layout while ggml's block is now 36.)
- Q2_K: o = 128n + 32j + l takes bits 2j..2j+1 of `qs[32n + l]`; 16 sub-blocks of
  16 with `scales[o // 16]` (low nibble scale, high nibble min).
- Q3_K: low 2 bits as Q2_K; bit (4n + j) of `hmask[l]` set means "no -4 offset";
  16 six-bit signed scales (-32) packed as 8 low-nibble bytes + 4 high-2-bit bytes.
- Q4_K: o = 64n + 32h + l takes nibble h of `qs[32n + l]`; 8 sub-blocks of 32 with
  6-bit scale and min packed in 12 bytes.
- Q5_K: as Q4_K, plus bit (o // 32) of `qh[o % 32]` is bit 4.
- Q6_K: o = 128n + 32j + l takes nibble (j // 2) of `ql[64n + 32(j % 2) + l]` and bits
  2j..2j+1 of `qh[32n + l]`, minus 32; 16 int8 scales, one per 16 elements.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from llamay.errors import UnsupportedTensorTypeError
from llamay.gguf.constants import BLOCK_SIZES, GGMLType

Array = Any  # numpy.ndarray or jax.Array


@dataclass(frozen=True)
class Backend:
    """An array namespace plus what differs between numpy and jax.

    `from_bytes(u8 [..., k * itemsize], dtype) -> dtype [..., k]` and
    `to_bytes(x [..., k]) -> u8 [..., k * itemsize]`, little-endian;
    `opaque(x)` hides a value from the compiler's algebraic rewrites (XLA turns
    `a / broadcast(c)` into `a * (1/c)`, which is not IEEE division);
    `f16_keeps_nan_payload`: whether f16 -> f32 conversion keeps signalling NaNs as
    they are (numpy does, XLA quiets them).
    """

    xp: ModuleType
    from_bytes: Callable[[Array, Any], Array]
    to_bytes: Callable[[Array], Array]
    opaque: Callable[[Array], Array]
    f16_keeps_nan_payload: bool


@dataclass(frozen=True)
class Field:
    name: str
    dtype: str  # numpy dtype name of one item, read little-endian
    count: int

    @property
    def nbytes(self) -> int:
        return np.dtype(self.dtype).itemsize * self.count


@dataclass(frozen=True)
class BlockLayout:
    ggml_type: GGMLType
    block_elems: int
    block_bytes: int
    fields: tuple[Field, ...]

    def __post_init__(self) -> None:
        assert sum(f.nbytes for f in self.fields) == self.block_bytes, self.ggml_type

    def unpack(self, bk: Backend, blocks: Array) -> dict[str, Array]:
        """uint8 [..., block_bytes] -> {field name: dtype [..., count]}."""
        out, pos = {}, 0
        for f in self.fields:
            raw = blocks[..., pos : pos + f.nbytes]
            out[f.name] = raw if f.dtype == "uint8" else bk.from_bytes(raw, f.dtype)
            pos += f.nbytes
        return out

    def pack(self, bk: Backend, values: dict[str, Array]) -> Array:
        """{field name: array [..., count] of the field's dtype} -> uint8 [..., block_bytes]."""
        parts = []
        for f in self.fields:
            v = bk.xp.asarray(values[f.name]).astype(f.dtype)
            parts.append(v if f.dtype == "uint8" else bk.to_bytes(v))
        return bk.xp.concatenate(parts, axis=-1)


_DTYPES = {"u8": "uint8", "i8": "int8", "u16": "uint16", "i16": "int16", "u32": "uint32"}
_DTYPES |= {"f16": "float16", "f32": "float32"}

# Fields in byte order, as "name:dtype[*count]" (ggml's block_* structs).
_SPECS: dict[GGMLType, str] = {
    GGMLType.F32: "x:f32",
    GGMLType.F16: "x:f16",
    GGMLType.BF16: "x:u16",
    GGMLType.Q4_0: "d:f16 qs:u8*16",
    GGMLType.Q4_1: "d:f16 m:f16 qs:u8*16",
    GGMLType.Q5_0: "d:f16 qh:u8*4 qs:u8*16",
    GGMLType.Q5_1: "d:f16 m:f16 qh:u8*4 qs:u8*16",
    GGMLType.Q8_0: "d:f16 qs:i8*32",
    GGMLType.Q2_K: "scales:u8*16 qs:u8*64 d:f16 dmin:f16",
    GGMLType.Q3_K: "hmask:u8*32 qs:u8*64 scales:u8*12 d:f16",
    GGMLType.Q4_K: "d:f16 dmin:f16 scales:u8*12 qs:u8*128",
    GGMLType.Q5_K: "d:f16 dmin:f16 scales:u8*12 qh:u8*32 qs:u8*128",
    GGMLType.Q6_K: "ql:u8*128 qh:u8*64 scales:i8*16 d:f16",
    GGMLType.Q8_K: "d:f32 qs:i8*256 bsums:i16*16",
    # i-quants, ternary and MXFP4 (formulas in iquants.py)
    GGMLType.IQ2_XXS: "d:f16 qs:u32*16",
    GGMLType.IQ2_XS: "d:f16 qs:u16*32 scales:u8*8",
    GGMLType.IQ2_S: "d:f16 qs:u8*32 signs:u8*32 qh:u8*8 scales:u8*8",
    GGMLType.IQ3_XXS: "d:f16 qs:u8*64 scales:u32*8",
    GGMLType.IQ3_S: "d:f16 qs:u8*64 qh:u8*8 signs:u8*32 scales:u8*4",
    GGMLType.IQ1_S: "d:f16 qs:u8*32 qh:u16*8",
    GGMLType.IQ1_M: "qs:u8*32 qh:u8*16 scales:u16*4",
    GGMLType.IQ4_NL: "d:f16 qs:u8*16",
    GGMLType.IQ4_XS: "d:f16 scales_h:u16 scales_l:u8*4 qs:u8*128",
    GGMLType.MXFP4: "e:u8 qs:u8*16",
    GGMLType.TQ1_0: "qs:u8*48 qh:u8*4 d:f16",
    GGMLType.TQ2_0: "qs:u8*64 d:f16",
}


def _field(spec: str) -> Field:
    name, _, typ = spec.partition(":")
    typ, _, count = typ.partition("*")
    return Field(name, _DTYPES[typ], int(count or 1))


def _layout(t: GGMLType, spec: str) -> BlockLayout:
    elems, nbytes = BLOCK_SIZES[t]
    return BlockLayout(t, elems, nbytes, tuple(_field(f) for f in spec.split()))


LAYOUTS: dict[GGMLType, BlockLayout] = {t: _layout(t, spec) for t, spec in _SPECS.items()}


def layout_of(ggml_type: GGMLType | int) -> BlockLayout:
    """The layout of a type llamay can (de)quantise, or UnsupportedTensorTypeError."""
    try:
        t = GGMLType(ggml_type)
    except ValueError:
        raise UnsupportedTensorTypeError(f"unknown GGML tensor type code {ggml_type!r}") from None
    lay = LAYOUTS.get(t)
    if lay is None:
        supported = ", ".join(t.name for t in LAYOUTS)
        raise UnsupportedTensorTypeError(
            f"GGML tensor type {t.name} is not supported by llamay (supported: {supported}); "
            "re-quantise the model to one of these types"
        )
    return lay


def blocks_of(bk: Backend, raw: Array, lay: BlockLayout) -> Array:
    """uint8 [..., row_bytes] -> uint8 [..., n_blocks, block_bytes]."""
    row_bytes = raw.shape[-1]
    if row_bytes % lay.block_bytes:
        raise ValueError(
            f"{lay.ggml_type.name} row of {row_bytes} bytes is not a whole number of "
            f"{lay.block_bytes}-byte blocks"
        )
    return raw.reshape(*raw.shape[:-1], row_bytes // lay.block_bytes, lay.block_bytes)


# --- the two backends ------------------------------------------------------------------


def _np_from_bytes(raw: np.ndarray, dtype) -> np.ndarray:
    return np.ascontiguousarray(raw).view(np.dtype(dtype).newbyteorder("<"))


def _np_to_bytes(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x)
    return x.astype(x.dtype.newbyteorder("<"), copy=False).view(np.uint8)


NUMPY = Backend(np, _np_from_bytes, _np_to_bytes, lambda x: x, True)


@functools.cache
def jax_backend() -> Backend:
    """The jax.numpy backend (imported lazily: numpy users need no jax)."""
    import jax.numpy as jnp
    from jax import lax

    def from_bytes(raw, dtype):
        dtype = jnp.dtype(dtype)
        if dtype.itemsize == 1:
            return lax.bitcast_convert_type(raw, dtype)
        k = raw.shape[-1] // dtype.itemsize
        return lax.bitcast_convert_type(raw.reshape(*raw.shape[:-1], k, dtype.itemsize), dtype)

    def to_bytes(x):
        b = lax.bitcast_convert_type(x, jnp.uint8)
        return b.reshape(*x.shape[:-1], -1) if x.dtype.itemsize > 1 else b

    return Backend(jnp, from_bytes, to_bytes, lax.optimization_barrier, False)
