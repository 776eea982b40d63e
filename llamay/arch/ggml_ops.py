"""The shared layers as llama.cpp's CPU backend computes them (numerics="llamacpp").

`llamay.arch.layers` dispatches here when a config's numerics is "llamacpp". Each
function reproduces the ggml ops of the x86 AVX-512 build (GCC, -march=native, as
llama-cpp-python builds it) bit for bit (see `llamay.quant.ggml_float` for why bit for
bit, and how XLA is kept from fusing):

- `rms_norm`: ggml_compute_forward_rms_norm_f32: Σx² of the f32 squares in double,
  mean = (float)(sum / n), scale = 1.0f / sqrtf(mean + eps), y = x·scale·w.
  `layer_norm`: ggml_compute_forward_norm_f32, then the weight and bias ops.
- `rope_angles` / `apply_rope`: ggml_rope_cache_init + rotate_pairs: θ advanced by
  repeated f32 multiplication with powf(base, -2/n_dims), cos/sin from the C library's
  cosf/sinf (a host table over the cache's positions; glibc's are not correctly
  rounded), and the rotation as GCC contracts it: fma(x0, cos, -(x1·sin)) and
  fma(x0, sin, x1·cos).
- `attention`: in `llamay.kernels.ggml_attention` (the attention entry point's
  llamacpp reference); `Q_PRESCALED` here names the families whose graph scales q first.
- `swiglu` / `geglu` / `gelu`: ggml_vec_swiglu_f32 (x / (1 + ggml_v_expf(-x)) · g) and
  GELU through ggml's f16 lookup table.
  `rms_norm`, `swiglu` and `apply_rope` run as native kernels on CPU (`llamay.kernels.elementwise`),
  bit for bit their `*_reference` here, which are their oracle and the other backends' path.
- `moe`: build_moe_ffn with ggml_soft_max's scalar tail (libm expf) and MUL_MAT_ID's
  row-by-row kernels.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

import jax
import jax.numpy as jnp
import numpy as np

from llamay.kernels import matmul
from llamay.kernels.elementwise import ggml_rms_norm, ggml_rope, ggml_swiglu
from llamay.quant.ggml_float import (
    div_pair as _div_pair,
)
from llamay.quant.ggml_float import (
    dsum,
    expf,
    fma,
    opaque,
    recip_pair,
    reduce16,
    silu,
    v_expf,
)
from llamay.quant.qtensor import ggml_matmul

F32 = jnp.float32


def rms_norm(x: jax.Array, w: jax.Array | None, eps: float) -> jax.Array:
    """`rms_norm_reference`, by the native CPU kernel where there is one (bit for bit)."""
    y = ggml_rms_norm(x, w, eps)
    return rms_norm_reference(x, w, eps) if y is None else y


def rms_norm_reference(x: jax.Array, w: jax.Array | None, eps: float) -> jax.Array:
    x = x.astype(F32)
    hi, lo = dsum(opaque(x * x))
    mean = _div_pair(hi, lo, x.shape[-1])
    scale = 1.0 / opaque(jnp.sqrt(mean + np.float32(eps)))
    y = x * scale[..., None]
    return y if w is None else y * w


def layer_norm(x: jax.Array, w: jax.Array | None, b: jax.Array | None, eps: float) -> jax.Array:
    """ggml_compute_forward_norm_f32 (then ggml_mul by w and ggml_add of b): mean =
    (float)Σx / n in f32; y = x - mean; variance = (float)(Σ(per-16 reduce of y²) / n);
    y·(1.0f / sqrtf(variance + eps))."""
    x = x.astype(F32)
    n = x.shape[-1]
    hi, lo = dsum(x)
    mean = (hi + lo) / opaque(jnp.full(hi.shape, n, F32))
    y = x - mean[..., None]
    sq = opaque(y * y)
    if n % 16 == 0:
        sq = reduce16(sq.reshape(*sq.shape[:-1], n // 16, 16))
    hi, lo = dsum(sq)
    var = _div_pair(hi, lo, n)
    y = y * (1.0 / opaque(jnp.sqrt(var + np.float32(eps))))[..., None]
    if w is not None:
        y = y * w
    if b is not None:
        y = (opaque(y) if w is not None else y) + b
    return y


# -- libm ------------------------------------------------------------------------------


@functools.cache
def _libm():
    """The C library's math functions (what ggml calls), or None where ctypes can't load it."""
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
        for name in ("cosf", "sinf", "tanhf"):
            getattr(lib, name).restype = ctypes.c_float
            getattr(lib, name).argtypes = [ctypes.c_float]
        return lib
    except (OSError, AttributeError):
        return None


def _cfloat(name: str, x: np.ndarray) -> np.ndarray:
    """libm's cosf/sinf/tanhf over an f32 array; where libm is unavailable, the correctly
    rounded value (glibc's differs from it in about 1 % of arguments, by one ulp)."""
    lib = _libm()
    x = np.asarray(x, np.float32)
    if lib is None:
        return getattr(np, name[:-1])(x.astype(np.float64)).astype(np.float32)
    fn = getattr(lib, name)
    out = np.fromiter((fn(float(v)) for v in x.ravel()), np.float32, x.size)
    return out.reshape(x.shape)


# -- rope ------------------------------------------------------------------------------


@functools.lru_cache(maxsize=16)
def _rope_table(rope, n_pos: int) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin [n_pos, n_rot/2] for positions 0..n_pos-1, as ggml_rope_cache_init makes them."""
    f32 = np.float32
    n_dims = rope.n_rot
    theta_scale = f32(np.power(np.float64(f32(rope.base)), np.float64(f32(-2.0) / f32(n_dims))))
    freq_scale = f32(rope.freq_scale)
    yarn = rope.scaling == "yarn" and rope.freq_scale != 1.0
    mscale = f32(rope.attn_factor)
    if yarn:
        corr = _yarn_corr_dims(n_dims, rope.orig_ctx, rope.base, rope.beta_fast, rope.beta_slow)
        mscale = f32(
            mscale * f32(f32(1.0) + f32(0.1) * f32(np.log(np.float64(f32(1.0) / freq_scale))))
        )
    theta = np.arange(n_pos).astype(f32)
    cos = np.empty((n_pos, n_dims // 2), f32)
    sin = np.empty((n_pos, n_dims // 2), f32)
    with np.errstate(over="ignore"):
        for i in range(n_dims // 2):
            extrap = theta
            interp = (freq_scale * extrap).astype(f32)
            t = interp
            if yarn:
                y = f32((f32(i) - corr[0]) / max(f32(0.001), f32(corr[1] - corr[0])))
                ramp = f32(1) - f32(min(1, max(0, y)))
                t = (interp * (f32(1) - ramp) + extrap * ramp).astype(f32)
            cos[:, i] = (_cfloat("cosf", t) * mscale).astype(f32)
            sin[:, i] = (_cfloat("sinf", t) * mscale).astype(f32)
            theta = (theta * theta_scale).astype(f32)
    return cos, sin


def _yarn_corr_dims(n_dims, n_ctx_orig, base, beta_fast, beta_slow):
    def dim(n_rot):
        return n_dims * np.log(n_ctx_orig / (n_rot * 2 * np.pi)) / (2 * np.log(base))

    start = max(0.0, np.floor(dim(beta_fast)))
    end = min(n_dims - 1.0, np.ceil(dim(beta_slow)))
    return np.float32(start), np.float32(end)


def rope_angles(positions: jax.Array, rope, freq_factors: jax.Array | None, n_pos: int):
    """cos/sin [..., n_rot/2] for positions [...] (< n_pos; others are padding)."""
    if freq_factors is not None:
        # llama-3 style divisors are weights, unknown on the host: θ/ff in f32 and XLA's
        # cos/sin (within an ulp of ggml's, not bit for bit).
        f32 = np.float32
        ts = f32(np.power(np.float64(f32(rope.base)), np.float64(f32(-2.0) / f32(rope.n_rot))))
        theta = positions.astype(F32)
        thetas = []
        for _ in range(rope.n_rot // 2):
            thetas.append(theta)
            theta = theta * ts
        t = jnp.stack(thetas, axis=-1) / freq_factors.astype(F32) * np.float32(rope.freq_scale)
        return jnp.cos(t) * np.float32(rope.attn_factor), jnp.sin(t) * np.float32(rope.attn_factor)
    cos, sin = _rope_table(rope, n_pos)
    idx = jnp.clip(positions, 0, n_pos - 1)
    return jnp.take(jnp.asarray(cos), idx, axis=0), jnp.take(jnp.asarray(sin), idx, axis=0)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array, kind: str) -> jax.Array:
    """`apply_rope_reference`, by the native CPU kernel where there is one (bit for bit)."""
    y = ggml_rope(x, cos, sin, kind)
    return apply_rope_reference(x, cos, sin, kind) if y is None else y


def apply_rope_reference(x: jax.Array, cos: jax.Array, sin: jax.Array, kind: str) -> jax.Array:
    """x [B, T, H, D] rotated as ggml's rotate_pairs (GCC fuses the first product)."""
    half = cos.shape[-1]
    n_rot = 2 * half
    rot, rest = x[..., :n_rot].astype(F32), x[..., n_rot:].astype(F32)
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    if kind == "norm":
        pairs = rot.reshape(*rot.shape[:-1], half, 2)
        x0, x1 = pairs[..., 0], pairs[..., 1]
    elif kind == "neox":
        x0, x1 = rot[..., :half], rot[..., half:]
    else:
        raise ValueError(f"unknown rope kind {kind!r}")
    d0 = fma(x0, c, -opaque(x1 * s))
    d1 = fma(x0, s, opaque(x1 * c))
    if kind == "norm":
        out = jnp.stack([d0, d1], axis=-1).reshape(rot.shape)
    else:
        out = jnp.concatenate([d0, d1], axis=-1)
    return jnp.concatenate([out, rest], axis=-1) if rest.shape[-1] else out


# -- attention (computed in `llamay.kernels.ggml_attention`) ---------------------------


# llama.cpp graphs that multiply q by the attention scale before K·q (kq_scale 1.0)
Q_PRESCALED = frozenset({"gemma2", "gemma3", "phi3"})


def swiglu(g: jax.Array, u: jax.Array) -> jax.Array:
    """`swiglu_reference`, by the native CPU kernel where there is one (bit for bit)."""
    y = ggml_swiglu(g, u)
    return swiglu_reference(g, u) if y is None else y


def swiglu_reference(g: jax.Array, u: jax.Array) -> jax.Array:
    return silu(g) * u


# -- GELU: ggml's f16 lookup table (GGML_GELU_FP16) --------------------------------------------


@functools.cache
def _gelu_table() -> np.ndarray:
    """ggml_table_gelu_f16: f16(ggml_gelu_f32(x)) for every f16 bit pattern x, as f32.

    ggml_gelu_f32 = 0.5f·x·(1.0f + tanhf(SQRT_2_OVER_PI·x·(1.0f + GELU_COEF_A·x·x))), with
    GCC's contraction of 1.0f + (A·x)·x into an fma; tanhf from the C library.
    """
    f32, f64 = np.float32, np.float64
    x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(f32)
    with np.errstate(all="ignore"):
        ax = (f32(0.044715) * x).astype(f32)
        inner = (ax.astype(f64) * x + 1.0).astype(f32)  # fma(A·x, x, 1)
        t = ((f32(0.79788456080286535587989211986876) * x).astype(f32) * inner).astype(f32)
        th = _cfloat("tanhf", t)
        y = ((f32(0.5) * x).astype(f32) * (f32(1) + th).astype(f32)).astype(f32)
    return y.astype(np.float16).astype(f32)


def _gelu_lookup(x: jax.Array) -> jax.Array:
    bits = jax.lax.bitcast_convert_type(x.astype(jnp.float16), jnp.uint16).astype(jnp.int32)
    return jnp.take(jnp.asarray(_gelu_table()), bits)


def gelu(x: jax.Array) -> jax.Array:
    """ggml_vec_gelu_f32: 0 below -10, x above 10, else the f16 table at f16(x)."""
    x = x.astype(F32)
    return jnp.where(x <= -10.0, 0.0, jnp.where(x >= 10.0, x, _gelu_lookup(x)))


def geglu(x: jax.Array, g: jax.Array) -> jax.Array:
    """ggml_vec_geglu_f32: gelu(x)·g with ggml's table (x·g above 10)."""
    x = x.astype(F32)
    return jnp.where(x <= -10.0, 0.0, jnp.where(x >= 10.0, x, _gelu_lookup(x)) * g)


# -- mixture of experts ----------------------------------------------------------------------


def _softmax_rows(x: jax.Array) -> jax.Array:
    """ggml_soft_max (no mask, scale 1) over the last axis: ggml_v_expf over chunks of
    16, the tail through libm's expf, the sum in double, times (float)(1.0 / sum)."""
    x = x.astype(F32)
    n = x.shape[-1]
    d = x - jnp.max(x, axis=-1, keepdims=True)
    main = n - n % 16
    parts, sums = [], []
    if main:
        e = v_expf(d[..., :main])
        parts.append(e)
        sums.append(reduce16(e.reshape(*e.shape[:-1], main // 16, 16)))
    if n > main:
        tail = expf(d[..., main:])
        parts.append(tail)
        sums.append(tail)
    e = jnp.concatenate(parts, axis=-1)
    hi, lo = dsum(jnp.concatenate(sums, axis=-1))
    return e * recip_pair(hi, lo)[..., None]


def _expert_rows(x: jax.Array, w, experts: jax.Array) -> jax.Array:
    """x [R, k] through expert experts[r] of w ([E, n, k] GGUF blocks, or one layer of a
    MixedQTensor) row by row, as ggml's MUL_MAT_ID computes it: vec_dot, or the repack
    GEMV, per row (`quant.ggml_matmul` as for one row)."""

    def one(m):
        picked = jax.tree.map(lambda a: jnp.take(a, experts, axis=0), m)  # [R, n, row]
        return jax.vmap(lambda mr, xr: ggml_matmul(xr[None], mr, batched=False)[0])(picked, x)

    return w.on_layer(one)


def expert_weights(probs: jax.Array, n_used: int) -> tuple[jax.Array, jax.Array]:
    """build_moe_ffn's routing from the router's softmax [N, E]: the n_used largest
    probabilities (ggml_argsort_top_k) divided by their sum (ggml_sum_rows: a double sum,
    rounded once; clamped at 2**-14), and the chosen experts [N, n_used]."""
    top_w, top_i = jax.lax.top_k(probs, n_used)
    hi, lo = dsum(top_w)
    total = jnp.maximum(hi + lo, np.float32(6.103515625e-5))
    # ggml_div divides. With the divisor broadcast outside the barrier, XLA rewrites
    # x / broadcast(s) as x * broadcast(1 / s): an ulp off in about half the rows, which
    # the K-quant experts after it amplify to ~0.1 in the logits.
    return top_w / opaque(jnp.broadcast_to(total[..., None], top_w.shape)), top_i


def moe(x, w_router, w_gate, w_up, w_down, n_used: int, act: str = "silu") -> jax.Array:
    """llama.cpp's build_moe_ffn (softmax gating, weights renormalised): router matmul,
    ggml_soft_max, top-k, weights / max(Σ, 2**-14), the experts' MUL_MAT_IDs (one row at
    a time), the weighted expert outputs added in selection order."""
    lead = x.shape[:-1]
    xf = x.reshape(-1, x.shape[-1]).astype(F32)
    top_w, top_i = expert_weights(_softmax_rows(matmul(xf, w_router)), n_used)
    rows = top_i.reshape(-1)  # row r = token r // k, slot r % k
    xr = jnp.repeat(xf, n_used, axis=0)
    g = _expert_rows(xr, w_gate, rows)
    u = _expert_rows(xr, w_up, rows)
    h = swiglu(g, u) if act == "silu" else geglu(g, u)
    y = _expert_rows(h, w_down, rows).reshape(xf.shape[0], n_used, -1)
    y = opaque(y * top_w[..., None])
    out = y[:, 0]
    for j in range(1, n_used):
        out = out + y[:, j]
    return out.reshape(*lead, -1)
