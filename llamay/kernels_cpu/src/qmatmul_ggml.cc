// Quantised matmul y[M, N] = x[M, K] · W[N, K]ᵀ over GGUF block rows in llama.cpp's
// numerics, as XLA FFI handlers (exact numerics: qmatmul_exact.cc).
//
// LlamayQmmQ8 (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 weights), LlamayQmmQ8K (the K-quants): x
// comes in f32 and is quantised here, once per call, as ggml's x86 build does
// (quantize_row_q8_0 / q8_1 / q8_K: llamay.quant.act_quant bit for bit); then exact
// integer dots and every f32 operation after them ggml's, in ggml's order, with
// explicit FMAs and no other contraction (built with -ffp-contract=off): bit-identical
// to the XLA emulation in llamay.quant.qtensor (_q8_block_dot, _q4_0_repack_dot,
// kquant_dot_q8k), which is the tests' oracle.
//
// The integer sums are exact whatever their grouping, so they are formed the fastest
// way the CPU has (VNNI vpdpbusd/vpdpwssd, else AVX2 maddubs/madd): unsigned quants
// where a type has a bias (Q4_0's q - 8 is Σ q·a - 8·Σ a, the activation sums taken
// once per call). Only the f32 operations must keep ggml's order, and they do per
// output; outputs are computed in register tiles of R weight rows x MT activation rows
// (each weight block decoded once per tile, the activation block once per tile row).
//
// LlamayQmmGgmlMulti: several of those weights that read the same x (q, k, v; gate, up)
// in one call: x quantised once per activation type, all their rows in one split over
// the threads (one handoff instead of one per matrix); a weight whose type differs per
// layer comes as its per-type stacks, one result.
//
// LLAMAY_SCALAR (a test build) leaves out every intrinsic: the same code over GCC
// vector types with scalar lane loops for the integer dots.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "blocks.h"
#include "operands.h"
#include "parallel.h"
#include "vec16.h"
#include "xla/ffi/api/ffi.h"

#if !defined(LLAMAY_SCALAR) && defined(__AVX2__)
#include <immintrin.h>
#define LLAMAY_AVX2 1
#if defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
#define LLAMAY_VNNI 1
#endif
#if defined(__AVX512BW__) && defined(__AVX512VL__)
#define LLAMAY_AVX512BW 1
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VNNI__) && \
    !defined(LLAMAY_NO_ZMM_TILE)
#define LLAMAY_ZMM_TILE 1  // two activation rows per 512-bit register (q8_tile_zmm)
#endif
#endif
// Row tasks are whole multiples of this (the transposed tiles' groups of 16 weight rows)
#if defined(LLAMAY_ZMM_TILE)
#define LLAMAY_ZMM_ROWS 16
#else
#define LLAMAY_ZMM_ROWS 2
#endif

namespace ffi = xla::ffi;

