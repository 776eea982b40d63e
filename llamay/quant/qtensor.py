"""`QTensor`: a weight that stays in its GGUF block layout until used inside jit.

A QTensor is a pytree leaf-holder: `data` is the packed bytes (uint8, shaped
[..., rows, row_bytes]); the GGML type, logical shape and numerics are static aux
data, so jit specialises on them and `lax.scan` can slice stacked layers along axis 0.
It and `MixedQTensor` (per-layer types) implement the matrix protocol (`matrix`).

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
from jax.sharding import PartitionSpec

from llamay.gguf.constants import BLOCK_SIZES, GGMLType
from llamay.quant import formulas, ggml_float, ggml_rows
from llamay.quant.act_quant import (
    VEC_DOT_TYPES,
    quantize_q8_0,
    quantize_q8_1,
    quantize_q8_k,
    round_activations,
)
from llamay.quant.cpu_dot import CHUNK_ELEMS, chunked_rows, keep_on_thunks
from llamay.quant.formulas import unpack_bits
from llamay.quant.ggml_iq_dot import IQ_DOT_TYPES, iq_dot
from llamay.quant.ggml_iq_dot import kernel_for as iq_kernel_for
from llamay.quant.layouts import blocks_of, jax_backend, layout_of
from llamay.quant.matrix import Matrix, SpecFn

NUMERICS = ("exact", "llamacpp")
# Which of ggml's Q8_0/Q8_1 activation quantisers "llamacpp" reproduces (see
# act_quant): the x86 SIMD build, the one llama.cpp's goldens come from.
LLAMACPP_Q8_VARIANT = "x86"
# `_q8_block_dot` computes all blocks' lane sums in one integer dot for fewer activation
# rows than this, block by block inside its scan from this many on (measured, see there).
LANES_AT_ONCE_BELOW = 8


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class QTensor(Matrix):
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
        # device_put: jnp.asarray(ndarray) compiles an identity program per shape (jax 0.12)
        return QTensor(jax.device_put(raw), GGMLType(ggml_type), cols, numerics)

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

    def partition_specs(self, spec: SpecFn) -> QTensor:
        """Rows on axis -2 of the blocks; columns split only in whole blocks."""
        shape = self.data.shape
        blocks = shape[-1] // BLOCK_SIZES[self.ggml_type][1]
        return dataclasses.replace(self, data=spec(shape[-2], blocks, len(shape), False))

    def round_activations(self, x: jax.Array) -> jax.Array:
        """x [..., cols] as this weight's matmul sees it: itself (f32) in exact
        numerics, rounded to the weight's vec_dot type in llamacpp numerics."""
        if self.numerics == "llamacpp":
            return round_activations(x, self.ggml_type, LLAMACPP_Q8_VARIANT)
        return x.astype(jnp.float32)


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class MixedQTensor(Matrix):
    """A role whose layers have different GGML types (e.g. Q4_K_M files mix Q4_K and Q6_K):
    the per-type stacks, and which stack/entry holds each layer.

    As bound, `which`/`index` are [L] (one entry per layer); `layer(i)` and the layer
    scan (`scan_parts`: `which`/`index` are scanned, the stacks closed over) give one
    layer's, with scalar `which`/`index`, whose `on_layer(fn)` is the one `lax.switch`
    over the stacks.
    """

    stacks: tuple[Matrix, ...]
    which: jax.Array  # int32: position in `stacks` ([L] as bound, a scalar per layer)
    index: jax.Array  # int32: entry within that stack

    @property
    def shape(self) -> tuple[int, ...]:
        """[L, rows, cols] as bound, [rows, cols] (plus any expert dims) for one layer."""
        return (*self.which.shape, *self.stacks[0].shape[1:])

    @property
    def cols(self) -> int:
        return self.stacks[0].cols

    @property
    def numerics(self) -> str:
        return self.stacks[0].numerics

    @property
    def ggml_type(self) -> None:
        """None: the type differs per layer (see the stacks)."""
        return None

    def layer(self, index: jax.Array) -> MixedQTensor:
        pick = jax.lax.dynamic_index_in_dim
        return MixedQTensor(
            self.stacks, pick(self.which, index, keepdims=False),
            pick(self.index, index, keepdims=False),
        )  # fmt: skip

    def on_layer(self, fn):
        if self.which.ndim:  # the whole [L] stack (research, inspection): layer by layer
            return jnp.stack([self.layer(i).on_layer(fn) for i in range(self.which.shape[0])])
        branches = [lambda s=s: fn(s.layer(self.index)) for s in self.stacks]
        return jax.lax.switch(self.which, branches)

    def rows(self, ids: jax.Array, dtype=jnp.float32) -> jax.Array:
        return self.on_layer(lambda m: m.rows(ids, dtype))

    def dequantize(self, dtype=jnp.float32) -> jax.Array:
        return self.on_layer(lambda m: m.dequantize(dtype))

    def scan_parts(self):
        return (self.which, self.index), lambda part: MixedQTensor(self.stacks, *part)

    def partition_specs(self, spec: SpecFn) -> MixedQTensor:
        stacks = tuple(s.partition_specs(spec) for s in self.stacks)
        return MixedQTensor(stacks, PartitionSpec(), PartitionSpec())


