"""ggml's x86 CPU float arithmetic, reproduced bit for bit in f32 jnp (numerics="llamacpp").

Why bit for bit: with activations rounded to int8 blocks before every matmul, a deep
model is chaotic in the last bit of f32. One product rounded differently flips one
int8 quant, which moves that matmul's outputs by a whole quantum, which flips more
quants in the next layer. On SmolLM2 (30 layers) merely summing the same products in
another order moves the first-step logits by 0.2-0.4, as much as llama.cpp differs
from exact math. So every f32 operation upstream of a rounding is done as ggml's
AVX-512 build does it: the same operations, in the same order, with the same
fused multiply-adds.

XLA offers neither an FMA primitive nor control over its contraction of `a*b + c`
(it contracts inside fusions, and picks one of two products when both operands of
an add are products). The helpers therefore keep every product *exact* (split into
12-bit halves, Dekker-style), so contraction cannot change a result, and build the
one rounding an FMA makes from error-free sums (`two_sum`) and round-to-odd
(Boldo & Melquiond, "Emulation of FMA and correctly rounded sums", IEEE TC 2008).
The residual of the split product is itself rounded once, so a result can differ
from a true FMA when the exact value lies within 2**-48 (relative) of a rounding
boundary: about one operation in 2**24, each of which then flips a later
rounding with a probability of about 1e-4.

Also here: the horizontal sums ggml's kernels end with (`reduce16`: GCC's
`_mm512_reduce_add_ps`; `hsum8`: ggml's `hsum_float_8`), sums ggml accumulates in
double (`dsum`, kept as an unevaluated pair hi + lo), and ggml's vector `expf`
(`v_expf`, the AVX-512 variant) and SiLU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

F32 = jnp.float32
_HI12 = np.uint32(0xFFFFF000)


def _bits(x: jax.Array) -> jax.Array:
    return jax.lax.bitcast_convert_type(x, jnp.uint32)


def _float(b: jax.Array) -> jax.Array:
    return jax.lax.bitcast_convert_type(b, F32)


def two_sum(a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
    """s = RN(a + b) and the exact error e (a + b = s + e), Knuth's TwoSum."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def split(a: jax.Array) -> tuple[jax.Array, jax.Array]:
    """a = hi + lo exactly, each with at most 12 significant bits (f32 has 24)."""
    hi = _float(_bits(a) & _HI12)
    return hi, a - hi


def exact_product(a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
    """a * b = x + r exactly, x = RN(a * b) (Dekker's TwoProduct on 12-bit halves).

    x is computed by the hardware multiply and hidden from XLA (`opaque`); every other
    product is exact, so XLA contracting any of them into an FMA changes nothing."""
    x = opaque(a * b)
    ah, al = split(a)
    bh, bl = split(b)
    return x, ((ah * bh - x) + ah * bl + al * bh) + al * bl


def narrow_product(a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
    """a * b = x + r without an `opaque` (so it fuses): exact whenever the significands
    of a and b have at most 47 bits together (e.g. a product of two f16 scales times a
    16-bit integer, as in ggml's quantised dots); otherwise r is rounded once."""
    ah, al = split(a)
    bh, bl = split(b)
    s, e1 = two_sum(ah * bl, al * bh)
    x, e2 = two_sum(ah * bh, s)
    return x, e2 + (e1 + al * bl)


def _round_to_odd_add(a: jax.Array, b: jax.Array) -> jax.Array:
    """a + b rounded to odd: RN, moved one ulp toward the exact sum when inexact and even."""
    s, e = two_sum(a, b)
    bits = _bits(s)
    fix = (e != 0) & ((bits & 1) == 0)
    toward_larger = (e > 0) == (s > 0)
    moved = jnp.where(toward_larger, bits + 1, bits - 1)
    return _float(jnp.where(fix, moved, bits))


def fma(a: jax.Array, b: jax.Array, c: jax.Array, *, narrow: bool = False) -> jax.Array:
    """RN(a * b + c) with one rounding, as `_mm512_fmadd_ps` (see the module doc).

    An operand that is itself a rounded product must come through `opaque`, or XLA
    may fuse that product into the additions here. `narrow`: the product has at most
    47 significant bits (see `narrow_product`), which saves an `opaque`."""
    a, b, c = (jnp.asarray(v, F32) for v in (a, b, c))
    x, r = (narrow_product if narrow else exact_product)(a, b)
    uh, ul = two_sum(x, r)
    th, tl = two_sum(c, uh)
    return th + _round_to_odd_add(tl, ul)


def reduce16(v: jax.Array) -> jax.Array:
    """GCC's `_mm512_reduce_add_ps` over the last axis (16): halves, quarters, pairs."""
    t = v[..., 8:16] + v[..., 0:8]
    t = t[..., 4:8] + t[..., 0:4]
    return (t[..., 0] + t[..., 2]) + (t[..., 1] + t[..., 3])


def hsum8(v: jax.Array) -> jax.Array:
    """ggml's `hsum_float_8` over the last axis (8)."""
    t = v[..., 4:8] + v[..., 0:4]
    return (t[..., 0] + t[..., 2]) + (t[..., 1] + t[..., 3])


def dsum(x: jax.Array, axis: int = -1) -> tuple[jax.Array, jax.Array]:
    """The sum of f32 values over `axis` as ggml accumulates it in double, kept as an
    unevaluated pair hi + lo (a pairwise tree of `two_sum`s; relative error ~2**-46)."""
    x = jnp.moveaxis(jnp.asarray(x, F32), axis, -1)
    n = x.shape[-1]
    width = 1 << max(n - 1, 0).bit_length()
    hi = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, width - n)])
    lo = jnp.zeros_like(hi)
    while hi.shape[-1] > 1:
        s, e = two_sum(hi[..., 0::2], hi[..., 1::2])
        hi, lo = s, e + (lo[..., 0::2] + lo[..., 1::2])
    return hi[..., 0], lo[..., 0]