namespace llamay {
namespace {

typedef int32_t v8i __attribute__((vector_size(32)));
typedef float v8f __attribute__((vector_size(32)));
typedef int8_t v32b __attribute__((vector_size(32)));
typedef int16_t v16h __attribute__((vector_size(32)));

template <class V>
inline V ld(const void* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class V>
inline void st(void* p, V v) {
  std::memcpy(p, &v, sizeof v);
}
inline v8f splat(float f) { return (v8f){f, f, f, f, f, f, f, f}; }  // (not 0 + f: -0)
inline v8f cvt(v8i v) { return __builtin_convertvector(v, v8f); }
inline v8f fma8(v8f a, v8f b, v8f c) {
#if defined(LLAMAY_AVX2)
  return (v8f)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
  v8f r;
  for (int i = 0; i < 8; ++i) r[i] = std::fmaf(a[i], b[i], c[i]);
  return r;
#endif
}
// ggml's hsum_float_8.
inline float hsum8(v8f v) {
  const float t0 = v[4] + v[0], t1 = v[5] + v[1], t2 = v[6] + v[2], t3 = v[7] + v[3];
  return (t0 + t2) + (t1 + t3);
}
inline int32_t hsum_i(v8i v) {  // integers: any order
#if defined(LLAMAY_AVX2)
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128((__m256i)v), _mm256_extracti128_si256((__m256i)v, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
  return _mm_cvtsi128_si32(s);
#else
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
#endif
}

// -- integer lane sums (exact) --------------------------------------------------------
// Lane l of a 32-byte chunk: Σ_{i<4} w[4l+i]·a[4l+i].

// acc + lanes of w (unsigned bytes) times a (signed); the maddubs fallback needs every
// pair sum w[2i]·a[2i] + w[2i+1]·a[2i+1] within int16 (w <= 128 here).
inline v8i dot_u(v8i acc, v32b w, v32b a) {
#if defined(LLAMAY_VNNI) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return (v8i)_mm256_dpbusd_epi32((__m256i)acc, (__m256i)w, (__m256i)a);
#elif defined(LLAMAY_VNNI)
  return (v8i)_mm256_dpbusd_avx_epi32((__m256i)acc, (__m256i)w, (__m256i)a);
#elif defined(LLAMAY_AVX2)
  const __m256i p = _mm256_maddubs_epi16((__m256i)w, (__m256i)a);
  return acc + (v8i)_mm256_madd_epi16(p, _mm256_set1_epi16(1));
#else
  for (int l = 0; l < 8; ++l)
    for (int i = 0; i < 4; ++i) acc[l] += (int32_t)(uint8_t)w[4 * l + i] * a[4 * l + i];
  return acc;
#endif
}
// Both signed, |w| <= 127 and a > -128 (ggml's Q8 quants are): |w| times a with w's sign.
inline v8i dot_s(v8i acc, v32b w, v32b a) {
#if defined(LLAMAY_AVX2)
  return dot_u(acc, (v32b)_mm256_sign_epi8((__m256i)w, (__m256i)w), (v32b)_mm256_sign_epi8((__m256i)a, (__m256i)w));
#else
  for (int l = 0; l < 8; ++l)
    for (int i = 0; i < 4; ++i) acc[l] += (int32_t)w[4 * l + i] * a[4 * l + i];
  return acc;
#endif
}
// acc + Σ over int16 pairs of w·a (unsigned x signed bytes), each pair times sc: lane l
// gains sc[2l]·(w0a0 + w1a1) + sc[2l+1]·(w2a2 + w3a3). Pair sums within int16.
inline v8i dot_u_scaled(v8i acc, v32b w, v32b a, v16h sc) {
#if defined(LLAMAY_AVX2)
  const __m256i p = _mm256_maddubs_epi16((__m256i)w, (__m256i)a);
#if defined(LLAMAY_VNNI) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return (v8i)_mm256_dpwssd_epi32((__m256i)acc, p, (__m256i)sc);
#elif defined(LLAMAY_VNNI)
  return (v8i)_mm256_dpwssd_avx_epi32((__m256i)acc, p, (__m256i)sc);
#else
  return acc + (v8i)_mm256_madd_epi16(p, (__m256i)sc);
#endif
#else
  for (int l = 0; l < 8; ++l)
    for (int h = 0; h < 2; ++h) {
      const int e = 4 * l + 2 * h;
      const int32_t pair = (int32_t)(uint8_t)w[e] * a[e] + (int32_t)(uint8_t)w[e + 1] * a[e + 1];
      acc[l] += pair * sc[2 * l + h];
    }
  return acc;
#endif
}
inline v8i dot_s_scaled(v8i acc, v32b w, v32b a, v16h sc) {
#if defined(LLAMAY_AVX2)
  return dot_u_scaled(acc, (v32b)_mm256_sign_epi8((__m256i)w, (__m256i)w),
                      (v32b)_mm256_sign_epi8((__m256i)a, (__m256i)w), sc);
#else
  for (int l = 0; l < 8; ++l)
    for (int i = 0; i < 4; ++i) acc[l] += (int32_t)w[4 * l + i] * a[4 * l + i] * sc[2 * l + i / 2];
  return acc;
#endif
}
// _mm256_madd_epi16: lane l = a[2l]·b[2l] + a[2l+1]·b[2l+1].
inline v8i madd16(v16h a, v16h b) {
#if defined(LLAMAY_AVX2)
  return (v8i)_mm256_madd_epi16((__m256i)a, (__m256i)b);
#else
  v8i r;
  for (int l = 0; l < 8; ++l) r[l] = (int32_t)a[2 * l] * b[2 * l] + (int32_t)a[2 * l + 1] * b[2 * l + 1];
  return r;
#endif
}

// -- the activations, quantised once per call --------------------------------------------

inline uint16_t f32_to_f16(float f) {  // round to nearest even, as numpy's astype
#if defined(__F16C__) && !defined(LLAMAY_SCALAR)
  return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000, ax = x & 0x7FFFFFFF;
  if (ax >= 0x7F800000) return sign | (ax > 0x7F800000 ? 0x7E00 : 0x7C00);
  if (ax >= 0x477FF000) return sign | 0x7C00;  // 65520 and up: infinity
  if (ax <= 0x33000000) return sign;           // 2^-25 and below: zero (the tie to even)
  const int e = (int)(ax >> 23);
  const uint32_t mant = (ax & 0x7FFFFF) | 0x800000;
  const int shift = e < 113 ? 126 - e : 13;  // f16 subnormal below 2^-14
  uint32_t r = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (e >= 113) r = ((uint32_t)(e - 112) << 10) | (r & 0x3FF);
  if (rem > half || (rem == half && (r & 1))) ++r;  // a carry moves into the exponent
  return (uint16_t)(sign | r);
#endif
}

// The activations of one call: quants qs [M, K]; per 32-block (Q8_0/Q8_1) d (the f16
// scale widened), s (Q8_1: f16(d·Σq)) and `bias` times the lane sums of the quants
// (for the unsigned-quant dots of Q4_0/Q5_0), [M, K/32, 8]; per 256-block (Q8_K) d,
// the 16 bsums and the 8 sums of 32 (Q4_K/Q5_K's sub-blocks).
struct Acts {
  std::vector<int8_t> qs;
  std::vector<float> d, s, st;  // st: Q8_1's s again, [K/32, Mp] (Mp = M rounded up to 8)
  int64_t mp = 0;
  std::vector<int32_t> corr;
  std::vector<int16_t> bsums, bs32;
};

// ggml's x86 quantize_row_q8_0 / q8_1: id = 127/amax, quants rounded to nearest even
// (the same products and roundings 16 lanes at a time where AVX-512 is there).
void quantize_q8(const float* x, int64_t row, int64_t k, bool q8_1, int bias, Acts& a) {
  const int64_t nb = k / 32;
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t i = row * nb + b;
    const float* xb = x + i * 32;
    int8_t* q = &a.qs[i * 32];
    int32_t total = 0;
    float amax = 0.0f;
#if defined(LLAMAY_ZMM_TILE)
    const __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
    amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
    const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const __m512 idv = _mm512_set1_ps(id);
    const auto quant = [&](__m512 v) {  // nearbyint (the rounding mode: to nearest even)
      return _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(v, idv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    };
    const __m512i q0 = quant(x0), q1 = quant(x1);
    _mm_storeu_si128((__m128i*)q, _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128((__m128i*)(q + 16), _mm512_cvtepi32_epi8(q1));
    total = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
#else
    for (int e = 0; e < 32; ++e) amax = std::max(amax, std::fabs(xb[e]));
    const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
    for (int e = 0; e < 32; ++e) {
      q[e] = (int8_t)std::nearbyint(xb[e] * id);
      total += q[e];
    }
#endif
    a.d[i] = f16_to_f32(f32_to_f16(d));
    if (q8_1) a.s[i] = a.st[b * a.mp + row] = f16_to_f32(f32_to_f16((float)total * d));
    if (bias)
      for (int l = 0; l < 8; ++l)
        a.corr[i * 8 + l] = -bias * (q[4 * l] + q[4 * l + 1] + q[4 * l + 2] + q[4 * l + 3]);
  }
}

// ggml's quantize_row_q8_K_ref: iscale = -127 / (the first element of largest magnitude).
void quantize_q8k(const float* x, int64_t row, int64_t k, Acts& a) {
  const int64_t nsb = k / 256;
  for (int64_t b = 0; b < nsb; ++b) {
    const int64_t i = row * nsb + b;
    const float* xb = x + i * 256;
    float amax = 0.0f, mx = 0.0f;
    int8_t* q = &a.qs[i * 256];
#if defined(LLAMAY_ZMM_TILE)
    __m512 v[16], m = _mm512_setzero_ps();
    for (int c = 0; c < 16; ++c) v[c] = _mm512_loadu_ps(xb + 16 * c), m = _mm512_max_ps(m, _mm512_abs_ps(v[c]));
    amax = _mm512_reduce_max_ps(m);
    for (int c = 0; c < 16 && amax > 0.0f; ++c)  // the first element of that magnitude
      if (const __mmask16 hit = _mm512_cmp_ps_mask(_mm512_abs_ps(v[c]), _mm512_set1_ps(amax), _CMP_EQ_OQ)) {
        mx = xb[16 * c + __builtin_ctz(hit)];
        break;
      }
    if (mx == 0.0f) {
      a.d[i] = 0.0f;
      std::memset(q, 0, 256);
      for (int s = 0; s < 16; ++s) a.bsums[i * 16 + s] = 0;
    } else {
      const float iscale = -127.0f / mx;
      const __m512 is = _mm512_set1_ps(iscale), top = _mm512_set1_ps(127.0f);
      for (int c = 0; c < 16; ++c) {
        const __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(is, v[c]), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m512i qi = _mm512_cvtps_epi32(_mm512_min_ps(r, top));
        _mm_storeu_si128((__m128i*)(q + 16 * c), _mm512_cvtepi32_epi8(qi));
        a.bsums[i * 16 + c] = (int16_t)_mm512_reduce_add_epi32(qi);
      }
      a.d[i] = 1.0f / iscale;
    }
#else
    for (int e = 0; e < 256; ++e) {
      const float v = std::fabs(xb[e]);
      if (amax < v) amax = v, mx = xb[e];
    }
    if (mx == 0.0f) {
      a.d[i] = 0.0f;
      std::memset(q, 0, 256);
    } else {
      const float iscale = -127.0f / mx;
      for (int e = 0; e < 256; ++e) q[e] = (int8_t)std::min(std::nearbyint(iscale * xb[e]), 127.0f);
      a.d[i] = 1.0f / iscale;
    }
    for (int s = 0; s < 16; ++s) {
      int32_t t = 0;
      for (int e = 0; e < 16; ++e) t += q[16 * s + e];
      a.bsums[i * 16 + s] = (int16_t)t;
    }
#endif
    for (int s = 0; s < 8; ++s) a.bs32[i * 16 + s] = (int16_t)(a.bsums[i * 16 + 2 * s] + a.bsums[i * 16 + 2 * s + 1]);
    for (int s = 8; s < 16; ++s) a.bs32[i * 16 + s] = 0;
  }
}

// Quantise all M rows (over the pool when there are many).
template <class F>
void each_row(ffi::ThreadPool& pool, int64_t m, int64_t k, F&& f) {
  const int64_t per = std::max<int64_t>(1, 16384 / std::max<int64_t>(k, 1));  // rows per task
  const int64_t tasks = (m + per - 1) / per;
  parallel_for(pool, tasks, [&](int64_t t) {
    for (int64_t r = t * per; r < std::min(m, (t + 1) * per); ++r) f(r);
  });
}

// -- threads -------------------------------------------------------------------------

// Tasks of whole row tiles, a few per thread (uneven progress evens out); one task when
// the whole call is a few microseconds of work (waking XLA's pool costs more than that).
int64_t rows_per_task(int64_t n, int64_t threads, int64_t multiple, int64_t work) {
  if (work < (int64_t)1 << 17) return (n + multiple - 1) / multiple * multiple;
  int64_t per = (n + 4 * threads - 1) / (4 * threads);
  per = std::max<int64_t>(per, 16);
  return (per + multiple - 1) / multiple * multiple;
}

struct Dims {
  int64_t m, k, n, row_bytes;
};

ffi::Error check(int32_t type, const Dims& d) {
  if (block_elems(type) == 0) return ffi::Error::InvalidArgument("llamay kernels: unsupported weight type");
  if (d.k % block_elems(type) || d.k / block_elems(type) * block_bytes(type) != d.row_bytes)
    return ffi::Error::InvalidArgument("llamay kernels: x's last dim does not match the weight rows");
  return ffi::Error::Success();
}

template <class XBuf>
Dims dims_of(const XBuf& x, const Weight& w) {
  auto xd = x.dimensions();
  const int64_t k = xd.size() == 0 ? 1 : xd.back();
  return {k ? (int64_t)x.element_count() / k : 0, k, w.n, w.row_bytes};
}

// Tile shapes: R weight rows x MT activation rows of f32 accumulators (<= 16 vectors).
// One row at M = 1: weight rows read in order (several at once measured slower there).
constexpr int rows_for(int mt) { return mt == 1 ? 1 : mt <= 4 ? 4 : 2; }

// -- 32-element blocks x Q8_0 / Q8_1 ----------------------------------------------------

// A block's quants in element order: unsigned for Q4_0/Q4_1/Q5_0/Q5_1 (the _0 types'
// bias is taken off through the activations' lane sums), signed for Q8_0.
template <int32_t T>
inline v32b quants32(const uint8_t* b) {
  if (T == Q8_0) return ld<v32b>(b + 2);
  constexpr int qs = T == Q4_0 ? 2 : T == Q4_1 ? 4 : T == Q5_0 ? 6 : 8;
#if defined(LLAMAY_AVX2)
  if (T == Q5_0 || T == Q5_1) {
    uint32_t bits;
    std::memcpy(&bits, b + qs - 4, 4);
    return (v32b)q5_quants32(b + qs, bits);
  }
  // the 16 bytes in both halves, the upper shifted right by 4 (a 64-bit shift: the bits
  // it moves across bytes are masked off), low nibbles then high ones
  const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(b + qs)));
  const __m256i q = _mm256_and_si256(_mm256_srlv_epi64(v, _mm256_set_epi64x(4, 4, 0, 0)), _mm256_set1_epi8(0xF));
  return (v32b)q;
#else
  v32b q;
  uint32_t qh = 0;
  if (T == Q5_0 || T == Q5_1) std::memcpy(&qh, b + qs - 4, 4);
  for (int j = 0; j < 16; ++j) {
    q[j] = (int8_t)((b[qs + j] & 0xF) | (((qh >> j) & 1) << 4));
    q[j + 16] = (int8_t)((b[qs + j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
  }
  return q;
#endif
}

struct Q8Job {
  Acts* a;
  const uint8_t* w;
  float* y;
  Dims d;
  int64_t nb;
};

// Outputs rows [r0, r0 + R) x activation rows [m0, m0 + MT) of weight type T:
// vec_dot_{q4_0,q5_0,q8_0}_q8_0 / {q4_1,q5_1}_q8_1 (AVX2 lanes: acc_l = fma(d_w·d_a,
// xy_l, acc_l) block by block, hsum_float_8, + Σ m_w·s_a for the _1 types) or, WHOLE,
// the Q4_0x8 repack GEMV/GEMM (acc = fma(Σ_block, d_w·d_a, acc)).
template <int32_t T, int R, int MT, bool WHOLE>
void q8_tile(const Q8Job& j, int64_t r0, int64_t m0, int64_t rs = 1) {
  constexpr bool has_m = T == Q4_1 || T == Q5_1;
  constexpr bool biased = T == Q4_0 || T == Q5_0;
  constexpr int bb = T == Q4_0 ? 18 : T == Q4_1 ? 20 : T == Q5_0 ? 22 : T == Q5_1 ? 24 : 34;
  const int64_t nb = j.nb, k = j.d.k;
  const Acts& a = *j.a;
  v8f acc[R][MT] = {};
  float sacc[R][MT] = {};  // WHOLE: the accumulator; _1 types at MT = 1: Σ m·s
  v8f msum[R] = {};        // _1 types at MT > 1: Σ m·s, activation row m in lane m
  const uint8_t* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = j.w + (r0 + r * rs) * j.d.row_bytes;
  for (int64_t b = 0; b < nb; ++b) {
    v32b q[R];
    float dw[R], mw[R];
    for (int r = 0; r < R; ++r) {
      const uint8_t* blk = rows[r] + b * bb;
      if (R > 1 && rs == 1) prefetch(blk + R * j.d.row_bytes);
      if (rs > 1) prefetch(blk + PREFETCH_AHEAD);  // two runs of rows at once
      q[r] = quants32<T>(blk);
      dw[r] = rdf16(blk);
      mw[r] = has_m ? rdf16(blk + 2) : 0.0f;
    }
    if (has_m && MT > 1) {  // Σ m·s for the tile's activation rows, one per lane
      const v8f s8 = ld<v8f>(&a.st[b * a.mp + m0]);
      for (int r = 0; r < R; ++r) msum[r] = msum[r] + s8 * splat(mw[r]);
    }
    for (int m = 0; m < MT; ++m) {
      const int64_t i = (m0 + m) * nb + b;
      const v32b av = ld<v32b>(&a.qs[i * 32]);
      const v8i init = biased ? ld<v8i>(&a.corr[i * 8]) : (v8i){};
      const float da = a.d[i];
      for (int r = 0; r < R; ++r) {
        const v8i l = T == Q8_0 ? dot_s(init, q[r], av) : dot_u(init, q[r], av);
        if (WHOLE) {
          sacc[r][m] = std::fmaf((float)hsum_i(l), da * dw[r], sacc[r][m]);
        } else {
          acc[r][m] = fma8(splat(da) * splat(dw[r]), cvt(l), acc[r][m]);
          if (has_m && MT == 1) sacc[r][m] = sacc[r][m] + a.s[i] * mw[r];
        }
      }
    }
  }
  for (int m = 0; m < MT; ++m)
    for (int r = 0; r < R; ++r) {
      float y = WHOLE ? sacc[r][m] : hsum8(acc[r][m]);
      if (!WHOLE && has_m) y = y + (MT == 1 ? sacc[r][m] : msum[r][m]);
      j.y[(m0 + m) * j.d.n + r0 + r * rs] = y;
    }
}

#if defined(LLAMAY_ZMM_TILE)
// q8_tile (not WHOLE) for MT >= 2 with two activation rows per 512-bit register: the
// 256-bit half h of pair p holds output (r, m0 + 2p + h), its eight lanes what q8_tile's
// acc[r][m] holds, through the same integer sums, products and FMAs (so the same bits),
// in half the instructions (session 11, Zen 4, Q5_0 / Q8_0 2048 x 640: 1.03-1.26x at
// M = 2, 8, 128; odd M measured 0.8x, so q8_tile keeps them).
template <int32_t T, int R, int MT>
void q8_tile_zmm(const Q8Job& j, int64_t r0, int64_t m0) {
  constexpr bool has_m = T == Q4_1 || T == Q5_1;
  constexpr bool biased = T == Q4_0 || T == Q5_0;
  constexpr int bb = T == Q4_0 ? 18 : T == Q4_1 ? 20 : T == Q5_0 ? 22 : T == Q5_1 ? 24 : 34;
  static_assert(MT % 2 == 0, "pairs of activation rows");
  constexpr int P = MT / 2;
  const int64_t nb = j.nb;
  const Acts& a = *j.a;
  __m512 acc[R][P];
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_ps();
  v8f msum[R] = {};
  const uint8_t* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = j.w + (r0 + r) * j.d.row_bytes;
  const int8_t* qa[MT];
  const int32_t* corr[MT];
  const float* da[MT];
  for (int h = 0; h < MT; ++h) {
    const int64_t m = m0 + h;
    qa[h] = &a.qs[m * nb * 32];
    corr[h] = biased ? &a.corr[m * nb * 8] : nullptr;
    da[h] = &a.d[m * nb];
  }
  for (int64_t b = 0; b < nb; ++b) {
    __m512i q[R];
    __mmask64 neg[R];
    __m512 dw[R];
    float mw[R];
    for (int r = 0; r < R; ++r) {
      const uint8_t* blk = rows[r] + b * bb;
      prefetch(blk + R * j.d.row_bytes);
      q[r] = _mm512_broadcast_i64x4((__m256i)quants32<T>(blk));
      if (T == Q8_0) {  // dot_s: |w| times a with w's sign
        neg[r] = _mm512_movepi8_mask(q[r]);
        q[r] = _mm512_abs_epi8(q[r]);
      }
      dw[r] = _mm512_set1_ps(rdf16(blk));
      mw[r] = has_m ? rdf16(blk + 2) : 0.0f;
    }
    if (has_m) {
      const v8f s8 = ld<v8f>(&a.st[b * a.mp + m0]);
      for (int r = 0; r < R; ++r) msum[r] = msum[r] + s8 * splat(mw[r]);
    }
    for (int p = 0; p < P; ++p) {
      const int h0 = 2 * p, h1 = 2 * p + 1;
      const __m512i av = _mm512_inserti64x4(
          _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)(qa[h0] + b * 32))),
          _mm256_loadu_si256((const __m256i*)(qa[h1] + b * 32)), 1);
      const __m512i init =
          biased ? _mm512_inserti64x4(
                       _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)(corr[h0] + b * 8))),
                       _mm256_loadu_si256((const __m256i*)(corr[h1] + b * 8)), 1)
                 : _mm512_setzero_si512();
      const __m512 dap = _mm512_insertf32x8(_mm512_set1_ps(da[h0][b]), _mm256_set1_ps(da[h1][b]), 1);
      for (int r = 0; r < R; ++r) {
        const __m512i as = T == Q8_0 ? _mm512_mask_sub_epi8(av, neg[r], _mm512_setzero_si512(), av) : av;
        const __m512i l = _mm512_dpbusd_epi32(init, q[r], as);
        acc[r][p] = _mm512_fmadd_ps(_mm512_mul_ps(dap, dw[r]), _mm512_cvtepi32_ps(l), acc[r][p]);
      }
    }
  }
  for (int p = 0; p < P; ++p)
    for (int h = 0; h < 2; ++h) {
      const int m = 2 * p + h;
      for (int r = 0; r < R; ++r) {
        const v8f half = (v8f)(h ? _mm512_extractf32x8_ps(acc[r][p], 1) : _mm512_castps512_ps256(acc[r][p]));
        float y = hsum8(half);
        if (has_m) y = y + msum[r][m];
        j.y[(m0 + m) * j.d.n + r0 + r] = y;
      }
    }
}
#endif

