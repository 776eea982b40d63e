"""`QTensor`: a weight that stays in its GGUF block layout until used inside jit.

A QTensor is a pytree leaf-holder: `data` is the packed bytes (uint8, shaped
[..., rows, row_bytes]); the GGML type, logical shape and numerics are static aux
data, so jit specialises on them and `lax.scan` can slice stacked layers along axis 0.

Numerics (design principle 8), chosen per weight at bind time:

- "exact": x @ W.T in f32 over the dequantised weight.
- "llamacpp": as llama.cpp's CPU backend (x86 build) computes it. The activations
  are rounded to the weight's vec_dot type first (`act_quant.VEC_DOT_TYPES`): f16 /
  bf16 for F16 / BF16 weights, none for F32, Q8_K blocks for K-quants, Q8_0 / Q8_1
  blocks for the 32-element types. For the last (Q4_0, Q5_0, Q8_0 × Q8_0; Q4_1,
  Q5_1 × Q8_1) the product is ggml's integer dot: per block the exact integer sum
  Σ q_w·q_a, times f32(d_w·d_a), summed over blocks; Q8_1 adds Σ_b m_w·s_a, where
  s_a = f16(d_a·Σ q_a) is the block sum Q8_1 stores. Note that s_a is rounded on
  its own, so dequantising Q4_1 weights and dotting them with the rounded
  activations would not give llama.cpp's numbers. The other types have exact
  products (f16·f16, bf16·bf16) or f32 scales throughout (Q8_K), so a dot of
  the rounded activations with the dequantised weight is the same sum; only
  the order of summation differs from ggml's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np

from llamay.gguf.constants import BLOCK_SIZES, GGMLType
from llamay.quant import ggml_float
from llamay.quant.act_quant import VEC_DOT_TYPES, quantize_q8_0, quantize_q8_1, round_activations
from llamay.quant.formulas import unpack_bits
from llamay.quant.layouts import blocks_of, jax_backend, layout_of

NUMERICS = ("exact", "llamacpp")
# Which of ggml's Q8_0/Q8_1 activation quantisers "llamacpp" reproduces (see
# act_quant): the x86 SIMD build, the one llama.cpp's goldens come from.
LLAMACPP_Q8_VARIANT = "x86"


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class QTensor:
    data: jax.Array  # uint8 [..., rows, row_bytes]
    ggml_type: GGMLType = field(metadata=dict(static=True))
    cols: int = field(metadata=dict(static=True))  # logical row length
    numerics: str = field(default="exact", metadata=dict(static=True))  # one of NUMERICS

    @property
    def shape(self) -> tuple[int, ...]:
        return (*self.data.shape[:-1], self.cols)

    @staticmethod
    def from_raw(raw: np.ndarray, ggml_type: GGMLType, numerics: str = "exact") -> QTensor:
        """Wrap a uint8 [..., row_bytes] numpy view (e.g. from `GGUFFile.raw`)."""
        if numerics not in NUMERICS:
            raise ValueError(f"numerics must be one of {NUMERICS}, not {numerics!r}")
        block, size = BLOCK_SIZES[ggml_type]
        cols = raw.shape[-1] // size * block
        return QTensor(jnp.asarray(raw), GGMLType(ggml_type), cols, numerics)

    def dequantize(self, dtype=jnp.float32) -> jax.Array:
        """Dequantise all of it: [..., rows, cols] in `dtype` (call inside jit)."""
        from llamay.quant.jnp_dequant import dequantize_jnp

        return dequantize_jnp(self.data, self.ggml_type).astype(dtype)

    def rows(self, ids: jax.Array, dtype=jnp.float32) -> jax.Array:
        """Dequantise only the rows `ids` (embedding lookup): [*ids.shape, cols]."""
        from llamay.quant.jnp_dequant import dequantize_jnp

        return dequantize_jnp(jnp.take(self.data, ids, axis=-2), self.ggml_type).astype(dtype)

    def layer(self, index: jax.Array) -> QTensor:
        """Slice one entry of a stacked [L, rows, row_bytes] tensor by a traced index."""
        data = jax.lax.dynamic_index_in_dim(self.data, index, keepdims=False)
        return dataclasses.replace(self, data=data)

    def round_activations(self, x: jax.Array) -> jax.Array:
        """x [..., cols] as this weight's matmul sees it: itself (f32) in exact
        numerics, rounded to the weight's vec_dot type in llamacpp numerics."""
        if self.numerics == "llamacpp":
            return round_activations(x, self.ggml_type, LLAMACPP_Q8_VARIANT)
        return x.astype(jnp.float32)


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class MixedQTensor:
    """One layer's weight when a role's layers have different GGML types (e.g. Q4_K_M
    files mix Q4_K and Q6_K): the per-type stacks, and which stack/entry is this layer's.

    Built inside the layer scan: `stacks` are closed over, `which`/`index` are scanned.
    """

    stacks: tuple[QTensor, ...]
    which: jax.Array  # int32 scalar: position in `stacks`
    index: jax.Array  # int32 scalar: entry within that stack