def opaque(x: jax.Array) -> jax.Array:
    """x, hidden from XLA's rewrites: a rounded product that will be added to something
    (else XLA may contract the pair into an FMA), or a divisor (a / b -> a * (1/b),
    1 / sqrt(b) -> rsqrt(b))."""
    return jax.lax.optimization_barrier(x)


def div_pair(hi: jax.Array, lo: jax.Array, d: int) -> jax.Array:
    """RN((hi + lo) / d) in f32 for an integer 0 < d < 2**20: ggml's `(float)(sum / n)`
    of a double sum."""
    dd = opaque(jnp.full(hi.shape, d, F32))  # a broadcast divisor would become a reciprocal
    q = hi / dd
    p, r = narrow_product(q, dd)  # q has 24 bits, d at most 20: exact
    rho = (hi - p) - r  # exact: hi and p agree in their leading bits
    return q + (rho + lo) / dd


def recip_pair(hi: jax.Array, lo: jax.Array) -> jax.Array:
    """RN(1 / (hi + lo)) in f32: ggml's `(float)(1.0 / sum)` of a double sum."""
    one = opaque(jnp.ones_like(hi))
    q = one / opaque(hi)
    p, r = exact_product(q, hi)
    rem = ((1.0 - p) - r) - q * lo  # 1 - q·(hi + lo); 1 - p is exact near 1
    return q + q * rem


# -- ggml's vector expf and SiLU (AVX-512 variants, ggml-cpu/vec.h) -------------------------


def _c(h: str) -> np.float32:
    return np.float32(float.fromhex(h))


_R = _c("0x1.8p23")
_LOG2E = _c("0x1.715476p+0")
_LN2_HI = _c("0x1.62e4p-1")
_LN2_LO = _c("0x1.7f7d1cp-20")
_P = [_c(h) for h in ("0x1.ffffecp-1", "0x1.fffdb6p-2", "0x1.555e66p-3", "0x1.573e2ep-5")]
_P5 = _c("0x1.0e4020p-7")


def v_expf(x: jax.Array) -> jax.Array:
    """ggml_v_expf (AVX-512): exp(x) with at most ~1.5 ulp error, exactly as ggml rounds."""
    x = jnp.asarray(x, F32)
    z = fma(x, _LOG2E, _R)
    n = z - _R  # round(x / ln 2), an integer
    b = fma(-n, _LN2_LO, x - n * _LN2_HI)  # n·LN2_HI is exact (LN2_HI has 16 bits)
    u = opaque(b * b)  # a rounded product, split inside fma
    j = fma(fma(fma(_P5, b, _P[3]), u, fma(_P[2], b, _P[1])), u, fma(_P[0], b, 1.0))
    # _mm512_scalef_ps(j, n) = j·2**n (subnormal results may differ; they only occur
    # for x < -87, where every use here rounds them away)
    res = jnp.ldexp(j, jnp.clip(n, -192, 192).astype(jnp.int32))
    big = jnp.abs(n) > 192
    alt = jnp.where(n <= 0, 0.0, jnp.inf).astype(F32)
    return jnp.where(big, alt, res)