#if defined(LLAMAY_ZMM_TILE)
// The next group's weight bytes, prefetched a slice per block as the tiles run. Issued
// all at once from decode (as before session 13), the prefetches stalled it on the fill
// buffers and the tiles then ran with the memory idle: the two took turns with DRAM
// (the Gemma 3 head at 8 rows ~ compute + transfer time).
struct Ahead {
  const uint8_t* p = nullptr;
  int64_t per = 0;  // bytes per block, whole lines
  void at(int64_t b) const {
    for (int64_t o = 0; o < per; o += 64) __builtin_prefetch(p + b * per + o, 0, 2);  // to L2 (t1: 6 % faster than t0)
  }
};

// q8_tile (not WHOLE) transposed, for 2+ activation rows: 16 weight rows per register,
// one register per lane l of the block (ggml's acc_l), so that a 512-bit vpdpbusd forms
// lane l of 16 outputs from the weights' lane-l bytes and one broadcast dword of x, and
// d = d_a·d_w is one multiply per 16 outputs and block, shared by the 8 lanes. Each
// output's integer lane sums, products, FMAs and final hsum8 are q8_tile's, in its
// order (the same bits); per lane and block 3 vector ops instead of q8_tile_zmm's 4,
// and the weights are decoded once per call instead of once per 8 activation rows.
//
// A group of 16 weight rows is first decoded into TBlocks: per block, w[l] = dword l
// (4 quants) of each of the 16 rows, unsigned as dot_u reads them (Q8_0: w + 128, its
// bias taken off through the activations' lane sums, -128·Σa), and the rows' scales.
struct alignas(64) TBlock {
  __m512i w[8];
  __m512 dw, mw;
};

// 16 rows of 8 dwords (q[n], lane l at dword l) -> out[l] = lane l of rows 0..15.
inline void transpose16x8(const __m256i* q, __m512i* out) {
  __m512i p[8];  // rows 2i (low half) and 2i + 1 (high half)
  for (int i = 0; i < 8; ++i) p[i] = _mm512_inserti64x4(_mm512_castsi256_si512(q[2 * i]), q[2 * i + 1], 1);
  // vpermt2d indices (stage, which of two outputs): stage 1 takes rows 4g..4g+3 of two
  // pairs to [lane][row] for lanes 0-3 / 4-7; stage 2 rows 8g..8g+7 of two stage-1
  // results, their lanes (0,1) / (2,3); stage 3 rows 0..15, the first / second lane
  static constexpr auto idx = [] {
    struct { alignas(64) int32_t v[3][2][16]; } t{};
    for (int h = 0; h < 2; ++h)
      for (int r = 0; r < 16; ++r) {
        t.v[0][h][r] = (r % 4 / 2) * 16 + (r % 2) * 8 + 4 * h + r / 4;
        t.v[1][h][r] = (r % 8 / 4) * 16 + 4 * (2 * h + r / 8) + r % 4;
        t.v[2][h][r] = (r / 8) * 16 + 8 * h + r % 8;
      }
    return t;
  }();
  const __m512i a1 = _mm512_load_si512(idx.v[0][0]), b1 = _mm512_load_si512(idx.v[0][1]);
  const __m512i a2 = _mm512_load_si512(idx.v[1][0]), b2 = _mm512_load_si512(idx.v[1][1]);
  const __m512i a3 = _mm512_load_si512(idx.v[2][0]), b3 = _mm512_load_si512(idx.v[2][1]);
  __m512i s1[2][4];  // [lanes 0-3 / 4-7][row group g]
  for (int g = 0; g < 4; ++g) {
    s1[0][g] = _mm512_permutex2var_epi32(p[2 * g], a1, p[2 * g + 1]);
    s1[1][g] = _mm512_permutex2var_epi32(p[2 * g], b1, p[2 * g + 1]);
  }
  for (int h = 0; h < 2; ++h) {      // lanes 4h..4h+3
    __m512i s2[2][2];                // [row half][lane pair]
    for (int g = 0; g < 2; ++g) {
      s2[g][0] = _mm512_permutex2var_epi32(s1[h][2 * g], a2, s1[h][2 * g + 1]);
      s2[g][1] = _mm512_permutex2var_epi32(s1[h][2 * g], b2, s1[h][2 * g + 1]);
    }
    for (int pr = 0; pr < 2; ++pr) {  // lanes 4h + 2pr, 4h + 2pr + 1
      out[4 * h + 2 * pr] = _mm512_permutex2var_epi32(s2[0][pr], a3, s2[1][pr]);
      out[4 * h + 2 * pr + 1] = _mm512_permutex2var_epi32(s2[0][pr], b3, s2[1][pr]);
    }
  }
}