def qmatmul(x: jax.Array, w: QTensor) -> jax.Array:
    """x @ W.T for x [..., cols] and a GGUF-block W [rows, cols] in the weight's numerics
    (module docstring): the jnp reference, on any backend. Exact: f32 accumulation over
    the dequantised weight; llamacpp: ggml's kernels (`ggml_matmul`). The dispatcher
    `llamay.kernels.matmul` picks faster forms per backend (the CPU chunked dots of
    `cpu_dot`, the Pallas kernels, native kernels) with the same values."""
    if w.numerics == "llamacpp":
        # Each emulated kernel is its own fusion island: letting XLA fuse across them
        # makes compile time explode (minutes per model) for no speed gain.
        return ggml_matmul(x, w)
    return dequant_matmul(x, w)


def dequant_matmul(x: jax.Array, w: QTensor) -> jax.Array:
    """x @ W.T in exact numerics: the weight dequantised whole, one f32 dot."""
    wf = w.dequantize(jnp.float32)
    return jnp.einsum("...k,nk->...n", w.round_activations(x), wf, precision="highest")


# -- llamacpp numerics: ggml's kernels, bit for bit ----------------------------------------

_T = GGMLType
_Q8_ACTS = {_T.Q8_0: quantize_q8_0, _T.Q8_1: quantize_q8_1}
# Weights with ggml's integer block dot emulated here; the i-quants, TQ* and the Q8_0
# family's IQ4_NL and MXFP4 in `ggml_iq_dot`.
_Q8_BLOCK_TYPES = (_T.Q4_0, _T.Q4_1, _T.Q5_0, _T.Q5_1, _T.Q8_0)
_FLOAT_DOTS = {  # vec_dot type -> (sgemm dot, its k step, vec dot)
    _T.F32: (ggml_float.dot_f32_sgemm, 16, ggml_float.dot_f32_vec),
    _T.F16: (ggml_float.dot_f16_sgemm, 16, ggml_float.dot_f16_vec),
    _T.BF16: (ggml_float.dot_bf16_sgemm, 32, ggml_float.dot_bf16_vec),
}


