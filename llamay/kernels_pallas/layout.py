"""The kernel weight layout: GGUF blocks repacked into planes a Pallas tile can dequantise.

A GGUF row interleaves f16 scales with packed quants every 18..210 bytes, which no
vector unit can slice. `repack(qtensor)` turns a [..., N, K] weight (N rows, K cols)
into `PackedWeight`, transposed so that N (the output dim) is the dense last dim
(TPU lanes / GPU threads) and every tile of K rows is a plain 2-D slab:

- `q`: the low bits. 8-bit types (Q8_0): int8 [..., K, N], row k = element k.
  4/5/6-bit types: uint8 [..., K/2, N] nibbles; for each 32-element group g, rows
  16g..16g+15 hold elements 32g+j (low nibble) and 32g+16+j (high nibble), j < 16.
- `high`: the bits above the nibble (5-bit: 1, 6-bit: 2), uint32 [..., (K/32)·hb, N]:
  group g's hb words are rows g·hb..g·hb+hb-1, and element e of the group sits at
  bit hb·e of those words read as one little-endian (32·hb)-bit integer. None for
  4- and 8-bit types.
- `scale`: f32 [..., K/G, N], one per group of G = 32 elements (16 for Q6_K): the
  exact f32 product of the block's f16 d and its sub-block scale.
- `offset`: f32 [..., K/32, N] or None: what a group adds (Q4_1/Q5_1: m; Q4_K/Q5_K:
  -dmin·min, exact), so that value = (q - zero)·scale + offset.

The non-linear 4-bit types (IQ4_NL, IQ4_XS, MXFP4) keep their nibbles as indices into a
16-entry codebook (`Format.codebook`, from llamay.quant.iq_tables: ggml's kvalues, e2m1
doubled), looked up in-kernel by a tree of 15 selects (no gather: elementwise on every
Pallas backend), so that value = codebook[q]·scale; scale is IQ4_NL's d, IQ4_XS's exact
d·(ls - 32) (the product ggml rounds first), MXFP4's e8m0 exponent halved (bit-built).
The other i-quants and TQ1_0/TQ2_0 take the 8-bit plane (`INT8_TYPES`).

Every value equals llamay.quant's (and gguf-py's) dequantisation bit for bit: the
products are the same exact f32 products, the one rounding is the same final add.
Bytes per element (Q4_0: 5 bits vs 4.5 in GGUF; Q4_K: 6 vs 4.5; Q6_K: 8 vs 6.56):
the f32 scales cost bandwidth but keep the kernel's dequantisation one multiply-add.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import jax
import jax.numpy as jnp

from llamay.errors import UnsupportedTensorTypeError
from llamay.gguf.constants import GGMLType
from llamay.quant import QTensor, iq_tables, iquants, layout_of
from llamay.quant.formulas import q4k_scales_mins, unpack_bits
from llamay.quant.layouts import blocks_of, jax_backend
from llamay.quant.matrix import Matrix, SpecFn

F32 = jnp.float32
_T = GGMLType


@dataclass(frozen=True)
class Format:
    """How a GGML type's values are rebuilt from the planes: value = (q - zero)·scale + offset."""

    bits: int  # 4, 5, 6 or 8
    zero: int
    group: int  # elements per scale: 32, or 16 (Q6_K)
    has_offset: bool
    codebook: tuple[int, ...] | None = None  # nibble -> integer value (IQ4_NL, MXFP4)

    @property
    def high_bits(self) -> int:
        return self.bits - 4 if self.bits < 8 else 0