template <int32_t T>
void t_decode(const Q8Job& j, int64_t r0, TBlock* tb) {
  constexpr bool has_m = T == Q4_1 || T == Q5_1;
  constexpr int bb = T == Q4_0 ? 18 : T == Q4_1 ? 20 : T == Q5_0 ? 22 : T == Q5_1 ? 24 : 34;
  const uint8_t* row0 = j.w + r0 * j.d.row_bytes;
  const int64_t rb = j.d.row_bytes, nb = j.nb;
  const __m512i starts = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                            _mm512_set1_epi32((int)rb));
  // each block's 16 rows (in L2: the tiles prefetched them, Ahead) transposed: loaded
  // straight from the weight (7 % faster on the Gemma 3 head at 8 rows than copying the
  // rows in order to the TBlocks first, for the hardware prefetchers, as before)
  for (int64_t b = 0; b < nb; ++b) {
    __m256i rows[16];
    for (int r = 0; r < 16; ++r) rows[r] = (__m256i)quants32<T>(row0 + r * rb + b * bb);
    transpose16x8(rows, tb[b].w);
    if (T == Q8_0)
      for (int l = 0; l < 8; ++l) tb[b].w[l] = _mm512_xor_si512(tb[b].w[l], _mm512_set1_epi8((char)0x80));
    // the 16 rows' d (and m) in one gather: f16 d in the low half of each dword, m above
    const __m512i dm = _mm512_i32gather_epi32(starts, row0 + b * bb, 1);
    tb[b].dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm));
    if (has_m) tb[b].mw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16)));
  }
}

// Outputs rows [r0, r0 + 16) x activation rows [m0, m0 + TT) over the decoded group.
template <int32_t T, int TT>
void t_tile(const Q8Job& j, const TBlock* tb, int64_t r0, int64_t m0, const Ahead& ahead) {
  constexpr bool has_m = T == Q4_1 || T == Q5_1;
  constexpr bool biased = T != Q4_1 && T != Q5_1;  // Q8_0 too (w + 128)
  const int64_t nb = j.nb;
  const Acts& a = *j.a;
  __m512 acc[TT][8], msum[TT];
  for (int t = 0; t < TT; ++t) {
    msum[t] = _mm512_setzero_ps();
    for (int l = 0; l < 8; ++l) acc[t][l] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < nb; ++b) {
    ahead.at(b);
    __m512i w[8];
    for (int l = 0; l < 8; ++l) w[l] = _mm512_load_si512(&tb[b].w[l]);
    const __m512 dw = tb[b].dw;
    for (int t = 0; t < TT; ++t) {
      const int64_t i = (m0 + t) * nb + b;
      const int32_t* qa = (const int32_t*)&a.qs[i * 32];
      const int32_t* corr = biased ? &a.corr[i * 8] : nullptr;
      const __m512 d = _mm512_mul_ps(_mm512_set1_ps(a.d[i]), dw);
      for (int l = 0; l < 8; ++l) {
        const __m512i init = biased ? _mm512_set1_epi32(corr[l]) : _mm512_setzero_si512();
        const __m512i s = _mm512_dpbusd_epi32(init, w[l], _mm512_set1_epi32(qa[l]));
        acc[t][l] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s), acc[t][l]);
      }
      if (has_m) msum[t] = _mm512_add_ps(msum[t], _mm512_mul_ps(_mm512_set1_ps(a.s[i]), tb[b].mw));
    }
  }
  for (int t = 0; t < TT; ++t) {  // hsum8's order, 16 outputs at once
    const __m512 t0 = _mm512_add_ps(acc[t][4], acc[t][0]), t1 = _mm512_add_ps(acc[t][5], acc[t][1]);
    const __m512 t2 = _mm512_add_ps(acc[t][6], acc[t][2]), t3 = _mm512_add_ps(acc[t][7], acc[t][3]);
    __m512 y = _mm512_add_ps(_mm512_add_ps(t0, t2), _mm512_add_ps(t1, t3));
    if (has_m) y = _mm512_add_ps(y, msum[t]);
    _mm512_storeu_ps(j.y + (m0 + t) * j.d.n + r0, y);
  }
}

// Whole groups of 16 weight rows in [n0, n1) (at w, rb bytes a row) against all m
// activation rows: each group decoded into `blocks` Blocks, then tile(blocks, r0, m0,
// rows, ahead) over pairs of activation rows and a last single one (rows:
// std::integral_constant 2 or 1), each tile prefetching its share of the next group.
// Returns the first row not done (fewer than 16 left).
template <class Block, class Decode, class Tile>
int64_t sixteen_row_groups(const uint8_t* w, int64_t rb, int64_t n0, int64_t n1, int64_t blocks, int64_t m,
                           Decode decode, Tile tile) {
  if (n1 - n0 < 16) return n0;
  std::vector<Block> tb(blocks);
  const int64_t passes = (m + 1) / 2, steps = passes * blocks;
  const int64_t per = (16 * rb + steps * 64 - 1) / (steps * 64) * 64;
  int64_t r = n0;
  for (; r + 16 <= n1; r += 16) {
    decode(r, tb.data());
    Ahead ahead;
    if (r + 32 <= n1) ahead = {w + (r + 16) * rb, per};
    int64_t m0 = 0;
    for (; m0 + 2 <= m; m0 += 2, ahead.p += ahead.per * blocks)
      tile(tb.data(), r, m0, std::integral_constant<int, 2>{}, ahead);
    if (m0 < m) tile(tb.data(), r, m0, std::integral_constant<int, 1>{}, ahead);
  }
  return r;
}

template <int32_t T>
int64_t t_range(const Q8Job& j, int64_t n0, int64_t n1) {
  return sixteen_row_groups<TBlock>(
      j.w, j.d.row_bytes, n0, n1, j.nb, j.d.m, [&](int64_t r, TBlock* tb) { t_decode<T>(j, r, tb); },
      [&](const TBlock* tb, int64_t r, int64_t m0, auto rows, const Ahead& ahead) {
        t_tile<T, decltype(rows)::value>(j, tb, r, m0, ahead);
      });
}
#endif

// lane i = Σ of v[i]'s lanes (integers: any grouping).
inline v8i hsum_each(const v8i* v) {
#if defined(LLAMAY_AVX2)
  auto h = [](v8i a, v8i b) { return (v8i)_mm256_hadd_epi32((__m256i)a, (__m256i)b); };
  const v8i u0 = h(h(v[0], v[1]), h(v[2], v[3])), u1 = h(h(v[4], v[5]), h(v[6], v[7]));
  return (v8i)_mm256_add_epi32(_mm256_permute2x128_si256((__m256i)u0, (__m256i)u1, 0x20),
                               _mm256_permute2x128_si256((__m256i)u0, (__m256i)u1, 0x31));
#else
  v8i r;
  for (int i = 0; i < 8; ++i) r[i] = hsum_i(v[i]);
  return r;
#endif
}

// The Q4_0x8 repack GEMV/GEMM for 8 weight rows at once, one row per f32 lane: per
// row, acc = fma(Σ_block, d_w·d_a, acc) block by block, as `q8_tile<.., WHOLE>`.
template <int MT>
void q4_0_whole8(const Q8Job& j, int64_t r0, int64_t m0) {
  const int64_t nb = j.nb;
  const Acts& a = *j.a;
  v8f acc[MT] = {};
  const uint8_t* rows[8];
  for (int r = 0; r < 8; ++r) rows[r] = j.w + (r0 + r) * j.d.row_bytes;
  for (int64_t b = 0; b < nb; ++b) {
    v32b q[8];
    v8f dw;
    for (int r = 0; r < 8; ++r) {
      prefetch(rows[r] + b * 18 + 8 * j.d.row_bytes);
      q[r] = quants32<Q4_0>(rows[r] + b * 18);
      dw[r] = rdf16(rows[r] + b * 18);
    }
    for (int m = 0; m < MT; ++m) {
      const int64_t i = (m0 + m) * nb + b;
      const v32b av = ld<v32b>(&a.qs[i * 32]);
      const v8i init = ld<v8i>(&a.corr[i * 8]);
      v8i l[8];
      for (int r = 0; r < 8; ++r) l[r] = dot_u(init, q[r], av);
      acc[m] = fma8(cvt(hsum_each(l)), splat(a.d[i]) * dw, acc[m]);
    }
  }
  for (int m = 0; m < MT; ++m)
    for (int r = 0; r < 8; ++r) j.y[(m0 + m) * j.d.n + r0 + r] = acc[m][r];
}

using Q8TileFn = void (*)(const Q8Job&, int64_t, int64_t);