def ggml_matmul(x: jax.Array, w: QTensor, batched: bool | None = None) -> jax.Array:
    """x @ W.T as llama.cpp computes it, the kernel chosen as for a batch of >= 8 rows
    (`batched` True) or of one row (False) instead of from x's row count (None). Rows do
    not interact in any of these kernels, so one row can be computed as part of a batch,
    and a big weight in row chunks (`cpu_dot.chunked_rows`: the emulations' f32
    temporaries, several times the weight, stay in cache; an LM head unchunked made
    hundreds of MB of them per step). Each kernel is kept off XLA CPU's single-threaded
    "small call" loops (`cpu_dot.keep_on_thunks`): the emulations have no dot of their
    own, so a layer scan or chunk loop of them would otherwise become one."""
    opaque = ggml_float.opaque
    kernel = _ggml_kernel(x, w, batched)

    def rows_fn(x, data):  # tied to the (loop-variant) weight rows: see keep_on_thunks
        return keep_on_thunks(kernel(x, data), data)

    x = opaque(x)
    if w.data.ndim != 2:
        return opaque(rows_fn(x, w.data))
    rows = max(8, CHUNK_ELEMS // 4 // w.cols // 8 * 8)  # whole groups of 8: the repacks'
    return opaque(chunked_rows(x, (w.data,), rows_fn, w.data.shape[0], rows))


def _ggml_kernel(x: jax.Array, w: QTensor, batched: bool | None = None):
    """The function (x, data) -> x @ W.T for rows `data` of w, as llama.cpp's CPU backend
    computes it (x86, AVX-512 build).

    Which kernel runs depends on the weight type and the number of rows n of x (the
    tokens of the batch): Q4_0 weights with a row count divisible by 8 are repacked at
    load and use the repack GEMV/GEMM; the other 32-element block types use vec_dot
    (tinyBLAS_Q0 computes the same per element); float weights use llamafile's
    tinyBLAS when n >= 2 (and rows % 4 == 0, cols % step == 0), else ggml_vec_dot_*;
    K-quants: Q4_K and Q2_K with rows % 8 == 0 the repack GEMV/GEMM, the others the
    tiled GEMM when n >= 8, else vec_dot.

    n is x's real row count: a bucket-padded step says how many of its rows are real
    (`ggml_rows.real_rows`) and the kernel is switched on that count at run time, so a
    5-token prompt in a 16-row step takes vec_dot as in llama.cpp. Without one, n is
    x's row count as traced (`batched`: as for >= 8 rows, or for one)."""
    if batched is not None:
        n = 8 if batched else 1
        return _kernel_of(w, _kernel_key(w, n), n)
    count = ggml_rows.real_count(x)
    return ggml_rows.choose(x, lambda n: _kernel_key(w, n), lambda key: _kernel_of(w, key, count))


def _kernel_key(w: QTensor, n: int) -> tuple:
    """Which ggml kernel computes w for n rows of x (hashable: equal keys, same kernel)."""
    t = w.ggml_type
    dot = VEC_DOT_TYPES[t]
    n_rows = w.data.shape[-2]
    if dot in _Q8_ACTS and t in _Q8_BLOCK_TYPES:
        return ("q4_0-repack",) if t == _T.Q4_0 and n_rows % 8 == 0 else ("q8-block",)
    if dot in _FLOAT_DOTS:
        step = _FLOAT_DOTS[dot][1]
        return ("float", n >= 2 and n_rows % 4 == 0 and w.cols % step == 0)
    if dot == _T.Q8_K and t in _KQUANT_DOTS:
        repacked = t in (_T.Q2_K, _T.Q4_K) and n_rows % 8 == 0
        return ("kquant", "repack" if repacked else "tiled" if n >= 8 else t.name)
    if t in IQ_DOT_TYPES:  # the i-quants, TQ1_0/TQ2_0, MXFP4: `ggml_iq_dot`
        return ("iq", iq_kernel_for(t, n_rows, n))
    return ("dequant",)


def _kernel_of(w: QTensor, key: tuple, count):
    """The function (x, data) of `_kernel_key`'s kernel `key` for x of which `count` rows
    are real (the repack GEMM's rows are computed by its GEMV past count - count % 4)."""
    t = w.ggml_type

    def on(f, *args):  # f(x, w, *args) as a function of (x, rows of w)
        return lambda x, data: f(x, dataclasses.replace(w, data=data), *args)

    kind = key[0]
    if kind == "q4_0-repack":
        return on(_q4_0_repack_dot)
    if kind == "q8-block":
        return on(_q8_block_dot)
    if kind == "float":
        sgemm, _, vec = _FLOAT_DOTS[VEC_DOT_TYPES[t]]

        def float_dot(x, w):
            xr = w.round_activations(x)[..., None, :]
            return (sgemm if key[1] else vec)(xr, w.dequantize(jnp.float32))

        return on(float_dot)
    if kind == "kquant" and key[1] == "repack":
        return on(lambda x, w: ggml_rows.gemv_tail(x, count, lambda x: _kquant_dot(x, w, "repack")))
    if kind == "kquant":
        return on(_kquant_dot, key[1])
    if kind == "iq":
        return lambda x, data: iq_dot(x, data, t, key[1])
    return on(dequant_matmul)


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
    qa = acts.qs.reshape(-1, nb, 8, 4)  # [L, nb, 8, 4]
    qw = qw.reshape(n_rows, nb, 8, 4)
    n_lead = qa.shape[0]
    if n_lead < LANES_AT_ONCE_BELOW:
        # Few rows (decode): every block's lane sums in one int8 dot, laid out block-major
        # for the scan ([nb, L, N, 8] int32, a few times the weight's bytes): 1.5-2x faster
        # than the per-block dots at 1-4 rows, which pay an f32 copy of the whole weight,
        # and slower from 8 rows on (the threshold).
        lane_xs = (jnp.einsum("lbci,nbci->blnc", qa, qw, preferred_element_type=jnp.int32),)

        def lane_sums(xy):
            return xy.astype(f32)
    else:
        # Many rows (prefill): the lane sums of one block at a time, inside the scan
        # (all blocks at once would be nb x L x N x 8 floats, far out of cache).
        lane_xs = (jnp.moveaxis(qa.astype(f32), 1, 0), jnp.moveaxis(qw.astype(f32), 1, 0))

        def lane_sums(qa_b, qw_b):  # [L, 8, 4] x [N, 8, 4] -> [L, N, 8], exact integers
            return jnp.einsum("lci,nci->lnc", qa_b, qw_b, precision="highest")

    da = acts.d.reshape(-1, nb).T  # [nb, L]
    sums = acts.sums.reshape(-1, nb).T if mw is not None else da
    m = mw.T if mw is not None else dw.T

    def block(carry, xs):
        acc, summs = carry
        *lane_b, da_b, dw_b, s_b, m_b = xs
        xy = lane_sums(*lane_b)
        dd = da_b[:, None] * dw_b[None, :]  # exact: two f16 values
        acc = ggml_float.fma(dd[..., None], xy, acc, narrow=True)
        if mw is not None:
            summs = summs + s_b[:, None] * m_b[None, :]  # exact products, block order
        return (acc, summs), None

    init = (jnp.zeros((n_lead, n_rows, 8), f32), jnp.zeros((n_lead, n_rows), f32))
    (acc, summs), _ = jax.lax.scan(block, init, (*lane_xs, da, dw.T, sums, m))
    y = ggml_float.hsum8(acc)
    if mw is not None:
        y = y + summs
    return y.reshape(*lead, n_rows)


# -- K-quants x Q8_K ------------------------------------------------------------------------

_KQUANT_DOTS = (_T.Q2_K, _T.Q3_K, _T.Q4_K, _T.Q5_K, _T.Q6_K)


def kquant_parts(w: QTensor):
    """A K-quant weight [rows, cols] as ggml's integer dots read it, per super-block of 256:
    q int8 [rows, nsb, 256] (the quants; Q6_K unsigned 0..63), sc int16 [.., 256] (each
    element's sub-block scale), mins int16 [.., n_sub] or None, d and dmin f32 [rows, nsb]
    (value = d·sc·q - dmin·min; Q6_K: d·sc·(q - 32))."""
    t, bk = w.ggml_type, jax_backend()
    lay = layout_of(t)
    f = lay.unpack(bk, blocks_of(bk, w.data, lay))
    lead = f["d"].shape[:-1]
    d = f["d"][..., 0].astype(jnp.float32)
    dmin = f["dmin"][..., 0].astype(jnp.float32) if "dmin" in f else None
    mins = None

    def planes(x, shifts, mask):  # [.., m] bytes -> [.., len(shifts)·m], K-quant order
        runs = x.reshape(*x.shape[:-1], -1, 32)
        return unpack_bits(bk, runs, shifts, mask, -2).reshape(*x.shape[:-1], -1)

    def bits(x):  # [.., 32] bytes -> [.., 8, 32]: bit i of byte l at [i, l]
        return unpack_bits(bk, x, range(8), 1, -2)

    if t == _T.Q2_K:
        q = planes(f["qs"], (0, 2, 4, 6), 0x3)
        sc, mins = f["scales"] & 0xF, f["scales"] >> 4
    elif t == _T.Q3_K:
        low = planes(f["qs"], (0, 2, 4, 6), 0x3).astype(jnp.int8)
        high = bits(f["hmask"]).reshape(low.shape).astype(jnp.int8)
        q = low - ((high ^ 1) << 2)
        sc = formulas.q3k_scales(bk, f["scales"])
    elif t in (_T.Q4_K, _T.Q5_K):
        q = planes(f["qs"], (0, 4), 0xF)
        if t == _T.Q5_K:
            q = q | (bits(f["qh"]).reshape(q.shape) << 4)
        sc, mins = formulas.q4k_scales_mins(bk, f["scales"])
    else:  # Q6_K
        ql, qh = f["ql"], f["qh"]
        low = unpack_bits(bk, ql.reshape(*lead, 2, 2, 32), (0, 4), 0xF, -3).reshape(*lead, 256)
        q = low | (planes(qh, (0, 2, 4, 6), 0x3) << 4)
        sc = f["scales"]
    per = 256 // sc.shape[-1]
    sc_e = jnp.repeat(sc.astype(jnp.int16), per, axis=-1)
    mins = None if mins is None else mins.astype(jnp.int16)
    return q.astype(jnp.int8), sc_e, mins, d, dmin


def _lane_sums(q8: jax.Array, qs: jax.Array) -> jax.Array:
    """Σ q8·qs per AVX2 int32 lane: [L, nsb, 256] x [N, nsb, 256] -> [L, N, nsb, 8] (lane l
    of a 32-byte chunk holds bytes 4l..4l+3; the chunks of a super-block add up)."""
    a = q8.reshape(*q8.shape[:-1], 8, 8, 4)
    b = qs.reshape(*qs.shape[:-1], 8, 8, 4)
    return jnp.einsum("lscji,nscji->lnsj", a, b, preferred_element_type=jnp.int32)


def _kquant_dot(x: jax.Array, w: QTensor, kernel: str) -> jax.Array:
    """ggml's vec_dot_qN_K_q8_K (AVX2 code) or, for "repack", the Q4_K/Q2_K 8x8 GEMV/GEMM,
    bit for bit: exact integer sums (grouped as ggml's int32 lanes group them), scaled and
    accumulated in f32 super-block by super-block with ggml's FMAs."""
    lead = x.shape[:-1]
    return kquant_dot_q8k(quantize_q8_k(x), w, kernel).reshape(*lead, -1)


def kquant_dot_q8k(acts, w: QTensor, kernel: str) -> jax.Array:
    """`_kquant_dot` from activations already quantised to Q8_K (`Q8Acts`): [L, rows]."""
    f32, i32 = jnp.float32, jnp.int32
    q, sc, mins, dw, dmw = kquant_parts(w)
    n_rows, nsb = dw.shape
    q8 = acts.qs.reshape(-1, nsb, 256)
    da = acts.d.reshape(-1, nsb)  # [L, nsb] f32
    bsums = acts.sums.reshape(-1, nsb, 16).astype(i32)  # Σ q8 per 16 elements
    lanes = _lane_sums(q8, (q.astype(jnp.int16) * sc).astype(jnp.int16))  # [L, N, nsb, 8]
    # f32(d_a·d_w) as ggml rounds it; hidden from XLA (a rounded product fed to adds)
    d = ggml_float.opaque(da[:, None, :] * dw[None, :, :])  # [L, N, nsb]
    fma = ggml_float.fma

    def min_sums(group: int) -> jax.Array:  # mins·(Σ q8 over each sub-block of `group`)
        b = bsums.reshape(*bsums.shape[:-1], -1, group // 16).sum(-1)  # [L, nsb, n_sub]
        return jnp.einsum("lsm,nsm->lnsm", b, mins.astype(i32))  # [L, N, nsb, n_sub]

    def pairs(v: jax.Array) -> jax.Array:  # _mm_madd_epi16: adjacent pairs summed
        return v.reshape(*v.shape[:-1], -1, 2).sum(-1)

    if mins is not None:
        dmin = ggml_float.opaque(da[:, None, :] * dmw[None, :, :])
        m_sub = min_sums(256 // mins.shape[-1])
    if kernel == "tiled":
        # llama.cpp's tiled K-quant GEMM (batches of >= 8 rows): the exact integer sum of a
        # super-block, times the weight's d (then minus dmin·Σ mins·bsums), times the
        # activation's d, accumulated super-block by super-block.
        s1 = lanes.sum(-1)  # [L, N, nsb]
        if w.ggml_type == _T.Q6_K:  # the quants are stored unsigned: q - 32
            s1 = s1 - 32 * jnp.einsum("lsm,nsm->lns", bsums, sc[..., ::16].astype(i32))
        s1 = s1.astype(f32)
        s2 = m_sub.sum(-1).astype(f32) if mins is not None else None
        acc = jnp.zeros(s1.shape[:-1], f32)
        for b in range(nsb):
            r = ggml_float.opaque(s1[..., b] * dw[None, :, b])
            if s2 is not None:
                r = fma(-dmw[None, :, b], s2[..., b], r, narrow=True)
            acc = fma(r, da[:, None, b], acc)
        return acc
    if kernel == "repack":
        # GEMM (groups of 4 rows) accumulates per 64 (Q4_K) / 128 (Q2_K) elements, the
        # GEMV (one row) per super-block. Here the rows of a batch of >= 4 take the GEMM
        # (llama.cpp sends its last n % 4 rows through the GEMV).
        parts = (4 if w.ggml_type == _T.Q4_K else 2) if lanes.shape[0] >= 4 else 1
        a = q8.reshape(*q8.shape[:-1], parts, -1)
        b = (q.astype(jnp.int16) * sc).reshape(n_rows, nsb, parts, -1)
        total = jnp.einsum("lspe,nspe->lnsp", a, b, preferred_element_type=i32)
        total = total.reshape(*total.shape[:2], -1).astype(f32)  # [L, N, nsb·parts]
        m_total = m_sub.reshape(*m_sub.shape[:3], parts, -1).sum(-1)
        m_total = m_total.reshape(*m_total.shape[:2], -1).astype(f32)
        acc = acc_min = jnp.zeros(total.shape[:-1], f32)
        for k in range(nsb * parts):
            acc = fma(total[..., k], d[..., k // parts], acc)
            acc_min = fma(m_total[..., k], dmin[..., k // parts], acc_min)
        return (acc - acc_min).reshape(-1, n_rows)
    if kernel == "Q6_K":  # ggml subtracts 32·Σ sc·bsums, int32 lane k over sub-blocks 2k, 2k+1
        corr = jnp.einsum("lsm,nsm->lnsm", bsums, sc[..., ::16].astype(i32))
        lanes = lanes - 32 * pairs(corr)
    lanes = lanes.astype(f32)
    acc = jnp.zeros((*lanes.shape[:2], 8), f32)
    acc_m = jnp.zeros((*lanes.shape[:2], 4), f32)
    summs = jnp.zeros(lanes.shape[:2], f32)
    for b in range(nsb):
        if kernel == "Q2_K":  # 8 lanes of min sums, then the quant sums, into one accumulator
            acc = fma(-dmin[..., b, None], pairs(m_sub[..., b, :]).astype(f32), acc)
        elif kernel == "Q4_K":  # 4 lanes of min sums in their own accumulator
            acc_m = fma(-dmin[..., b, None], pairs(m_sub[..., b, :]).astype(f32), acc_m)
        elif kernel == "Q5_K":  # one scalar: summs += dmin·Σ (GCC contracts it)
            summs = fma(-dmin[..., b], m_sub[..., b, :].sum(-1).astype(f32), summs)
        acc = fma(d[..., b, None], lanes[..., b, :], acc)
    y = ggml_float.hsum8(acc)
    if kernel == "Q4_K":
        y = y + ((acc_m[..., 0] + acc_m[..., 2]) + (acc_m[..., 1] + acc_m[..., 3]))
    elif kernel == "Q5_K":
        y = y + summs
    return y.reshape(-1, n_rows)