def silu(x: jax.Array) -> jax.Array:
    """ggml_v_silu: x / (1 + expf(-x))."""
    x = jnp.asarray(x, F32)
    return x / opaque(1.0 + v_expf(0.0 - x))


# -- dot products of float rows, as ggml's kernels order them -------------------------------
# a [..., K] and b [..., K] broadcast against each other; the sum is over the last axis.
# "sgemm": llamafile's tinyBLAS (batches of >= 2 tokens); "vec": ggml_vec_dot_* (one token).


def _chunks(a: jax.Array, b: jax.Array, width: int, start: int = 0, stop: int | None = None):
    stop = a.shape[-1] if stop is None else stop
    for lo in range(start, stop, width):
        yield a[..., lo : lo + width], b[..., lo : lo + width]


def double_sum(parts: list[jax.Array]) -> jax.Array:
    """RN of the exact sum of the f32 terms in `parts` (each [..., m], leading dims
    broadcasting): ggml adds these in double, then rounds once."""
    lead = jnp.broadcast_shapes(*(p.shape[:-1] for p in parts))
    full = [jnp.broadcast_to(p, (*lead, p.shape[-1])) for p in parts]
    hi, lo = dsum(jnp.concatenate(full, axis=-1))
    return hi + lo


def dot_f16_sgemm(a: jax.Array, b: jax.Array) -> jax.Array:
    """tinyBLAS<16> over f16 values (exact products): 16 lanes, chunk by chunk, then
    `_mm512_reduce_add_ps` (K % 16 == 0)."""
    acc = None
    for ca, cb in _chunks(a, b, 16):
        acc = ca * cb if acc is None else acc + ca * cb
    return reduce16(acc)


def dot_f16_vec(a: jax.Array, b: jax.Array) -> jax.Array:
    """ggml_vec_dot_f16 (AVX-512): 4 accumulators of 16 lanes over steps of 64, reduced;
    the leftover K % 64 products added in double."""
    k = a.shape[-1]
    main = k - k % 64
    parts = []
    if main:
        sums = [None] * 4
        for i, (ca, cb) in enumerate(_chunks(a, b, 16, 0, main)):
            j = i % 4
            sums[j] = ca * cb if sums[j] is None else sums[j] + ca * cb
        red = reduce16((sums[0] + sums[2]) + (sums[1] + sums[3]))
        if k == main:
            return red
        parts.append(red[..., None])
    parts.append(a[..., main:] * b[..., main:])
    return double_sum(parts)


def _dpbf16(acc, ca: jax.Array, cb: jax.Array) -> jax.Array:
    """_mm512_dpbf16_ps over a 32-chunk: lane j += a[2j+1]·b[2j+1], then += a[2j]·b[2j]
    (bf16 products are exact; each add rounds)."""
    p = ca * cb
    odd, even = p[..., 1::2], p[..., 0::2]
    return even + odd if acc is None else (acc + odd) + even


def dot_bf16_sgemm(a: jax.Array, b: jax.Array) -> jax.Array:
    """tinyBLAS<32> with AVX512-BF16: dpbf16 chunk by chunk, then reduce (K % 32 == 0)."""
    acc = None
    for ca, cb in _chunks(a, b, 32):
        acc = _dpbf16(acc, ca, cb)
    return reduce16(acc)


def dot_bf16_vec(a: jax.Array, b: jax.Array) -> jax.Array:
    """ggml_vec_dot_bf16 (AVX512-BF16): two dpbf16 accumulators over steps of 64, each
    reduced and added in double with the leftover products."""
    k = a.shape[-1]
    main = k - k % 64
    c1 = c2 = None
    for lo in range(0, main, 64):
        c1 = _dpbf16(c1, a[..., lo : lo + 32], b[..., lo : lo + 32])
        c2 = _dpbf16(c2, a[..., lo + 32 : lo + 64], b[..., lo + 32 : lo + 64])
    parts = [] if c1 is None else [reduce16(c1)[..., None], reduce16(c2)[..., None]]
    if k > main:
        parts.append(a[..., main:] * b[..., main:])
    return double_sum(parts)