template <int32_t T, bool WHOLE, int MT>
void q8_range_mt(const Q8Job& j, int64_t n0, int64_t n1, int64_t m0) {
  constexpr int R = rows_for(MT);
  int64_t r = n0;
  if (WHOLE && T == Q4_0)
    for (; r + 8 <= n1; r += 8) q4_0_whole8<MT>(j, r, m0);
  if (MT == 1 && !WHOLE) {  // two rows at once (two f32 chains in flight), from two runs in order
    const int64_t half = (n1 - r) / 2;
    for (int64_t i = 0; i < half; ++i) q8_tile<T, 2, 1, WHOLE>(j, r + i, m0, half);
    r += 2 * half;
  }
#if defined(LLAMAY_ZMM_TILE)
  if constexpr (MT % 2 == 0 && !WHOLE) {  // (odd MT: measured slower than q8_tile)
    constexpr int RZ = MT <= 4 ? 8 : 4;  // R x MT / 2 accumulators: <= 16 of the 32 registers
    for (; r + RZ <= n1; r += RZ) q8_tile_zmm<T, RZ, MT>(j, r, m0);
    for (; r < n1; ++r) q8_tile_zmm<T, 1, MT>(j, r, m0);
    return;
  }
#endif
  for (; r + R <= n1; r += R) q8_tile<T, R, MT, WHOLE>(j, r, m0);
  for (; r < n1; ++r) q8_tile<T, 1, MT, WHOLE>(j, r, m0);
}

template <int32_t T, bool WHOLE>
void q8_range(const Q8Job& j, int64_t n0, int64_t n1) {
  static constexpr void (*by_mt[8])(const Q8Job&, int64_t, int64_t, int64_t) = {
      &q8_range_mt<T, WHOLE, 1>, &q8_range_mt<T, WHOLE, 2>, &q8_range_mt<T, WHOLE, 3>,
      &q8_range_mt<T, WHOLE, 4>, &q8_range_mt<T, WHOLE, 5>, &q8_range_mt<T, WHOLE, 6>,
      &q8_range_mt<T, WHOLE, 7>, &q8_range_mt<T, WHOLE, 8>};
#if defined(LLAMAY_ZMM_TILE) && !defined(LLAMAY_NO_T_TILE)
  // 8+ rows (fewer: measured slower than q8_tile_zmm, the decoding not paid back), then
  // the rows past its groups of 16
  if (!WHOLE && j.d.m >= 8) n0 = t_range<T>(j, n0, n1);
  if (n0 >= n1) return;
#endif
  if (j.d.m <= 8) return by_mt[j.d.m - 1](j, n0, n1, 0);
  // Row blocks of 16 weight rows (a few KB: stay in L1) against all activation rows.
  for (int64_t s = n0; s < n1; s += 16) {
    const int64_t e = std::min(n1, s + 16);
    for (int64_t m0 = 0; m0 < j.d.m; m0 += 8) by_mt[std::min<int64_t>(8, j.d.m - m0) - 1](j, s, e, m0);
  }
}

// The activations of one call for a weight type's dot (Q8_0 with Q4_0's / Q5_0's bias
// sums or none, Q8_1, Q8_K), quantised over the pool.
// (AVX-512 VNNI: Q8_0's transposed tile reads w + 128, so its activations carry -128·Σa)
enum ActKind : int { A_Q8_0 = 0, A_Q8_0_B8, A_Q8_0_B16, A_Q8_0_B128, A_Q8_1, A_Q8_K, A_KINDS };
inline int act_kind(int32_t type) {
  switch (type) {
    case Q4_0: return A_Q8_0_B8;
    case Q5_0: return A_Q8_0_B16;
    case Q4_1:
    case Q5_1: return A_Q8_1;
#if defined(LLAMAY_ZMM_TILE)
    case Q8_0: return A_Q8_0_B128;
#else
    case Q8_0: return A_Q8_0;
#endif
    default: return A_Q8_K;
  }
}
void quantize_acts(ffi::ThreadPool& pool, const float* xp, int64_t m, int64_t k, int kind, Acts& a) {
  a.qs.resize(m * k);
  if (kind == A_Q8_K) {
    const int64_t nsb = k / 256;
    a.d.resize(m * nsb);
    a.bsums.resize(m * nsb * 16);
    a.bs32.resize(m * nsb * 16);
    each_row(pool, m, k, [&](int64_t r) { quantize_q8k(xp, r, k, a); });
    return;
  }
  const int64_t nb = k / 32;
  const bool q8_1 = kind == A_Q8_1;
  const int bias = kind == A_Q8_0_B8 ? 8 : kind == A_Q8_0_B16 ? 16 : kind == A_Q8_0_B128 ? 128 : 0;
  a.d.resize(m * nb);
  a.mp = (m + 7) / 8 * 8;
  if (q8_1) a.s.resize(m * nb), a.st.assign(nb * a.mp, 0.0f);
  if (bias) a.corr.resize(m * nb * 8);
  each_row(pool, m, k, [&](int64_t r) { quantize_q8(xp, r, k, q8_1, bias, a); });
}

// One weight's share of a call (LlamayQmmQ8/Q8K: the only one; LlamayQmmGgmlMulti: one
// of several): its job over activations quantised for its type, and its row tasks.
struct KJob;  // the K-quants' job (below)
struct GPart {
  Q8Job q8{};
  void (*q8_rows)(const Q8Job&, int64_t, int64_t) = nullptr;
  const KJob* kq = nullptr;
  void (*k_rows)(const KJob&, int64_t, int64_t) = nullptr;
  int64_t n = 0, per = 0, tasks = 0;
};

ffi::Error q8_part(Acts* a, const Weight& wt, const Dims& d, float* y, int32_t type, int32_t whole_block,
                   int64_t threads, GPart* p) {
  if (auto err = check(type, d); err.failure()) return err;
  if (block_elems(type) != 32) return ffi::Error::InvalidArgument("LlamayQmmQ8: needs a 32-element block type");
  if (whole_block && type != Q4_0) return ffi::Error::InvalidArgument("LlamayQmmQ8: the repack kernel is Q4_0 only");
  p->q8 = Q8Job{a, wt.data, y, d, d.k / 32};
  switch (type) {
    case Q4_0: p->q8_rows = whole_block ? &q8_range<Q4_0, true> : &q8_range<Q4_0, false>; break;
    case Q4_1: p->q8_rows = &q8_range<Q4_1, false>; break;
    case Q5_0: p->q8_rows = &q8_range<Q5_0, false>; break;
    case Q5_1: p->q8_rows = &q8_range<Q5_1, false>; break;
    default: p->q8_rows = &q8_range<Q8_0, false>; break;
  }
  p->n = d.n;
  p->per = rows_per_task(d.n, threads, std::max(8, LLAMAY_ZMM_ROWS), d.n * d.k * d.m);
  p->tasks = (d.n + p->per - 1) / p->per;
  return ffi::Error::Success();
}

// -- K-quants x Q8_K ---------------------------------------------------------------------

enum KKernel : int32_t { K_VEC = 0, K_TILED = 1, K_REPACK = 2 };

// The scales of one K-quant super-block as int16 vectors: the 16 (Q4_K/Q5_K: 8, then
// zeros) sub-block scales and mins (Q2_K, Q4_K, Q5_K; else zeros), d and dmin. Built
// in registers (no byte stores read back as a vector: a store-forwarding stall).
inline v16h widen_u8(const uint8_t* p) {
#if defined(LLAMAY_AVX2)
  return (v16h)_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)p));
#else
  v16h v;
  for (int i = 0; i < 16; ++i) v[i] = p[i];
  return v;
#endif
}
inline v16h widen_s8(const uint8_t* p) {
#if defined(LLAMAY_AVX2)
  return (v16h)_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)p));
#else
  v16h v;
  for (int i = 0; i < 16; ++i) v[i] = (int8_t)p[i];
  return v;
#endif
}
template <int32_t T>
inline void kquant_scales(const uint8_t* b, v16h* sc, v16h* mins, float* d, float* dmin) {
  *dmin = 0.0f;
  *mins = (v16h){};
  switch (T) {
    case Q2_K: {
      const v16h s = widen_u8(b);
      *sc = s & 0xF;
      *mins = s >> 4;
      *d = rdf16(b + 80);
      *dmin = rdf16(b + 82);
      return;
    }
    case Q3_K: {  // 16 six-bit scales: low nibbles in bytes 0-7, high pairs in 8-11
      uint32_t aux[3], out[4];
      std::memcpy(aux, b + 96, 12);
      const uint32_t m4 = 0x0f0f0f0f, m2 = 0x03030303;
      out[0] = (aux[0] & m4) | ((aux[2] & m2) << 4);
      out[1] = (aux[1] & m4) | (((aux[2] >> 2) & m2) << 4);
      out[2] = ((aux[0] >> 4) & m4) | (((aux[2] >> 4) & m2) << 4);
      out[3] = ((aux[1] >> 4) & m4) | (((aux[2] >> 6) & m2) << 4);
      uint8_t bytes[16];
      std::memcpy(bytes, out, 16);
      *sc = widen_u8(bytes) - 32;
      *d = rdf16(b + 108);
      return;
    }
    case Q4_K:
    case Q5_K: {  // get_scale_min_k4 for all 8: scales to bytes 0-7, mins to 8-15
      uint32_t u[4];
      std::memcpy(u, b + 4, 12);
      const uint32_t m6 = 0x3f3f3f3f, m4 = 0x0f0f0f0f, m2 = 0x03030303;
      u[3] = ((u[2] >> 4) & m4) | (((u[1] >> 6) & m2) << 4);
      const uint32_t mins_lo = u[1] & m6;
      u[1] = (u[2] & m4) | (((u[0] >> 6) & m2) << 4);
      u[2] = mins_lo;
      u[0] &= m6;
      uint8_t bytes[16];
      std::memcpy(bytes, u, 16);
      const v16h all = widen_u8(bytes);
      const v16h lo8 = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
      *sc = all & lo8;
      *mins = __builtin_shuffle(all, (v16h){8, 9, 10, 11, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15}) & lo8;
      *d = rdf16(b);
      *dmin = rdf16(b + 2);
      return;
    }
    default:  // Q6_K
      *sc = widen_s8(b + 192);
      *d = rdf16(b + 208);
  }
}