def qmatmul(x: jax.Array, w: QTensor | MixedQTensor) -> jax.Array:
    """x @ W.T for x [..., cols] and W [rows, cols]: the one matmul every architecture calls.

    In the weight's numerics (module docstring): exact is f32 accumulation over the
    dequantised weight; llamacpp rounds x to the weight's dot type first.
    """
    if isinstance(w, MixedQTensor):
        branches = [lambda x, s=s: qmatmul(x, s.layer(w.index)) for s in w.stacks]
        return jax.lax.switch(w.which, branches, x)
    if w.numerics == "llamacpp":
        return _ggml_matmul(x, w)
    wf = w.dequantize(jnp.float32)
    return jnp.einsum("...k,nk->...n", w.round_activations(x), wf, precision="highest")


# -- llamacpp numerics: ggml's kernels, bit for bit ----------------------------------------

_T = GGMLType
_Q8_ACTS = {_T.Q8_0: quantize_q8_0, _T.Q8_1: quantize_q8_1}
_FLOAT_DOTS = {  # vec_dot type -> (sgemm dot, its k step, vec dot)
    _T.F32: (ggml_float.dot_f32_sgemm, 16, ggml_float.dot_f32_vec),
    _T.F16: (ggml_float.dot_f16_sgemm, 16, ggml_float.dot_f16_vec),
    _T.BF16: (ggml_float.dot_bf16_sgemm, 32, ggml_float.dot_bf16_vec),
}


def _ggml_matmul(x: jax.Array, w: QTensor) -> jax.Array:
    """x @ W.T as llama.cpp's CPU backend computes it (x86, AVX-512 build).

    Which kernel runs depends on the weight type and the number of rows n of x (the
    tokens of the batch): Q4_0 weights with a row count divisible by 8 are repacked at
    load and use the repack GEMV/GEMM; the other 32-element block types use vec_dot
    (tinyBLAS_Q0 computes the same per element); float weights use llamafile's
    tinyBLAS when n >= 2 (and rows % 4 == 0, cols % step == 0), else ggml_vec_dot_*.
    """
    t = w.ggml_type
    dot = VEC_DOT_TYPES[t]
    n = int(np.prod(x.shape[:-1]))
    n_rows = w.data.shape[-2]
    if dot in _Q8_ACTS:
        if t == _T.Q4_0 and n_rows % 8 == 0:
            return _q4_0_repack_dot(x, w)
        return _q8_block_dot(x, w)
    if dot in _FLOAT_DOTS:
        sgemm, step, vec = _FLOAT_DOTS[dot]
        xr = w.round_activations(x)[..., None, :]
        wf = w.dequantize(jnp.float32)
        batched = n >= 2 and n_rows % 4 == 0 and w.cols % step == 0
        return (sgemm if batched else vec)(xr, wf)
    # K-quants (Q8_K activations): the rounded activations against the dequantised weight
    # (the same products; the order of the f32 sums is not ggml's).
    wf = w.dequantize(jnp.float32)
    return jnp.einsum("...k,nk->...n", w.round_activations(x), wf, precision="highest")


def _q4_0_repack_dot(x: jax.Array, w: QTensor) -> jax.Array:
    """ggml's Q4_0x8 repack GEMV/GEMM (x86): per block the exact integer sum of the
    whole block, acc = fma(isum, d_w·d_a, acc) in block order; no lanes."""
    acts = quantize_q8_0(x, LLAMACPP_Q8_VARIANT)
    qw, dw, _ = weight_blocks(w)
    lead = x.shape[:-1]
    n_rows, nb = dw.shape
    f32 = jnp.float32
    qa = acts.qs.reshape(-1, nb, 32).astype(f32)
    isum = jnp.einsum("lbk,nbk->bln", qa, qw.astype(f32), precision="highest")  # exact
    dd = acts.d.reshape(-1, nb).T[:, :, None] * dw.T[:, None, :]  # [nb, L, N], exact

    def block(acc, xs):
        s_b, d_b = xs
        return ggml_float.fma(s_b, d_b, acc, narrow=True), None

    acc, _ = jax.lax.scan(block, jnp.zeros(isum.shape[1:], f32), (isum, dd))
    return acc.reshape(*lead, n_rows)