FORMATS: dict[GGMLType, Format] = {
    _T.Q8_0: Format(8, 0, 32, False),
    _T.Q4_0: Format(4, 8, 32, False),
    _T.Q4_1: Format(4, 0, 32, True),
    _T.Q5_0: Format(5, 16, 32, False),
    _T.Q5_1: Format(5, 0, 32, True),
    _T.Q4_K: Format(4, 0, 32, True),
    _T.Q5_K: Format(5, 0, 32, True),
    _T.Q6_K: Format(6, 32, 16, False),
    _T.IQ4_NL: Format(4, 0, 32, False, iq_tables.IQ4NL_VALUES),
    _T.IQ4_XS: Format(4, 0, 32, False, iq_tables.IQ4NL_VALUES),
    _T.MXFP4: Format(4, 0, 32, False, iq_tables.MXFP4_VALUES),
}
CODEBOOK_TYPES = frozenset(t for t, f in FORMATS.items() if f.codebook is not None)
# The grid i-quants and the ternary types: their int8 quants (iquants' affine parts: grid
# value × sign, IQ1's 8·grid ± 1, trit - 1) in the 8-bit plane, one f32 scale per 32 or
# 16 elements (TQ's one d per 256 repeated per 32): 8 bits a weight in the kernel layout
# (the GGUF blocks have 1.56-3.44), dequantised in-kernel as q·scale, bit-exact.
INT8_TYPES = {
    _T.IQ2_XXS: 32, _T.IQ2_XS: 16, _T.IQ2_S: 16, _T.IQ3_XXS: 32, _T.IQ3_S: 32,
    _T.IQ1_S: 32, _T.IQ1_M: 16, _T.TQ1_0: 32, _T.TQ2_0: 32,
}  # fmt: skip
FORMATS.update({t: Format(8, 0, group, False) for t, group in INT8_TYPES.items()})
KERNEL_TYPES = frozenset(FORMATS)


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class PackedWeight(Matrix):
    """A weight in the kernel layout (module docstring), exact numerics; leading dims
    (stacked layers) are allowed and slice like a QTensor's. The matrix protocol
    (`llamay.quant.matrix`)."""

    q: jax.Array
    high: jax.Array | None
    scale: jax.Array
    offset: jax.Array | None
    ggml_type: GGMLType = field(metadata=dict(static=True))
    cols: int = field(metadata=dict(static=True))

    @property
    def fmt(self) -> Format:
        return FORMATS[self.ggml_type]

    @property
    def numerics(self) -> str:
        return "exact"

    @property
    def n_rows(self) -> int:
        return self.q.shape[-1]

    @property
    def shape(self) -> tuple[int, ...]:
        """The logical weight shape [..., N, K] (as QTensor.shape)."""
        return (*self.q.shape[:-2], self.n_rows, self.cols)

    def _planes(self, f) -> PackedWeight:
        """f applied to every plane (None stays None)."""

        def one(a):
            return None if a is None else f(a)

        return PackedWeight(
            one(self.q), one(self.high), one(self.scale), one(self.offset),
            self.ggml_type, self.cols,
        )  # fmt: skip

    def layer(self, index: jax.Array) -> PackedWeight:
        """One entry of a stacked [L, ...] weight by a traced index (as QTensor.layer)."""
        return self._planes(lambda a: jax.lax.dynamic_index_in_dim(a, index, keepdims=False))

    def rows(self, ids: jax.Array, dtype=F32) -> jax.Array:
        """Only the rows `ids` (2-D weights): their columns of every plane, dequantised."""
        flat = self._planes(lambda a: jnp.take(a, ids.reshape(-1), axis=-1))
        return dequantize_packed(flat).astype(dtype).reshape(*ids.shape, self.cols)

    def dequantize(self, dtype=F32) -> jax.Array:
        return dequantize_packed(self).astype(dtype)

    def partition_specs(self, spec: SpecFn) -> PackedWeight:
        """Transposed: rows on axis -1 of every plane, columns in 32-element groups on -2."""
        s = spec(self.n_rows, self.cols // 32, self.q.ndim, True)
        return self._planes(lambda a: s)


def _fields(w: QTensor) -> dict[str, jax.Array]:
    bk = jax_backend()
    lay = layout_of(w.ggml_type)
    return lay.unpack(bk, blocks_of(bk, w.data, lay))


def _quants(w: QTensor) -> tuple[jax.Array, jax.Array, jax.Array | None]:
    """(q uint8/int8 [..., N, K] in element order, scale f32 [..., N, K/G],
    offset f32 [..., N, K/32] or None) for a type in FORMATS."""
    t, bk = w.ggml_type, jax_backend()
    f = _fields(w)
    lead = f["qs" if "qs" in f else "ql"].shape[:-1]  # [..., N, n_blocks]
    flat = (*lead[:-1], w.cols)

    def nibbles(qs):  # [.., 16] -> [.., 32]: low nibbles then high nibbles
        return unpack_bits(bk, qs, (0, 4), 0xF, -2).reshape(*qs.shape[:-1], 32)

    def bits(x):  # [.., n] -> [.., 8n]: bit i of the little-endian word at index i
        return unpack_bits(bk, x, range(8), 1, -1).reshape(*x.shape[:-1], 8 * x.shape[-1])

    def planes(x, shifts, mask):  # K-quant order: 32-byte runs, one run of values per shift
        runs = x.reshape(*x.shape[:-1], -1, 32)
        return unpack_bits(bk, runs, shifts, mask, -2).reshape(*x.shape[:-1], -1)

    if t in INT8_TYPES:  # iquants' int8 quants and scales, the scales per group
        q, scale, _ = iquants.PARTS[t](bk, f)  # [..., N, nb, 256], [..., N, nb, subs]
        per = 256 // scale.shape[-1]
        if per > INT8_TYPES[t]:
            scale = jnp.repeat(scale, per // INT8_TYPES[t], axis=-1)
        return q.reshape(flat), scale.reshape(*lead[:-1], -1), None
    if t in CODEBOOK_TYPES:  # nibble indices in 16-byte runs; iquants' scales
        qs = f["qs"]
        q = nibbles(qs.reshape(*qs.shape[:-1], -1, 16)).reshape(flat)
        scale = iquants.PARTS[t](bk, f)[1]  # [..., N, n_blocks, 1 or 8]
        return q, scale.reshape(*lead[:-1], -1), None

    d = f["d"][..., 0].astype(F32) if t != _T.Q6_K else f["d"].astype(F32)
    offset = None
    if t == _T.Q8_0:
        q, scale = f["qs"], d
    elif t in (_T.Q4_0, _T.Q4_1, _T.Q5_0, _T.Q5_1):
        q = nibbles(f["qs"])
        if t in (_T.Q5_0, _T.Q5_1):
            q = q | (bits(f["qh"]) << 4)
        scale = d
        offset = f["m"][..., 0].astype(F32) if "m" in f else None
    elif t in (_T.Q4_K, _T.Q5_K):
        q = planes(f["qs"], (0, 4), 0xF)
        if t == _T.Q5_K:
            q = q | (unpack_bits(bk, f["qh"], range(8), 1, -2).reshape(q.shape) << 4)
        sc, mn = q4k_scales_mins(bk, f["scales"])
        scale = d[..., None] * sc.astype(F32)  # exact: f16 × 6-bit
        offset = -(f["dmin"].astype(F32) * mn.astype(F32))  # exact
    else:  # Q6_K
        ql = f["ql"]
        low = unpack_bits(bk, ql.reshape(*lead, 2, 2, 32), (0, 4), 0xF, -3)
        q = low.reshape(*lead, 256) | (planes(f["qh"], (0, 2, 4, 6), 0x3) << 4)
        scale = d * f["scales"].astype(F32)  # exact: f16 × int8
    q = q.reshape(flat)
    scale = scale.reshape(*lead[:-1], -1)
    offset = None if offset is None else offset.reshape(*lead[:-1], -1)
    return q, scale, offset


def _t(x: jax.Array) -> jax.Array:
    return jnp.swapaxes(x, -1, -2)


def repack(w: QTensor) -> PackedWeight:
    """A QTensor [..., N, K] of a type in KERNEL_TYPES, in the kernel layout (one compiled
    program: call it once at load, or inside jit to repack lazily)."""
    t = GGMLType(w.ggml_type)
    if t not in FORMATS:
        names = ", ".join(sorted(k.name for k in FORMATS))
        raise UnsupportedTensorTypeError(
            f"no Pallas matmul kernel for GGML type {t.name} (kernels: {names}); "
            "use llamay.quant.qmatmul"
        )
    return _repack(w)


@jax.jit
def _repack(w: QTensor) -> PackedWeight:
    t = GGMLType(w.ggml_type)
    fmt = FORMATS[t]
    q, scale, offset = _quants(w)
    lead, K = q.shape[:-1], q.shape[-1]
    high = None
    if fmt.bits == 8:
        low = q.astype(jnp.int8)
    else:
        nib = (q & 0xF).reshape(*lead, K // 32, 2, 16)
        low = (nib[..., 0, :] | (nib[..., 1, :] << 4)).reshape(*lead, K // 2)
        if fmt.high_bits:
            hb = fmt.high_bits
            per_word = 32 // hb
            h = (q >> 4).astype(jnp.uint32).reshape(*lead, K // 32 * hb, per_word)
            shifts = hb * jnp.arange(per_word, dtype=jnp.uint32)
            high = _t(jnp.sum(h << shifts, axis=-1, dtype=jnp.uint32))
    return PackedWeight(
        q=_t(low),
        high=high,
        scale=_t(scale),
        offset=None if offset is None else _t(offset),
        ggml_type=t,
        cols=w.cols,
    )


def dequantize_tile(
    q: jax.Array,
    high: jax.Array | None,
    scale: jax.Array,
    offset: jax.Array | None,
    fmt: Format,
) -> jax.Array:
    """The f32 weight tile [k, n] (k a multiple of 32) from its planes' rows: q [k or k/2, n],
    high [(k/32)·hb, n], scale [k/G, n], offset [k/32, n]. Shared by the Pallas kernels (on
    values loaded from their refs) and `dequantize_packed`; only elementwise ops,
    broadcasts and reshapes of leading (row-group) dims."""
    ints = integer_tile(q, high, fmt)  # [k, n] int32, q - zero
    k, n = ints.shape
    g = k // 32
    s = jnp.broadcast_to(scale.reshape(k // fmt.group, 1, n), (k // fmt.group, fmt.group, n))
    w = ints.astype(F32) * s.reshape(k, n)
    if offset is not None:
        w = (w.reshape(g, 32, n) + offset.reshape(g, 1, n)).reshape(k, n)
    return w


def codebook_lookup(v: jax.Array, table: tuple[int, ...]) -> jax.Array:
    """table[v] for int32 v in 0..15, as int32: a tree of 15 selects over v's 4 bits (no
    gather, which Triton and Mosaic do not lower for a tile)."""
    vals = [jnp.int32(c) for c in table]
    for bit in range(4):
        on = ((v >> bit) & 1) == 1
        vals = [jnp.where(on, vals[2 * i + 1], vals[2 * i]) for i in range(len(vals) // 2)]
    return jnp.broadcast_to(vals[0], v.shape)


def integer_tile(q: jax.Array, high: jax.Array | None, fmt: Format) -> jax.Array:
    """q - zero (codebook types: codebook[q]) as int32 [k, n] from the quant planes' rows
    (see `dequantize_tile`)."""
    if fmt.bits == 8:
        return q.astype(jnp.int32) - fmt.zero
    b = q.astype(jnp.int32)
    half, n = b.shape
    g = half // 16
    # nibble h of the 16 bytes of group g -> elements 16h..16h+15: a broadcast shift,
    # not a concatenate (Triton concatenates only along the last dim)
    shifts = 4 * jax.lax.broadcasted_iota(jnp.int32, (1, 2, 1, 1), 1)
    v = ((b.reshape(g, 1, 16, n) >> shifts) & 0xF).reshape(g, 32, n)
    if high is not None:
        hb = fmt.high_bits
        per_word = 32 // hb
        words = high.astype(jnp.uint32).reshape(g, hb, 1, n)
        shifts = (hb * jnp.arange(per_word, dtype=jnp.uint32)).reshape(1, 1, per_word, 1)
        hv = ((words >> shifts) & ((1 << hb) - 1)).astype(jnp.int32).reshape(g, 32, n)
        v = v | (hv << 4)
    if fmt.codebook is not None:
        return codebook_lookup(v, fmt.codebook).reshape(2 * half, n)
    return v.reshape(2 * half, n) - fmt.zero


def dequantize_packed(w: PackedWeight) -> jax.Array:
    """The whole weight [N, K] in f32 from the kernel layout (2-D only): the repack's
    round trip, held to gguf-py's dequantisation in the tests."""
    if w.q.ndim != 2:
        raise ValueError(f"dequantize_packed takes a 2-D weight, not shape {w.shape}")
    return dequantize_tile(w.q, w.high, w.scale, w.offset, w.fmt).T