// A K-quant super-block's 256 quants in element order (as kquant_parts gives them;
// Q6_K unsigned 0..63, Q3_K signed -4..3, the others unsigned).
// `chunks`: bytes from one 32-quant chunk's start to the next (tk_decode's transposing
// layout), the AVX2 path only.
template <int32_t T>
inline void decode_kquant(const uint8_t* b, int8_t* q, int64_t chunks = 32) {
#if defined(LLAMAY_AVX2)
  const __m256i m2 = _mm256_set1_epi8(3), m4 = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1);
  auto put = [q, chunks](int at, __m256i v) { _mm256_storeu_si256((__m256i*)(q + at / 32 * chunks), v); };
  auto get = [](const uint8_t* p) { return _mm256_loadu_si256((const __m256i*)p); };
  auto shr = [](__m256i v, int s) { return _mm256_srli_epi16(v, s); };  // then masked per byte
  switch (T) {
    case Q2_K:
      for (int n = 0; n < 2; ++n) {
        const __m256i v = get(b + 16 + 32 * n);
        for (int j = 0; j < 4; ++j) put(128 * n + 32 * j, _mm256_and_si256(shr(v, 2 * j), m2));
      }
      return;
    case Q3_K: {
      const __m256i hm = get(b);
      for (int n = 0; n < 2; ++n) {
        const __m256i v = get(b + 32 + 32 * n);
        for (int j = 0; j < 4; ++j) {
          const __m256i low = _mm256_and_si256(shr(v, 2 * j), m2);
          const __m256i high = _mm256_and_si256(shr(hm, 4 * n + j), one);
          put(128 * n + 32 * j, _mm256_add_epi8(_mm256_sub_epi8(low, _mm256_set1_epi8(4)), _mm256_slli_epi16(high, 2)));
        }
      }
      return;
    }
    case Q4_K:
    case Q5_K: {
      const uint8_t* qs = b + (T == Q5_K ? 48 : 16);
      const __m256i qh = T == Q5_K ? get(b + 16) : _mm256_setzero_si256();
      for (int n = 0; n < 4; ++n) {
        const __m256i v = get(qs + 32 * n);
        __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(shr(v, 4), m4);
        if (T == Q5_K) {
          lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(shr(qh, 2 * n), one), 4));
          hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(shr(qh, 2 * n + 1), one), 4));
        }
        put(64 * n, lo);
        put(64 * n + 32, hi);
      }
      return;
    }
    default:  // Q6_K
      for (int n = 0; n < 2; ++n) {
        const __m256i l0 = get(b + 64 * n), l1 = get(b + 64 * n + 32);
        const __m256i h = get(b + 128 + 32 * n);
        auto hb = [&](int s) { return _mm256_slli_epi16(_mm256_and_si256(shr(h, s), m2), 4); };
        put(128 * n + 0, _mm256_or_si256(_mm256_and_si256(l0, m4), hb(0)));
        put(128 * n + 32, _mm256_or_si256(_mm256_and_si256(l1, m4), hb(2)));
        put(128 * n + 64, _mm256_or_si256(_mm256_and_si256(shr(l0, 4), m4), hb(4)));
        put(128 * n + 96, _mm256_or_si256(_mm256_and_si256(shr(l1, 4), m4), hb(6)));
      }
  }
#else
  int16_t sc[256], mn[16];
  float dd, dm;
  kquant_parts(T, b, q, sc, mn, &dd, &dm);
#endif
}

struct KJob {
  Acts* a;
  const uint8_t* w;
  float* y;
  Dims d;
  int64_t nsb;
  int parts;
};

// One weight row's super-block, decoded for the dots.
struct KBlock {
  alignas(32) int8_t q[256];
  v16h scv[8];    // chunk c's scale per int16 pair (sub-blocks of 16: 2c, then 2c+1)
  v16h sc, mins;  // the 16 (or 8, then zeros) sub-block scales and mins
  float d, dmin;
};

template <int32_t T>
inline void load_kblock(const uint8_t* b, KBlock& k) {
  kquant_scales<T>(b, &k.sc, &k.mins, &k.d, &k.dmin);
  decode_kquant<T>(b, k.q);
  constexpr bool sixteen = T == Q2_K || T == Q3_K || T == Q6_K;
#define LLAMAY_SPREAD(c)                                                                       \
  k.scv[c] = sixteen ? __builtin_shuffle(k.sc, (v16h){2 * c, 2 * c, 2 * c, 2 * c, 2 * c, 2 * c, 2 * c, 2 * c,  \
                                                      2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c + 1,   \
                                                      2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c + 1}) \
                     : __builtin_shuffle(k.sc, (v16h){c, c, c, c, c, c, c, c, c, c, c, c, c, c, c, c});
  LLAMAY_SPREAD(0) LLAMAY_SPREAD(1) LLAMAY_SPREAD(2) LLAMAY_SPREAD(3)
  LLAMAY_SPREAD(4) LLAMAY_SPREAD(5) LLAMAY_SPREAD(6) LLAMAY_SPREAD(7)
#undef LLAMAY_SPREAD
}

// Outputs rows [r0, r0 + R) x activation rows [m0, m0 + MT): ggml's vec_dot_qN_K_q8_K
// (K_VEC), the tiled GEMM (K_TILED) or the Q4_K/Q2_K repack GEMV/GEMM (K_REPACK) as
// qtensor.kquant_dot_q8k emulates them.
template <int32_t T, int KERN, int R, int MT, int PARTS>
void k_tile(const KJob& j, int64_t r0, int64_t m0, const KBlock* pre) {
  constexpr int bb = T == Q2_K ? 84 : T == Q3_K ? 110 : T == Q4_K ? 144 : T == Q5_K ? 176 : 210;
  constexpr bool has_mins = T == Q2_K || T == Q4_K || T == Q5_K;
  const int64_t nsb = j.nsb, k = j.d.k;
  const Acts& a = *j.a;
  constexpr int parts = KERN == K_REPACK ? PARTS : 1;
  v8f acc[R][MT] = {}, acc_m[R][MT] = {};  // K_VEC's lanes (and Q4_K's min lanes)
  float sacc[R][MT] = {}, sacc2[R][MT] = {};  // scalar accumulators
  KBlock own[R];
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const KBlock* blk = own;
    if (pre) {  // R = 1: the row decoded once for all activation rows (`k_range`)
      blk = pre + sb;
    } else {
      for (int r = 0; r < R; ++r) {
        const uint8_t* b = j.w + (r0 + r) * j.d.row_bytes + sb * bb;
        prefetch(b + PREFETCH_AHEAD);
        load_kblock<T>(b, own[r]);
      }
    }
    for (int m = 0; m < MT; ++m) {
      const int64_t i = (m0 + m) * nsb + sb;
      const int8_t* qa = &a.qs[i * 256];
      const float da = a.d[i];
      const v16h bs16 = ld<v16h>(&a.bsums[i * 16]);
      const v16h bs32 = ld<v16h>(&a.bs32[i * 16]);
      for (int r = 0; r < R; ++r) {
        const KBlock& w = blk[r];
        // integer lanes, per group of chunks (K_REPACK's parts; else one group)
        v8i g[4] = {};
        const int per_group = KERN == K_REPACK ? 8 / parts : 8;
        for (int c = 0; c < 8; ++c) {
          const v32b qv = ld<v32b>(w.q + 32 * c), av = ld<v32b>(qa + 32 * c);
          v8i& gc = g[KERN == K_REPACK ? c / per_group : 0];
          gc = T == Q3_K ? dot_s_scaled(gc, qv, av, w.scv[c]) : dot_u_scaled(gc, qv, av, w.scv[c]);
        }
        // mins x activation sums, pairs of sub-blocks per lane
        v8i mm = {};
        if (has_mins) mm = madd16(T == Q2_K ? bs16 : bs32, w.mins);
        if (KERN == K_VEC) {
          v8i lanes = g[0];
          if (T == Q6_K) lanes -= 32 * madd16(bs16, w.sc);
          const float d = da * w.d, dmin = da * w.dmin;
          if (T == Q2_K) acc[r][m] = fma8(splat(-dmin), cvt(mm), acc[r][m]);
          if (T == Q4_K) acc_m[r][m] = fma8(splat(-dmin), cvt(mm), acc_m[r][m]);
          if (T == Q5_K) sacc[r][m] = std::fmaf(-dmin, (float)hsum_i(mm), sacc[r][m]);
          acc[r][m] = fma8(splat(d), cvt(lanes), acc[r][m]);
        } else if (KERN == K_TILED) {
          int32_t s1 = hsum_i(g[0]);
          if (T == Q6_K) s1 -= 32 * hsum_i(madd16(bs16, w.sc));
          float rr = (float)s1 * w.d;
          if (has_mins) rr = std::fmaf(-w.dmin, (float)hsum_i(mm), rr);
          sacc[r][m] = std::fmaf(rr, da, sacc[r][m]);
        } else {  // K_REPACK: Q4_K (4 parts of 2 sub-blocks) or Q2_K (2 parts of 8)
          const float d = da * w.d, dmin = da * w.dmin;
          // m_total of part p: Q4_K lane p of mm (2 sub-blocks per part; 4 parts) or
          // all 4 lanes; Q2_K lanes 4p..4p+3 (2 parts) or all 8
          int32_t mt[4];
          if (parts == 1) {
            mt[0] = hsum_i(mm);
          } else if (T == Q4_K) {
            for (int p = 0; p < 4; ++p) mt[p] = mm[p];
          } else {
            mt[0] = (mm[0] + mm[1]) + (mm[2] + mm[3]);
            mt[1] = (mm[4] + mm[5]) + (mm[6] + mm[7]);
          }
          for (int p = 0; p < parts; ++p) {
            sacc[r][m] = std::fmaf((float)hsum_i(g[p]), d, sacc[r][m]);
            sacc2[r][m] = std::fmaf((float)mt[p], dmin, sacc2[r][m]);
          }
        }
      }
    }
  }
  for (int m = 0; m < MT; ++m)
    for (int r = 0; r < R; ++r) {
      float y;
      if (KERN == K_VEC) {
        y = hsum8(acc[r][m]);
        const v8f am = acc_m[r][m];
        if (T == Q4_K) y = y + ((am[0] + am[2]) + (am[1] + am[3]));
        if (T == Q5_K) y = y + sacc[r][m];
      } else if (KERN == K_TILED) {
        y = sacc[r][m];
      } else {
        y = sacc[r][m] - sacc2[r][m];
      }
      j.y[(m0 + m) * j.d.n + r0 + r] = y;
    }
}

