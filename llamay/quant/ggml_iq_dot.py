"""llamacpp numerics for the i-quants, the ternary types and MXFP4: ggml's CPU kernels
(x86, the AVX2/AVX-512 build llama.cpp's CPU backend compiles here) bit for bit.

The activations are quantised to the weight's vec_dot type (Q8_K for IQ1_S … IQ4_XS and
TQ1_0/TQ2_0, Q8_0 for IQ4_NL and MXFP4: `act_quant`), the integer block sums are exact,
and every f32 operation after them is ggml's, in ggml's order. Which kernel runs
(`kernel_for`) depends on the type, the weight's row count and x's row count n:

- "tiled" (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_XS with n >= 8):
  ggml-cpu's tiled matmul. Per super-block of 256 the exact integer
  s = Σ_sub sc_sub · Σ v·q8 (IQ1: v = 8·grid ± 1), then acc = fma(f32(s) · d_w', d_a, acc)
  super-block by super-block, d_w' = f16 d times the type's 1/8, 1/4 or 1.
- "vec" (those types with n < 8, and TQ1_0/TQ2_0 always): ggml_vec_dot_*_q8_K's AVX2
  code. Eight int32 lanes per super-block (lane l: elements 4l..4l+3 of every 32,
  scaled by their sub-block scale), acc_l = fma(f32(d_w · d_a), lane_l, acc_l), then
  hsum_float_8 times the type's 1/8 (IQ2_*), 1/4 (IQ3_XXS) or 1. IQ1_S adds
  1/8 · Σ_sb fma(d, Σ δ·sc·bsum) (a scalar accumulator), IQ1_M a second 8-lane
  accumulator of δ·sc·q8 (1/8 · its hsum); TQ's lanes hold Σ t·q8 - (two bsums of 16:
  ggml subtracts them lane-wise, a different grouping of the same total), t in 0..2.
- "repack" (IQ4_NL, MXFP4 with rows % 8 == 0: the 8x8 repack GEMV/GEMM): per block of
  32 the exact integer sum, acc = fma(isum, d_w · d_a, acc) in block order.
- "vec" for IQ4_NL/MXFP4 otherwise at n = 1: two 8-lane accumulators, even and odd
  blocks, hsum_float_8(acc_even + acc_odd), an odd last block added as fma(d, isum, .).
- "tinyblas" (IQ4_NL, rows % 8 != 0, n >= 2): llamafile's tinyBLAS_Q0_AVX, one 8-lane
  accumulator over all blocks, then its hsum (hsum_float_8's order).

n is x's real row count (`ggml_rows`; see `qtensor._ggml_kernel`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from llamay.gguf.constants import GGMLType
from llamay.quant import ggml_float
from llamay.quant.act_quant import quantize_q8_0, quantize_q8_k
from llamay.quant.iquants import PARTS, split_bits
from llamay.quant.layouts import blocks_of, jax_backend, layout_of

_T = GGMLType
#: The types of the tiled GEMM (ggml-cpu/tiled): n >= 8 rows of x.
TILED_TYPES = (_T.IQ1_S, _T.IQ1_M, _T.IQ2_XXS, _T.IQ2_XS, _T.IQ2_S, _T.IQ3_XXS, _T.IQ3_S)
TILED_TYPES += (_T.IQ4_XS,)
TERNARY_TYPES = (_T.TQ1_0, _T.TQ2_0)
Q8_0_TYPES = (_T.IQ4_NL, _T.MXFP4)
IQ_DOT_TYPES = TILED_TYPES + TERNARY_TYPES + Q8_0_TYPES
#: Factor on the vec_dot's hsum (ggml's 0.125f · / 0.25f ·), which is also the tiled
#: kernel's factor on d.
POST = {_T.IQ2_XXS: 0.125, _T.IQ2_XS: 0.125, _T.IQ2_S: 0.125, _T.IQ3_XXS: 0.25}
POST.update({_T.IQ1_S: 0.125, _T.IQ1_M: 0.125})
TILED_MIN_ROWS = 8
#: Kernel ids, as src/qmatmul_ggml_iq.cc's.
KERNELS = {"vec": 0, "tiled": 1, "repack": 2, "tinyblas": 3}


def kernel_for(t: GGMLType, n_rows: int, n: int) -> str:
    """Which of ggml's kernels computes a `t` weight of `n_rows` rows for n rows of x."""
    t = GGMLType(t)
    if t in Q8_0_TYPES:
        if n_rows % 8 == 0:
            return "repack"
        return "tinyblas" if t == _T.IQ4_NL and n >= 2 else "vec"
    if t in TILED_TYPES and n >= TILED_MIN_ROWS:
        return "tiled"
    return "vec"


def _f16(x: jax.Array) -> jax.Array:
    return x.astype(jnp.float32)


