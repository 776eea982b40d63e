"""Exact-numerics matmuls laid out for XLA's CPU backend, and the weight layout they read.

XLA CPU does not fuse a dequantisation into a dot: it writes the f32 weight to a
temporary, then runs the dot over it. What is fast there (bench/qmatmul_cpu.py):

- the dequantisation reading plain int8 quants and f32 scales (`AffineQTensor`,
  repacked once at load) instead of GGUF's interleaved blocks: one convert and one
  multiply-add per element, fully vectorised (≈ 8x faster than the GGUF blocks at
  batch 1);
- f32 temporaries that stay in cache: a big matrix (an LM head of 49152 x 576) is
  dequantised and multiplied in row chunks under a loop (≈ 30x faster than one
  113 MB temporary, which XLA also maps fresh on every call).

Formulations that lost (kept in the bench): block-reduce Σ_b d_b (x_b·q_b) + m_b Σ x_b
as a batched dot or a fused reduce; a column reduce over transposed weights; nibble
planes unpacked in the fusion; scales packed into the quant rows; an f32 dense weight
(bandwidth-bound at 4 bytes per weight).

Numerics stay exact (design principle 8): the weight values are those of
`QTensor.dequantize` bit for bit (q·scale + offset, both products exact in f32), and
the dot accumulates in f32; only the summation order is the dot's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np

from llamay.gguf.constants import GGMLType
from llamay.quant.formulas import AFFINE, affine_parts, affine_values
from llamay.quant.layouts import NUMPY, blocks_of, jax_backend, layout_of
from llamay.quant.matrix import Matrix, SpecFn

# A dequantised weight chunk of at most this many elements (4 MiB of f32) stays in
# the CPU's caches between its dequantisation and its dot.
CHUNK_ELEMS = 1 << 20


def repackable(ggml_type: GGMLType | int) -> bool:
    """Whether a GGML type has the affine int8 form `AffineQTensor` holds."""
    return GGMLType(ggml_type) in AFFINE


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class AffineQTensor(Matrix):
    """A quantised weight repacked at load for CPU matmuls: value = q · scale + offset.

    q int8 [..., rows, cols]; scale and offset f32 [..., rows, cols // group] (offset
    None for types without one). `ggml_type` is the file's type (static): what the
    values are, not how they are stored. The matrix protocol (`matrix`), exact numerics.
    """

    q: jax.Array
    scale: jax.Array
    offset: jax.Array | None
    ggml_type: GGMLType = field(metadata=dict(static=True))
    numerics: str = field(default="exact", metadata=dict(static=True))

    def __post_init__(self) -> None:
        if self.numerics != "exact":
            raise ValueError(
                "AffineQTensor computes in exact numerics only; keep the GGUF blocks "
                f"(QTensor) for numerics={self.numerics!r}"
            )

    @property
    def cols(self) -> int:
        return self.q.shape[-1]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.q.shape)

    @staticmethod
    def from_raw(raw: np.ndarray, ggml_type: GGMLType | int) -> AffineQTensor:
        """Repack uint8 GGUF blocks [..., row_bytes] (host side, in bounded chunks)."""
        q, scale, offset = repack(raw, ggml_type)
        # device_put: jnp.asarray(ndarray) compiles an identity program per shape (jax 0.12)
        q, scale, offset = jax.device_put((q, scale, offset))
        return AffineQTensor(q, scale, offset, GGMLType(ggml_type), "exact")

    def dequantize(self, dtype=jnp.float32) -> jax.Array:
        """All of it: [..., rows, cols] in `dtype` (bit-equal to `QTensor.dequantize`)."""
        return affine_values(jax_backend(), self.q, self.scale, self.offset).astype(dtype)

    def rows(self, ids: jax.Array, dtype=jnp.float32) -> jax.Array:
        """Only the rows `ids` (embedding lookup): [*ids.shape, cols]."""

        def take(a):
            return None if a is None else jnp.take(a, ids, axis=-2)

        rows = affine_values(jax_backend(), take(self.q), take(self.scale), take(self.offset))
        return rows.astype(dtype)

    def layer(self, index: jax.Array) -> AffineQTensor:
        """One entry of a stacked [L, rows, cols] tensor by a traced index."""

        def one(a):
            return None if a is None else jax.lax.dynamic_index_in_dim(a, index, keepdims=False)

        return AffineQTensor(
            one(self.q), one(self.scale), one(self.offset), self.ggml_type, self.numerics
        )

    def partition_specs(self, spec: SpecFn) -> AffineQTensor:
        """Quants, scales and offsets share their row and scale-group splits."""
        s = spec(self.q.shape[-2], self.scale.shape[-1], self.q.ndim, False)
        return AffineQTensor(s, s, None if self.offset is None else s, self.ggml_type)

    def round_activations(self, x: jax.Array) -> jax.Array:
        return x.astype(jnp.float32)


def repack(raw: np.ndarray, ggml_type: GGMLType | int) -> tuple[np.ndarray, ...]:
    """uint8 GGUF blocks [..., row_bytes] -> (q int8 [..., cols], scale f32 [..., groups],
    offset f32 [..., groups] or None), numpy, chunked so temporaries stay small."""
    lay = layout_of(ggml_type)
    if not repackable(lay.ggml_type):
        raise ValueError(f"{lay.ggml_type.name} is not a quantised type with an affine form")
    raw = np.asarray(raw)
    blocks = blocks_of(NUMPY, raw, lay)  # [..., n_blocks, block_bytes]
    flat = blocks.reshape(-1, lay.block_bytes)
    probe = affine_parts(NUMPY, lay, flat[:1])
    per_block = probe[1].shape[-1]  # scale groups per block
    n = flat.shape[0]
    q = np.empty((n, lay.block_elems), np.int8)
    scale = np.empty((n, per_block), np.float32)
    offset = None if probe[2] is None else np.empty((n, per_block), np.float32)
    step = max(1, CHUNK_ELEMS // lay.block_elems)
    for i in range(0, n, step):
        cq, cs, co = affine_parts(NUMPY, lay, flat[i : i + step])
        q[i : i + step] = cq
        scale[i : i + step] = cs
        if offset is not None:
            offset[i : i + step] = co
    lead = raw.shape[:-1]
    return (
        q.reshape(*lead, -1),
        scale.reshape(*lead, -1),
        None if offset is None else offset.reshape(*lead, -1),
    )


def keep_on_thunks(y: jax.Array, x: jax.Array) -> jax.Array:
    """y, made to depend on a sort of 32 values of x (an array computed in the loop body,
    or sliced by the loop index: a loop invariant would be hoisted out of the loop).

    XLA CPU compiles a small while loop into one single-threaded kernel (its "small
    call", `SmallWhileLoopHoistingPass`): a scan whose matmuls all have one activation row,
    or none at all (the llamacpp emulations), ran as one kernel, ~3x slower than as
    separate ops (SmolLM2 llamacpp decode: 1.1 s -> 0.34 s per step). Which loops count
    as small changed between releases (jax 0.12.0 took any without a dot, custom call or
    scatter, after turning matrix-vector dots into multiply-reduces; 0.12.1 sizes the
    loop by bytes and lets dots in), but a sort keeps the loops of each (0.11.2, 0.12.0,
    0.12.1) off that path: its kernel is a runtime call the small-call emitter cannot
    inline. The select it feeds never fires (the values are 0 or 1), so y is unchanged.
    (Exact numerics do not need it: the LM head's one-row chunk loop measured no slower
    as one kernel.)
    """
    flags = (x.reshape(-1)[:32] == 0).astype(jnp.float32)
    flags = jnp.pad(flags, (0, 32 - flags.shape[0]))
    never = jnp.sort(flags)[-1] > 1
    return jnp.where(never, jnp.zeros_like(y), y)


def chunked_rows(
    x: jax.Array,
    arrays: tuple,
    rows_fn: Callable[..., jax.Array],
    n_rows: int,
    chunk_rows: int,
) -> jax.Array:
    """rows_fn(x2, *arrays) -> [m, n_rows] for x2 = x as [m, cols], computed in chunks of
    `chunk_rows` of the arrays' axis 0 (every array holds the weight's rows there) under
    `lax.map`, so each chunk's temporaries stay in cache. rows_fn must treat rows
    independently. Returns [..., n_rows]."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if n_rows <= 2 * chunk_rows:
        return rows_fn(x2, *arrays).reshape(*lead, n_rows)
    n_full = n_rows // chunk_rows

    def chunk(i):  # a dynamic slice fuses into its consumer: no copy of the weight
        start = i * chunk_rows
        return rows_fn(
            x2,
            *(
                None if a is None else jax.lax.dynamic_slice_in_dim(a, start, chunk_rows)
                for a in arrays
            ),
        )

    y = jax.lax.map(chunk, jnp.arange(n_full))  # [n_full, m, chunk_rows]
    y = jnp.moveaxis(y, 0, 1).reshape(x2.shape[0], n_full * chunk_rows)
    if n_full * chunk_rows < n_rows:
        tail = tuple(None if a is None else a[n_full * chunk_rows :] for a in arrays)
        y = jnp.concatenate([y, rows_fn(x2, *tail)], axis=-1)
    return y.reshape(*lead, n_rows)