// K_REPACK for 8 activation rows at once, one per f32 lane (the scalar chains of
// k_tile<.., K_REPACK, ..> per output, in the same order: parts, then super-blocks).
template <int32_t T, int PARTS>
void k_repack8(const KJob& j, int64_t r, int64_t m0, const KBlock* pre) {
  constexpr int bb = T == Q2_K ? 84 : 144;
  const int64_t nsb = j.nsb;
  const Acts& a = *j.a;
  v8f acc = {}, acc_min = {};
  KBlock own;
  for (int64_t sb = 0; sb < nsb; ++sb) {
    if (!pre) {
      const uint8_t* b = j.w + r * j.d.row_bytes + sb * bb;
      prefetch(b + PREFETCH_AHEAD);
      load_kblock<T>(b, own);
    }
    const KBlock& w = pre ? pre[sb] : own;
    v8f da;
    v8i mm[8];
    for (int m = 0; m < 8; ++m) {
      const int64_t i = (m0 + m) * nsb + sb;
      da[m] = a.d[i];
      mm[m] = madd16(ld<v16h>(T == Q2_K ? &a.bsums[i * 16] : &a.bs32[i * 16]), w.mins);
    }
    const v8f d = da * splat(w.d), dmin = da * splat(w.dmin);
    for (int p = 0; p < PARTS; ++p) {
      v8i g[8];
      for (int m = 0; m < 8; ++m) {
        const int8_t* qa = &a.qs[((m0 + m) * nsb + sb) * 256];
        v8i t = {};
        for (int c = p * 8 / PARTS; c < (p + 1) * 8 / PARTS; ++c)
          t = dot_u_scaled(t, ld<v32b>(w.q + 32 * c), ld<v32b>(qa + 32 * c), w.scv[c]);
        g[m] = t;
      }
      v8i mt;  // the part's min sums: Q4_K lane p of mm (4 parts) / all 4; Q2_K 4 lanes per part / all 8
      for (int m = 0; m < 8; ++m) {
        const v8i v = mm[m];
        if (PARTS == 1) mt[m] = hsum_i(v);
        else if (T == Q4_K) mt[m] = v[p];
        else mt[m] = (v[4 * p] + v[4 * p + 1]) + (v[4 * p + 2] + v[4 * p + 3]);
      }
      acc = fma8(cvt(hsum_each(g)), d, acc);
      acc_min = fma8(cvt(mt), dmin, acc_min);
    }
  }
  const v8f y = acc - acc_min;
  for (int m = 0; m < 8; ++m) j.y[(m0 + m) * j.d.n + r] = y[m];
}

// Weight rows [n0, n1) x activation rows [m0, m0 + MT), each row's super-blocks `pre`
// decoded (rows n0.. in order) or, null, decoded here.
template <int32_t T, int KERN, int MT>
void k_range_mt(const KJob& j, int64_t n0, int64_t n1, int64_t m0, const KBlock* pre) {
  if (KERN == K_REPACK && MT == 8 && (T == Q4_K || T == Q2_K)) {
    auto rep = j.parts == 1 ? &k_repack8<T, 1> : j.parts == 2 ? &k_repack8<T, 2> : &k_repack8<T, 4>;
    for (int64_t r = n0; r < n1; ++r) rep(j, r, m0, pre ? pre + (r - n0) * j.nsb : nullptr);
    return;
  }
  // one weight row at a time (more measured slower); the repack's parts: 1, 2 (Q2_K), 4 (Q4_K)
  auto tile = j.parts == 1 ? &k_tile<T, KERN, 1, MT, 1>
              : j.parts == 2 ? &k_tile<T, KERN, 1, MT, 2> : &k_tile<T, KERN, 1, MT, 4>;
  for (int64_t r = n0; r < n1; ++r) tile(j, r, m0, pre ? pre + (r - n0) * j.nsb : nullptr);
}

#if defined(LLAMAY_ZMM_TILE)
// The K-quants' transposed tile (as t_tile for the 32-element types), for the kernels
// whose f32 operations come per super-block or part of one: Q4_K's repack GEMM (4 parts
// of 2 sub-blocks: fma(Σ, d_a·d, acc), fma(Σ mins·bsums, d_a·dmin, acc_min)) and Q6_K's
// tiled GEMM (fma(Σ·d, d_a, acc)). The integer sums are formed per sub-block over 16
// rows at once (vpdpbusd, x's dword broadcast) and scaled: Q6_K in integers (vpmulld),
// Q4_K in f32, where every product and sum is an integer below 2^24 (|Σ q·a| <= 32·15·127,
// scales and mins < 64, two sub-blocks a part), so exact and equal to the int sum's
// conversion. Q6_K's q - 32 comes in through the chain's start, -32·Σa of the sub-block.
struct alignas(64) TKBlock {
  __m512i w[64];   // dword e of the 16 rows' 256 quants (unsigned, as load_kblock)
  __m512 f[16];    // Q4_K: scales 0-7 (f32), mins 8-15; Q6_K: scales as int32 (cast)
  __m512 d, dmin;
};

template <int32_t T>
void tk_decode(const KJob& j, int64_t r0, TKBlock* tb) {
  constexpr int bb = T == Q4_K ? 144 : 210;
  const int64_t nsb = j.nsb, rb = j.d.row_bytes;
  alignas(64) float d[16], dmin[16];
  for (int64_t sb = 0; sb < nsb; ++sb) {
    __m256i* q = (__m256i*)tb[sb].w;  // [chunk][row], 32 bytes each: transposed in place
    for (int r = 0; r < 16; ++r) {  // the rows' quants straight to q, their scales to f
      const uint8_t* b = j.w + (r0 + r) * rb + sb * bb;
      v16h sv, mv;
      kquant_scales<T>(b, &sv, &mv, &d[r], &dmin[r]);  // (not load_kblock: no per-pair spread)
      decode_kquant<T>(b, (int8_t*)(q + r), 16 * 32);
      // Q4_K: scales 0-7 then mins 0-7 as f32; Q6_K: the 16 scales as int32
      const v16h s16 = T == Q4_K ? __builtin_shuffle(sv, mv, (v16h){0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23})
                                 : sv;
      const __m512i s32 = _mm512_cvtepi16_epi32((__m256i)s16);
      tb[sb].f[r] = T == Q4_K ? _mm512_cvtepi32_ps(s32) : _mm512_castsi512_ps(s32);
    }
    transpose16(tb[sb].f);  // f[s] = scale (or min) s of the 16 rows (was a scalar store each)
    for (int c = 0; c < 8; ++c) {  // chunk c's 16 rows are where its lanes go, w[8c..8c+7]
      __m256i rows[16];
      for (int r = 0; r < 16; ++r) rows[r] = _mm256_load_si256(q + 16 * c + r);
      transpose16x8(rows, tb[sb].w + 8 * c);
    }
    tb[sb].d = _mm512_load_ps(d), tb[sb].dmin = _mm512_load_ps(dmin);
  }
}

// x's lanes e0..e0+n-1 (dwords of 4 quants) of token i against the weights' same lanes,
// from `init`: the sub-block's integer sums for 16 rows.
template <int N>
inline __m512i tk_dots(__m512i init, const __m512i* w, const int32_t* qa) {
  __m512i s = init;
  for (int l = 0; l < N; ++l) s = _mm512_dpbusd_epi32(s, w[l], _mm512_set1_epi32(qa[l]));
  return s;
}

template <int32_t T, int TT>
void tk_tile(const KJob& j, const TKBlock* tb, int64_t r0, int64_t m0, const Ahead& ahead) {
  const int64_t nsb = j.nsb;
  const Acts& a = *j.a;
  __m512 acc[TT], acc_min[TT];
  for (int t = 0; t < TT; ++t) acc[t] = acc_min[t] = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    ahead.at(sb);
    const TKBlock& k = tb[sb];
    for (int t = 0; t < TT; ++t) {
      const int64_t i = (m0 + t) * nsb + sb;
      const int32_t* qa = (const int32_t*)&a.qs[i * 256];
      const __m512 da = _mm512_set1_ps(a.d[i]);
      if (T == Q4_K) {
        const __m512 d = _mm512_mul_ps(da, k.d), dmin = _mm512_mul_ps(da, k.dmin);
        const int16_t* bs = &a.bs32[i * 16];
        for (int p = 0; p < 4; ++p) {
          const __m512 s0 = _mm512_cvtepi32_ps(tk_dots<8>(_mm512_setzero_si512(), k.w + 16 * p, qa + 16 * p));
          const __m512 s1 = _mm512_cvtepi32_ps(tk_dots<8>(_mm512_setzero_si512(), k.w + 16 * p + 8, qa + 16 * p + 8));
          const __m512 sum = _mm512_fmadd_ps(s1, k.f[2 * p + 1], _mm512_mul_ps(s0, k.f[2 * p]));
          const __m512 mt = _mm512_fmadd_ps(k.f[9 + 2 * p], _mm512_set1_ps((float)bs[2 * p + 1]),
                                            _mm512_mul_ps(k.f[8 + 2 * p], _mm512_set1_ps((float)bs[2 * p])));
          acc[t] = _mm512_fmadd_ps(sum, d, acc[t]);
          acc_min[t] = _mm512_fmadd_ps(mt, dmin, acc_min[t]);
        }
      } else {  // Q6_K: sub-blocks of 16 (4 lanes)
        const int16_t* bs = &a.bsums[i * 16];
        __m512i s1 = _mm512_setzero_si512();
        for (int s = 0; s < 16; ++s) {
          const __m512i sub = tk_dots<4>(_mm512_set1_epi32(-32 * bs[s]), k.w + 4 * s, qa + 4 * s);
          s1 = _mm512_add_epi32(s1, _mm512_mullo_epi32(sub, _mm512_castps_si512(k.f[s])));
        }
        acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(s1), k.d), da, acc[t]);
      }
    }
  }
  for (int t = 0; t < TT; ++t) {
    const __m512 y = T == Q4_K ? _mm512_sub_ps(acc[t], acc_min[t]) : acc[t];
    _mm512_storeu_ps(j.y + (m0 + t) * j.d.n + r0, y);
  }
}