def iq_dot_parts(data: jax.Array, t: GGMLType):
    """A weight's blocks [rows, row_bytes] as ggml's integer dots read them:
    w int16 [rows, nb, B] (the sub-block scale times the value: the grid value with its
    sign; IQ1: times the grid value; TQ: the digit 0..2; IQ4_NL/MXFP4: the codebook
    value), w2 int16 or None (IQ1: sub-block scale times the ±1 delta), d f32 [rows, nb]
    (the block's f16 d; IQ1_M its assembled d; MXFP4 e8m0 / 2)."""
    bk, xp = jax_backend(), jnp
    lay = layout_of(t)
    f = lay.unpack(bk, blocks_of(bk, data, lay))
    q = PARTS[t](bk, f)[0].astype(xp.int16)  # [rows, nb, B]
    lead = q.shape[:-1]
    w2 = None
    if t == _T.IQ2_XXS:
        sc = 2 * (f["qs"].reshape(*lead, 8, 2)[..., 1] >> 28) + 1
    elif t in (_T.IQ2_XS, _T.IQ2_S):
        sc = 2 * split_bits(bk, f["scales"], (0, 4), 0xF).reshape(*lead, 16) + 1
    elif t == _T.IQ3_XXS:
        sc = 2 * (f["scales"] >> 28) + 1
    elif t == _T.IQ3_S:
        sc = 2 * split_bits(bk, f["scales"], (0, 4), 0xF).reshape(*lead, 8) + 1
    elif t == _T.IQ4_XS:
        low = split_bits(bk, f["scales_l"], (0, 4), 0xF).reshape(*lead, 8).astype(xp.int32)
        high = split_bits(bk, f["scales_h"], range(0, 16, 2), 0x3)[..., 0, :].astype(xp.int32)
        sc = (low | (high << 4)) - 32
    elif t == _T.IQ1_S:
        sc = 2 * ((f["qh"] >> 12) & 7) + 1
    elif t == _T.IQ1_M:
        sc = 2 * split_bits(bk, f["scales"], (0, 3, 6, 9), 0x7).reshape(*lead, 16) + 1
    else:
        sc = None
    if t in (_T.IQ1_S, _T.IQ1_M):  # q = 8·grid + delta
        g = (q + 4) >> 3
        delta, q = q - 8 * g, g
    if sc is not None:
        sce = jnp.repeat(sc.astype(xp.int16), q.shape[-1] // sc.shape[-1], axis=-1)
        if t in (_T.IQ1_S, _T.IQ1_M):
            w2 = (sce * delta).astype(xp.int16)
        q = (sce * q).astype(xp.int16)
    elif t in TERNARY_TYPES:
        q = q + 1
    if t == _T.IQ1_M:
        top = f["scales"] >> 12
        bits = top[..., 0] | (top[..., 1] << 4) | (top[..., 2] << 8) | (top[..., 3] << 12)
        d = jax.lax.bitcast_convert_type(bits.astype(xp.uint16), xp.float16).astype(xp.float32)
    elif t == _T.MXFP4:
        e = f["e"][..., 0].astype(xp.uint32)
        b = xp.where(e < 2, xp.uint32(0x00200000) << e, (e - 1) << 23).astype(xp.uint32)
        d = jax.lax.bitcast_convert_type(b, xp.float32)
    else:
        d = _f16(f["d"][..., 0])
    return q, w2, d


def _lanes(a: jax.Array, w: jax.Array) -> jax.Array:
    """ggml's AVX2 int32 lanes: a int8 [L, nb, B] x w int16 [N, nb, B] -> [L, N, nb, 8]
    (lane l: elements 4l..4l+3 of every 32, summed; exact)."""
    a = a.reshape(*a.shape[:-1], -1, 8, 4)
    w = w.reshape(*w.shape[:-1], -1, 8, 4)
    return jnp.einsum("lbcji,nbcji->lnbj", a, w, preferred_element_type=jnp.int32)


def _scan_blocks(step, init, *xs):
    """lax.scan of step(carry, *x_b) over the block axis (axis 2 of each [L, N, nb, ...])."""
    moved = tuple(jnp.moveaxis(x, 2, 0) for x in xs)

    def body(carry, x):
        return step(carry, *x), None

    return jax.lax.scan(body, init, moved)[0]


def iq_dot(x: jax.Array, data: jax.Array, t: GGMLType, kernel: str) -> jax.Array:
    """x [..., cols] @ W.T for GGUF blocks `data` [rows, row_bytes] of type `t` by ggml's
    `kernel` (`kernel_for`), bit for bit: [..., rows]."""
    t = GGMLType(t)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if t in Q8_0_TYPES:
        acts = quantize_q8_0(x2, "x86")
        y = _q8_0_dot(acts.qs, acts.d, data, t, kernel)
    else:
        acts = quantize_q8_k(x2)
        y = _q8_k_dot(acts.qs, acts.d, acts.sums, data, t, kernel)
    return y.reshape(*lead, -1)


def _q8_k_dot(qs, da, bsums, data, t: GGMLType, kernel: str) -> jax.Array:
    f32, fma, opaque = jnp.float32, ggml_float.fma, ggml_float.opaque
    w, w2, dw = iq_dot_parts(data, t)
    n_lead, n_rows, nsb = qs.shape[0], dw.shape[0], dw.shape[1]
    a = qs.reshape(n_lead, nsb, 256)
    da = da.reshape(n_lead, nsb)
    post = POST.get(t, 1.0)
    if kernel == "tiled":
        wt = w if w2 is None else (8 * w + w2).astype(jnp.int16)
        s = jnp.einsum("lbe,nbe->lnb", a, wt, preferred_element_type=jnp.int32).astype(f32)
        dt = dw * np.float32(post) if post != 1.0 else dw  # exact: a power of two
        r = opaque(s * dt[None])  # [L, N, nsb]

        def tiled(acc, r_b, da_b):
            return fma(r_b, da_b, acc)

        return _scan_blocks(tiled, jnp.zeros((n_lead, n_rows), f32), r, da[:, None, :])
    lanes = _lanes(a, w)  # [L, N, nsb, 8]
    if t in TERNARY_TYPES:  # minus Σ q8 over 32 elements per lane (bsums 2l, 2l+1)
        b = bsums.reshape(n_lead, nsb, 8, 2).astype(jnp.int32).sum(-1)
        lanes = lanes - b[:, None]
    d = opaque(dw[None] * da[:, None, :])  # [L, N, nsb]: f32(d_w · d_a)
    zeros8 = jnp.zeros((n_lead, n_rows, 8), f32)
    if t == _T.IQ1_S:
        s1 = jnp.einsum("lbe,nbe->lnb", a, w2, preferred_element_type=jnp.int32).astype(f32)

        def iq1s(carry, l_b, d_b, s_b):
            acc, acc1 = carry
            return fma(d_b[..., None], l_b.astype(f32), acc), fma(d_b, s_b, acc1)

        init = (zeros8, jnp.zeros((n_lead, n_rows), f32))
        acc, acc1 = _scan_blocks(iq1s, init, lanes, d, s1)
        return ggml_float.hsum8(acc) + np.float32(0.125) * acc1
    if t == _T.IQ1_M:
        lanes2 = _lanes(a, w2)

        def iq1m(carry, l_b, l2_b, d_b):
            acc1, acc2 = carry
            d8 = d_b[..., None]
            return fma(d8, l_b.astype(f32), acc1), fma(d8, l2_b.astype(f32), acc2)

        acc1, acc2 = _scan_blocks(iq1m, (zeros8, zeros8), lanes, lanes2, d)
        return ggml_float.hsum8(acc1) + np.float32(0.125) * ggml_float.hsum8(acc2)

    def vec(acc, l_b, d_b):
        return fma(d_b[..., None], l_b.astype(f32), acc)

    y = ggml_float.hsum8(_scan_blocks(vec, zeros8, lanes, d))
    return y * np.float32(post) if post != 1.0 else y


def _q8_0_dot(qs, da, data, t: GGMLType, kernel: str) -> jax.Array:
    f32, fma, opaque = jnp.float32, ggml_float.fma, ggml_float.opaque
    w, _, dw = iq_dot_parts(data, t)  # [N, nb, 32], [N, nb]
    n_lead, (n_rows, nb) = qs.shape[0], dw.shape
    a = qs.reshape(n_lead, nb, 32)
    da = da.reshape(n_lead, nb)
    d = opaque(dw[None] * da[:, None, :])  # [L, N, nb]
    if kernel == "repack":
        isum = jnp.einsum("lbe,nbe->lnb", a, w, preferred_element_type=jnp.int32).astype(f32)

        def block(acc, s_b, d_b):
            return fma(s_b, d_b, acc)

        return _scan_blocks(block, jnp.zeros((n_lead, n_rows), f32), isum, d)
    lanes = _lanes(a, w).astype(f32)  # [L, N, nb, 8]
    zeros8 = jnp.zeros((n_lead, n_rows, 8), f32)

    def lane_fma(acc, l_b, d_b):
        return fma(d_b[..., None], l_b, acc)

    if kernel == "tinyblas":
        return ggml_float.hsum8(_scan_blocks(lane_fma, zeros8, lanes, d))
    pairs = nb // 2 * 2

    def two(carry, l_even, l_odd, d_even, d_odd):
        return lane_fma(carry[0], l_even, d_even), lane_fma(carry[1], l_odd, d_odd)

    acc1, acc2 = zeros8, zeros8
    if pairs:
        lp = lanes[:, :, :pairs].reshape(n_lead, n_rows, pairs // 2, 2, 8)
        dp = d[:, :, :pairs].reshape(n_lead, n_rows, pairs // 2, 2)
        acc1, acc2 = _scan_blocks(
            two, (acc1, acc2), lp[..., 0, :], lp[..., 1, :], dp[..., 0], dp[..., 1]
        )
    y = ggml_float.hsum8(acc1 + acc2)
    if nb % 2:
        y = fma(d[..., -1], lanes[:, :, -1].sum(-1), y)  # the lane sum is exact
    return y