def weight_blocks(w: QTensor) -> tuple[jax.Array, jax.Array, jax.Array | None]:
    """A 32-element-block weight (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) [..., rows, cols] as ggml's
    dot products read it: quants int8 [..., rows, n_blocks, 32] (signed for the _0 types,
    0..15 / 0..31 for the _1 types), d f32 [..., rows, n_blocks] and, for the _1 types,
    the offset m f32 [..., rows, n_blocks] (value = d·q + m)."""
    t, bk = w.ggml_type, jax_backend()
    lay = layout_of(t)
    f = lay.unpack(bk, blocks_of(bk, w.data, lay))
    lead = f["d"].shape[:-1]
    if t == _T.Q8_0:
        q = f["qs"]
    else:
        q = unpack_bits(bk, f["qs"], (0, 4), 0xF, -2).reshape(*lead, 32)
        if t in (_T.Q5_0, _T.Q5_1):
            q = q | (unpack_bits(bk, f["qh"], range(8), 1, -1).reshape(*lead, 32) << 4)
        q = q.astype(jnp.int8)
        if t in (_T.Q4_0, _T.Q5_0):
            q = q - (8 if t == _T.Q4_0 else 16)
    d = f["d"][..., 0].astype(jnp.float32)
    m = f["m"][..., 0].astype(jnp.float32) if "m" in f else None
    return q, d, m


def _q8_block_dot(x: jax.Array, w: QTensor) -> jax.Array:
    """ggml's vec_dot_{q4_0,q5_0,q8_0}_q8_0 / {q4_1,q5_1}_q8_1 (AVX2 code, also what
    llamafile's tinyBLAS_Q0_AVX computes per element) for every row pair, bit for bit.

    Per block b and lane l (4 consecutive elements): the exact integer sum
    xy = Σ q_w·q_a; then acc_l = fma(d_w·d_a, xy, acc_l) in block order (d_w·d_a is
    exact: two f16s); the _1 types also sum m_w·s_a in block order. The result is
    hsum_float_8(acc) (+ that sum). Blocks run under `lax.scan`.
    """
    acts = _Q8_ACTS[VEC_DOT_TYPES[w.ggml_type]](x, LLAMACPP_Q8_VARIANT)
    qw, dw, mw = weight_blocks(w)
    lead = x.shape[:-1]
    n_rows, nb = dw.shape
    f32 = jnp.float32
    qa = jnp.moveaxis(acts.qs.reshape(-1, nb, 8, 4).astype(f32), 1, 0)  # [nb, L, 8, 4]
    qw = jnp.moveaxis(qw.reshape(n_rows, nb, 8, 4).astype(f32), 1, 0)  # [nb, N, 8, 4]
    da = acts.d.reshape(-1, nb).T  # [nb, L]
    sums = acts.sums.reshape(-1, nb).T if mw is not None else da
    m = mw.T if mw is not None else dw.T

    def block(carry, xs):
        acc, summs = carry
        qa_b, qw_b, da_b, dw_b, s_b, m_b = xs
        xy = jnp.einsum("lci,nci->lnc", qa_b, qw_b, precision="highest")  # exact integers
        dd = da_b[:, None] * dw_b[None, :]  # exact: two f16 values
        acc = ggml_float.fma(dd[..., None], xy, acc, narrow=True)
        if mw is not None:
            summs = summs + s_b[:, None] * m_b[None, :]  # exact products, block order
        return (acc, summs), None

    n_lead = qa.shape[1]
    init = (jnp.zeros((n_lead, n_rows, 8), f32), jnp.zeros((n_lead, n_rows), f32))
    (acc, summs), _ = jax.lax.scan(block, init, (qa, qw, da, dw.T, sums, m))
    y = ggml_float.hsum8(acc)
    if mw is not None:
        y = y + summs
    return y.reshape(*lead, n_rows)