template <int32_t T>
int64_t tk_range(const KJob& j, int64_t n0, int64_t n1) {
  return sixteen_row_groups<TKBlock>(
      j.w, j.d.row_bytes, n0, n1, j.nsb, j.d.m, [&](int64_t r, TKBlock* tb) { tk_decode<T>(j, r, tb); },
      [&](const TKBlock* tb, int64_t r, int64_t m0, auto rows, const Ahead& ahead) {
        tk_tile<T, decltype(rows)::value>(j, tb, r, m0, ahead);
      });
}
#endif

// Blocks of 8 weight rows against all activation rows in tiles of 8; past one tile of
// activation rows, the block's super-blocks decoded once (a few KB a row: L1/L2) for all.
template <int32_t T, int KERN>
void k_range(const KJob& j, int64_t n0, int64_t n1) {
#if defined(LLAMAY_ZMM_TILE) && !defined(LLAMAY_NO_T_TILE)
  // (8+ rows; the repack's 4 parts from 4 rows, its GEMV tail below: `qmatmul_native`)
  if (j.d.m >= 8 && ((T == Q4_K && KERN == K_REPACK && j.parts == 4) || (T == Q6_K && KERN == K_TILED)))
    n0 = tk_range<T>(j, n0, n1);
  if (n0 >= n1) return;
#endif
  static constexpr void (*by_mt[8])(const KJob&, int64_t, int64_t, int64_t, const KBlock*) = {
      &k_range_mt<T, KERN, 1>, &k_range_mt<T, KERN, 2>, &k_range_mt<T, KERN, 3>,
      &k_range_mt<T, KERN, 4>, &k_range_mt<T, KERN, 5>, &k_range_mt<T, KERN, 6>,
      &k_range_mt<T, KERN, 7>, &k_range_mt<T, KERN, 8>};
  std::vector<KBlock> pre(j.d.m > 8 ? 8 * j.nsb : 0);
  for (int64_t s = n0; s < n1; s += 8) {
    const int64_t e = std::min(n1, s + 8);
    constexpr int bb = T == Q2_K ? 84 : T == Q3_K ? 110 : T == Q4_K ? 144 : T == Q5_K ? 176 : 210;
    for (int64_t r = s; r < e && !pre.empty(); ++r)
      for (int64_t sb = 0; sb < j.nsb; ++sb)
        load_kblock<T>(j.w + r * j.d.row_bytes + sb * bb, pre[(r - s) * j.nsb + sb]);
    for (int64_t m0 = 0; m0 < j.d.m; m0 += 8)
      by_mt[std::min<int64_t>(8, j.d.m - m0) - 1](j, s, e, m0, pre.empty() ? nullptr : pre.data());
  }
}

template <int32_t T>
void (*k_kernel(int32_t kernel))(const KJob&, int64_t, int64_t) {
  if (kernel == K_TILED) return &k_range<T, K_TILED>;
  if (kernel == K_REPACK && (T == Q4_K || T == Q2_K)) return &k_range<T, K_REPACK>;
  return &k_range<T, K_VEC>;
}

ffi::Error k_part(Acts* a, const Weight& wt, const Dims& d, float* y, int32_t type, int32_t kernel,
                  int64_t threads, KJob* job, GPart* p) {
  if (auto err = check(type, d); err.failure()) return err;
  if (block_elems(type) != 256 || is_iq(type)) return ffi::Error::InvalidArgument("LlamayQmmQ8K: needs a K-quant weight");
  if (kernel == K_REPACK && type != Q4_K && type != Q2_K)
    return ffi::Error::InvalidArgument("LlamayQmmQ8K: the repack kernel is Q4_K/Q2_K only");
  const int parts = kernel == K_REPACK && d.m >= 4 ? (type == Q4_K ? 4 : 2) : 1;
  *job = KJob{a, wt.data, y, d, d.k / 256, parts};
  p->kq = job;
  switch (type) {
    case Q2_K: p->k_rows = k_kernel<Q2_K>(kernel); break;
    case Q3_K: p->k_rows = k_kernel<Q3_K>(kernel); break;
    case Q4_K: p->k_rows = k_kernel<Q4_K>(kernel); break;
    case Q5_K: p->k_rows = k_kernel<Q5_K>(kernel); break;
    default: p->k_rows = k_kernel<Q6_K>(kernel); break;
  }
  p->n = d.n;
  p->per = rows_per_task(d.n, threads, LLAMAY_ZMM_ROWS, d.n * d.k * d.m);
  p->tasks = (d.n + p->per - 1) / p->per;
  return ffi::Error::Success();
}

// Every part's row tasks in one split over the pool (one handoff to the threads).
void run_parts(ffi::ThreadPool& pool, const GPart* parts, int64_t count) {
  parallel_parts(pool, parts, count, [](const GPart& p, int64_t task) {
    const int64_t n0 = task * p.per, n1 = std::min(p.n, n0 + p.per);
    if (p.q8_rows) p.q8_rows(p.q8, n0, n1);
    else p.k_rows(*p.kq, n0, n1);
  });
}

// One weight: x quantised as its type's dot reads it, then its row tasks. `kernel` is
// LlamayQmmQ8's whole_block (32-element types) or LlamayQmmQ8K's kernel.
ffi::Error qmm_one(ffi::ThreadPool& pool, const ffi::Buffer<ffi::F32>& x, const ffi::Buffer<ffi::U8>& w,
                   const ffi::BufferR0<ffi::S32>& layer, float* y, int32_t type, int32_t kernel) {
  Weight wt;
  if (auto err = weight_of(w, layer, &wt); err.failure()) return err;
  const Dims d = dims_of(x, wt);
  Acts a;
  KJob job;
  GPart p;
  auto err = block_elems(type) == 32 ? q8_part(&a, wt, d, y, type, kernel, pool.num_threads(), &p)
                                     : k_part(&a, wt, d, y, type, kernel, pool.num_threads(), &job, &p);
  if (err.failure()) return err;
  quantize_acts(pool, x.typed_data(), d.m, d.k, act_kind(type), a);
  run_parts(pool, &p, 1);
  return ffi::Error::Success();
}

ffi::Error QmmQ8(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::U8> w,
                 ffi::BufferR0<ffi::S32> layer, ffi::ResultBuffer<ffi::F32> y, int32_t type,
                 int32_t whole_block) {
  if (block_elems(type) != 32) return ffi::Error::InvalidArgument("LlamayQmmQ8: a 32-element block type");
  return qmm_one(pool, x, w, layer, y->typed_data(), type, whole_block);
}

ffi::Error QmmQ8K(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::U8> w,
                  ffi::BufferR0<ffi::S32> layer, ffi::ResultBuffer<ffi::F32> y, int32_t type,
                  int32_t kernel) {
  if (block_elems(type) != 256) return ffi::Error::InvalidArgument("LlamayQmmQ8K: a 256-element block type");
  return qmm_one(pool, x, w, layer, y->typed_data(), type, kernel);
}

// Several weights that read the same x (q, k, v; gate, up): x quantised once per kind of
// activation the weights' dots read, all the weights' row tasks in one split. kernels[i]
// is LlamayQmmQ8's whole_block or LlamayQmmQ8K's kernel for stack i; `results` as
// for_each_stack.
ffi::Error QmmGgmlMulti(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::RemainingArgs args,
                        ffi::RemainingRets rets, ffi::Span<const int32_t> types,
                        ffi::Span<const int32_t> kernels, ffi::Span<const int32_t> results) {
  const int64_t count = (int64_t)types.size();
  if ((int64_t)kernels.size() != count || (int64_t)results.size() != count)
    return ffi::Error::InvalidArgument("LlamayQmmGgmlMulti: one type, kernel and result index per stack");
  Acts acts[A_KINDS];
  bool used[A_KINDS] = {};
  std::vector<GPart> parts;
  std::vector<KJob> kjobs(count);
  parts.reserve(count);
  int64_t m = 0, k = 0;
  auto err = for_each_stack(
      "LlamayQmmGgmlMulti", args, rets, results,
      [&](int64_t i, const ffi::Buffer<ffi::U8>& w, const ffi::BufferR0<ffi::S32>& layer, float* out) {
        parts.emplace_back();
        Weight wt;
        if (auto err = weight_of(w, layer, &wt); err.failure()) return err;
        const Dims d = dims_of(x, wt);
        m = d.m, k = d.k;
        const int kind = act_kind(types[i]);
        used[kind] = true;
        return block_elems(types[i]) == 32
                   ? q8_part(&acts[kind], wt, d, out, types[i], kernels[i], pool.num_threads(), &parts.back())
                   : k_part(&acts[kind], wt, d, out, types[i], kernels[i], pool.num_threads(), &kjobs[i],
                            &parts.back());
      });
  if (err.failure()) return err;
  for (int kind = 0; kind < A_KINDS; ++kind)
    if (used[kind]) quantize_acts(pool, x.typed_data(), m, k, kind, acts[kind]);
  run_parts(pool, parts.data(), (int64_t)parts.size());
  return ffi::Error::Success();
}

}  // namespace
}  // namespace llamay

XLA_FFI_DEFINE_HANDLER_SYMBOL(LlamayQmmQ8, llamay::QmmQ8,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Arg<ffi::BufferR0<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int32_t>("ggml_type")
                                  .Attr<int32_t>("whole_block"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(LlamayQmmQ8K, llamay::QmmQ8K,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Arg<ffi::BufferR0<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int32_t>("ggml_type")
                                  .Attr<int32_t>("kernel"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(LlamayQmmGgmlMulti, llamay::QmmGgmlMulti,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<ffi::Span<const int32_t>>("ggml_types")
                                  .Attr<ffi::Span<const int32_t>>("kernels")
                                  .Attr<ffi::Span<const int32_t>>("results"));