def dot_f32_sgemm(a: jax.Array, b: jax.Array) -> jax.Array:
    """tinyBLAS<16> over f32: fma chunk by chunk into 16 lanes, then reduce (K % 16 == 0)."""
    acc = None
    for ca, cb in _chunks(a, b, 16):
        acc = opaque(ca * cb) if acc is None else fma(ca, cb, acc)
    return reduce16(acc)


def dot_f32_vec(a: jax.Array, b: jax.Array) -> jax.Array:
    """ggml_vec_dot_f32 (AVX-512): 4 fma accumulators over steps of 64, reduced to an f32
    sum; the leftovers fma'd into it one by one (GCC contracts `sumf += x*y`)."""
    k = a.shape[-1]
    main = k - k % 64
    total = None
    if main:
        sums = [None] * 4
        for i, (ca, cb) in enumerate(_chunks(a, b, 16, 0, main)):
            j = i % 4
            sums[j] = opaque(ca * cb) if sums[j] is None else fma(ca, cb, sums[j])
        total = reduce16((sums[0] + sums[2]) + (sums[1] + sums[3]))
    for i in range(main, k):
        total = opaque(a[..., i] * b[..., i]) if total is None else fma(a[..., i], b[..., i], total)
    return total


# -- glibc's expf ------------------------------------------------------------------------
# ggml's scalar loops call libm's expf (e.g. a softmax over fewer than 16 values, as
# MoE routers have). glibc's (sysdeps/ieee754/flt-32/e_expf.c, since 2.28) works in
# double: k = round(x·32/ln 2), r = x·32/ln 2 - k, 2^(k/32) from a 32-entry table times
# a cubic in r, rounded once to float. It is not correctly rounded (about 1 in 1500
# results differ from the nearest float); this reproduces it, with double arithmetic
# emulated in pairs of f32s (differences only within ~2**-45 of a rounding boundary).


def _pair(v: float) -> tuple[np.float32, np.float32]:
    hi = np.float32(v)
    return hi, np.float32(v - float(hi))


_EXPF_N = 32
_EXPF_INVLN2N = _pair(float.fromhex("0x1.71547652b82fep+0") * _EXPF_N)
_EXPF_POLY = (("0x1.c6af84b912394p-5", 3), ("0x1.ebfce50fac4f3p-3", 2), ("0x1.62e42ff0c52d6p-1", 1))
_EXPF_C = [_pair(float.fromhex(h) / _EXPF_N**n) for h, n in _EXPF_POLY]
_EXPF_TAB = [_pair(float(np.exp2(np.float64(i) / _EXPF_N))) for i in range(_EXPF_N)]


def _fast_two_sum(a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
    s = a + b
    return s, b - (s - a)


def _dd_mul(ah, al, bh, bl):
    p, e = exact_product(ah, bh)
    return _fast_two_sum(p, e + (opaque(ah * bl) + opaque(al * bh)))


def _dd_add(ah, al, bh, bl):
    s, e = two_sum(ah, bh)
    return _fast_two_sum(s, e + (al + bl))


def expf(x: jax.Array) -> jax.Array:
    """glibc's expf, bit for bit but in the rarest cases (see above); |x| < 88."""
    x = jnp.asarray(x, F32)
    zh, zl = _dd_mul(x, jnp.zeros_like(x), *_EXPF_INVLN2N)
    k = jnp.round(zh)
    frac = (zh - k) + zl
    k = k + jnp.where(frac > 0.5, 1.0, 0.0) - jnp.where(frac < -0.5, 1.0, 0.0)
    r = _fast_two_sum(zh - k, zl)
    ki = k.astype(jnp.int32)
    i = jnp.mod(ki, _EXPF_N)
    tab = [jnp.asarray([t[j] for t in _EXPF_TAB]) for j in (0, 1)]
    s = (tab[0][i], tab[1][i])
    (c0h, c0l), (c1h, c1l), (c2h, c2l) = _EXPF_C
    z = _dd_add(*_dd_mul(*r, c0h, c0l), c1h, c1l)
    r2 = _dd_mul(*r, *r)
    y = _dd_add(*_dd_mul(*r, c2h, c2l), np.float32(1), np.float32(0))
    y = _dd_mul(*_dd_add(*_dd_mul(*z, *r2), *y), *s)
    return jnp.ldexp(y[0] + y[1], (ki - i) // _EXPF_N)