def chunked_matmul(
    x: jax.Array, arrays: tuple, dequant: Callable[..., jax.Array], n_rows: int, cols: int
) -> jax.Array:
    """x [..., cols] @ W.T where W [n_rows, cols] = dequant(*arrays), every array holding
    W's rows on axis 0: dequantised and multiplied in row chunks of about CHUNK_ELEMS
    elements, so each f32 chunk stays in cache for its dot."""

    def dot(x2, *chunk):
        w = dequant(*chunk)
        return jnp.einsum("mk,nk->mn", x2.astype(jnp.float32), w, precision="highest")

    return chunked_rows(x, arrays, dot, n_rows, max(1, CHUNK_ELEMS // cols))


def affine_matmul(x: jax.Array, w: AffineQTensor) -> jax.Array:
    """x @ W.T in exact numerics for a repacked weight [rows, cols]."""
    if w.q.ndim != 2:
        raise ValueError(f"affine_matmul needs one [rows, cols] weight, got {w.q.shape}")
    bk = jax_backend()
    return chunked_matmul(
        x, (w.q, w.scale, w.offset), lambda q, s, o: affine_values(bk, q, s, o), *w.q.shape
    )


def blocks_matmul(x: jax.Array, data: jax.Array, ggml_type: GGMLType, cols: int) -> jax.Array:
    """x @ W.T in exact numerics for GGUF blocks [rows, row_bytes] (not repacked: a float
    type, or a weight kept in its file layout), chunked as `chunked_matmul`."""
    from llamay.quant.jnp_dequant import dequantize_jnp

    if data.ndim != 2:
        raise ValueError(f"blocks_matmul needs one [rows, row_bytes] weight, got {data.shape}")
    return chunked_matmul(x, (data,), lambda d: dequantize_jnp(d, ggml_type), data.shape[0], cols)
