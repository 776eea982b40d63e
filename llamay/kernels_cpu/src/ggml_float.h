// ggml's x86 float arithmetic as `llamay.quant.ggml_float` emulates it in XLA, for the
// numerics="llamacpp" kernels: the same f32 operations in the same order (compile with
// -ffp-contract=off: every FMA here is written), so that a kernel's results are the
// emulation's bits. Run under FTZ/DAZ (`ScopedFtz`), as XLA's CPU runtime does.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

#include "blocks.h"

namespace llamay {
namespace gf {

inline uint32_t bits_of(float x) { uint32_t u; std::memcpy(&u, &x, 4); return u; }
inline float float_of(uint32_t u) { float x; std::memcpy(&x, &u, 4); return x; }

// Flush-to-zero and denormals-are-zero for a scope, as XLA's CPU runtime sets them.
struct ScopedFtz {
#if defined(__x86_64__) || defined(_M_X64)
  unsigned old;
  ScopedFtz() : old(_mm_getcsr()) { _mm_setcsr(old | 0x8040u); }
  ~ScopedFtz() { _mm_setcsr(old); }
#endif
};

// RN-to-f16 and back (vcvtps2ph where there is F16C, as XLA converts).
inline float round_f16(float x) {
#if defined(__F16C__) && !defined(LLAMAY_SCALAR)
  return _cvtsh_ss(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#else
  const uint32_t u = bits_of(x), sign = u & 0x80000000u;
  uint32_t a = u & 0x7FFFFFFFu;
  if (a >= 0x7F800000u) return x;                      // inf, nan
  if (a >= 0x477FF000u) return float_of(sign | 0x7F800000u);  // >= 65520: inf
  if (a < 0x33000000u) return float_of(sign);          // < 2^-25 (a tie at 2^-25: even 0)
  if (a >= 0x38800000u) {                              // a normal f16: 10 mantissa bits
    a += 0x0FFFu + ((a >> 13) & 1u);
    return float_of(sign | (a & ~0x1FFFu));
  }
  const float q = std::nearbyint(std::fabs(x) * 16777216.0f) * (1.0f / 16777216.0f);
  return float_of(sign | bits_of(q));                  // a subnormal f16: quantum 2^-24
#endif
}

// x[i] = round_f16(x[i] * scale) for i < n.
inline void round_f16_scaled(float* x, int64_t n, float scale) {
  int64_t i = 0;
#if defined(__AVX512F__) && !defined(LLAMAY_SCALAR)
  const __m512 vs = _mm512_set1_ps(scale);
  for (; i + 16 <= n; i += 16) {
    const __m512 y = _mm512_mul_ps(_mm512_loadu_ps(x + i), vs);
    _mm512_storeu_ps(x + i, _mm512_cvtph_ps(_mm512_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT)));
  }
#endif
#if defined(__F16C__) && defined(__AVX__) && !defined(LLAMAY_SCALAR)
  const __m256 vs8 = _mm256_set1_ps(scale);
  for (; i + 8 <= n; i += 8) {
    const __m256 y = _mm256_mul_ps(_mm256_loadu_ps(x + i), vs8);
    _mm256_storeu_ps(x + i, _mm256_cvtph_ps(_mm256_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT)));
  }
#endif
  for (; i < n; ++i) x[i] = round_f16(x[i] * scale);
}

// A row of D f16 or bf16 values as f32.
inline void load_row(const uint16_t* p, int64_t D, bool bf16, float* out) {
  int64_t d = 0;
#if defined(__AVX512F__) && !defined(LLAMAY_SCALAR)
  if (!bf16)
    for (; d + 16 <= D; d += 16)
      _mm512_storeu_ps(out + d, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(p + d))));
#endif
#if defined(__F16C__) && defined(__AVX__) && !defined(LLAMAY_SCALAR)
  if (!bf16)
    for (; d + 8 <= D; d += 8)
      _mm256_storeu_ps(out + d, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p + d))));
#endif
  if (bf16)
    for (; d < D; ++d) out[d] = bf16_to_f32(p[d]);
  else
    for (; d < D; ++d) out[d] = f16_to_f32(p[d]);
}

// -- ggml_float's error-free pieces (same operations, same order) -------------------------

inline void two_sum(float a, float b, float& s, float& e) {
  s = a + b;
  const float bb = s - a;
  e = (a - (s - bb)) + (b - bb);
}

inline void split(float a, float& hi, float& lo) {
  hi = float_of(bits_of(a) & 0xFFFFF000u);
  lo = a - hi;
}

inline void exact_product(float a, float b, float& x, float& r) {
  x = a * b;
  float ah, al, bh, bl;
  split(a, ah, al);
  split(b, bh, bl);
  r = (((ah * bh - x) + ah * bl) + al * bh) + al * bl;
}

inline float round_to_odd_add(float a, float b) {
  float s, e;
  two_sum(a, b, s, e);
  const uint32_t u = bits_of(s);
  const uint32_t moved = (e > 0.0f) == (s > 0.0f) ? u + 1 : u - 1;
  return float_of(e != 0.0f && (u & 1u) == 0 ? moved : u);
}

// ggml_float.fma (not narrow): RN(a * b + c). XLA has no fused multiply-add to ask for, so
// the emulation builds it from error-free sums and round-to-odd; natively it is the FMA
// instruction ggml's own code uses (the same rounding, one instruction instead of ~30, so
// that loops of it vectorise), the error-free form only where the target has no FMA.
inline float efma(float a, float b, float c) {
#if defined(__FMA__) && !defined(LLAMAY_SCALAR)
  return __builtin_fmaf(a, b, c);
#else
  float x, r, uh, ul, th, tl;
  exact_product(a, b, x, r);
  two_sum(x, r, uh, ul);
  two_sum(c, uh, th, tl);
  return th + round_to_odd_add(tl, ul);
#endif
}

// jnp.ldexp(j, n) for a finite normal j (all v_expf makes): the exponent moved, flushed to
// signed zero below the normals, inf above (branch-free, so that loops of it vectorise).
inline float ldexp_ftz(float j, int32_t n) {
  const uint32_t u = bits_of(j), sign = u & 0x80000000u;
  const int32_t ne = (int32_t)((u >> 23) & 0xFFu) + n;
  const uint32_t normal = sign | ((uint32_t)ne << 23) | (u & 0x7FFFFFu);
  return float_of(ne <= 0 ? sign : ne >= 0xFF ? (sign | 0x7F800000u) : normal);
}

// ggml_float.v_expf's constants.
constexpr float EXP_R = 0x1.8p23f, LOG2E = 0x1.715476p+0f, LN2_HI = 0x1.62e4p-1f,
                LN2_LO = 0x1.7f7d1cp-20f, P0 = 0x1.ffffecp-1f, P1 = 0x1.fffdb6p-2f,
                P2 = 0x1.555e66p-3f, P3 = 0x1.573e2ep-5f, P5 = 0x1.0e4020p-7f;

// ggml_float.v_expf.
inline float v_expf(float x) {
  const float z = efma(x, LOG2E, EXP_R);
  const float n = z - EXP_R;
  const float b = efma(-n, LN2_LO, x - n * LN2_HI);
  const float u = b * b;
  const float j = efma(efma(efma(P5, b, P3), u, efma(P2, b, P1)), u, efma(P0, b, 1.0f));
  const float nc = n < -192.0f ? -192.0f : n > 192.0f ? 192.0f : n;
  const float big = n <= 0.0f ? 0.0f : std::numeric_limits<float>::infinity();
  const float res = ldexp_ftz(j, (int32_t)nc);
  return std::fabs(n) > 192.0f ? big : res;
}

#if defined(__AVX2__) && defined(__FMA__) && !defined(LLAMAY_SCALAR)
#define LLAMAY_GF_AVX2 1
#if defined(__AVX512F__)
#define LLAMAY_GF_AVX512 1
#endif
typedef float gf8 __attribute__((vector_size(32)));
typedef int32_t gi8 __attribute__((vector_size(32)));
typedef float gf16 __attribute__((vector_size(64)));
typedef int32_t gi16 __attribute__((vector_size(64)));

// a * b + c rounded once, lane by lane (the FMA instruction of the vector's width).
inline gf8 vfma(gf8 a, gf8 b, gf8 c) { return (gf8)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c); }
#ifdef LLAMAY_GF_AVX512
inline gf16 vfma(gf16 a, gf16 b, gf16 c) { return (gf16)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c); }
#endif

// v_expf on a vector of lanes (F floats, I int32 of the same width): the same operations
// as the scalar form above, lane by lane (min/max/blends as the intrinsics' definitions).
template <class F, class I>
inline F v_expf_lanes(F x) {
  const auto c = [](float v) { return v - F{}; };  // v in every lane
  const F n = vfma(x, c(LOG2E), c(EXP_R)) - c(EXP_R);
  const F b = vfma(-n, c(LN2_LO), x - n * c(LN2_HI));
  const F u = b * b;
  const F hi = vfma(c(P5), b, c(P3)), mid = vfma(c(P2), b, c(P1)), lo = vfma(c(P0), b, c(1.0f));
  const F j = vfma(vfma(hi, u, mid), u, lo);
  // ldexp_ftz(j, clamp(n, ±192))
  F nc = n > c(-192.0f) ? n : c(-192.0f);
  nc = nc < c(192.0f) ? nc : c(192.0f);
  const I ni = __builtin_convertvector(nc, I);  // truncation, as cvttps
  const I ju = (I)j;
  const I sign = ju & (I{} + (int32_t)0x80000000u);
  const I ne = ((ju >> 23) & (I{} + 0xFF)) + ni;
  const I normal = sign | (ne << 23) | (ju & (I{} + 0x7FFFFF));
  I r = ne > I{} ? normal : sign;
  r = (I{} + 0xFF) > ne ? r : (sign | (I{} + 0x7F800000));
  // |n| > 192: 0 below, inf above
  const F big = n > F{} ? c(std::numeric_limits<float>::infinity()) : F{};
  const F an = (F)((I)n & (I{} + 0x7FFFFFFF));
  return an > c(192.0f) ? big : (F)r;
}

inline __m256 v_expf8(__m256 x) { return (__m256)v_expf_lanes<gf8, gi8>((gf8)x); }
#ifdef LLAMAY_GF_AVX512
inline __m512 v_expf16(__m512 x) { return (__m512)v_expf_lanes<gf16, gi16>((gf16)x); }
#endif
#endif

// y[i] = v_expf(x[i] - sub) for i < n.
inline void v_expf_n(const float* x, float sub, float* y, int64_t n) {
  int64_t i = 0;
#ifdef LLAMAY_GF_AVX512
  const __m512 vs16 = _mm512_set1_ps(sub);
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(y + i, v_expf16(_mm512_sub_ps(_mm512_loadu_ps(x + i), vs16)));
#endif
#ifdef LLAMAY_GF_AVX2
  const __m256 vs = _mm256_set1_ps(sub);
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, v_expf8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vs)));
#endif
  for (; i < n; ++i) y[i] = v_expf(x[i] - sub);
}

inline float reduce16(const float* v) {
  float t[8], w[4];
  for (int l = 0; l < 8; ++l) t[l] = v[8 + l] + v[l];
  for (int l = 0; l < 4; ++l) w[l] = t[4 + l] + t[l];
  return (w[0] + w[2]) + (w[1] + w[3]);
}

// ggml_float.dsum over x[0..n): a pairwise tree of TwoSums over n padded to a power of 2.
inline void dsum(const float* x, int64_t n, std::vector<float>& h, std::vector<float>& l,
                 float& hi, float& lo) {
  int64_t w = 1;
  while (w < n) w <<= 1;
  h.assign(w, 0.0f);
  l.assign(w, 0.0f);
  std::copy(x, x + n, h.begin());
#if defined(__AVX512F__) && !defined(LLAMAY_SCALAR)
  // the levels of 16+ pairs 16 at a time (each lane the scalar loop's operations)
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  for (; w >= 32; w >>= 1)
    for (int64_t i = 0; i < w / 2; i += 16) {
      const __m512 h0 = _mm512_loadu_ps(&h[2 * i]), h1 = _mm512_loadu_ps(&h[2 * i + 16]);
      const __m512 l0 = _mm512_loadu_ps(&l[2 * i]), l1 = _mm512_loadu_ps(&l[2 * i + 16]);
      const __m512 a = _mm512_permutex2var_ps(h0, even, h1), b = _mm512_permutex2var_ps(h0, odd, h1);
      const __m512 sv = _mm512_add_ps(a, b), bb = _mm512_sub_ps(sv, a);
      const __m512 e = _mm512_add_ps(_mm512_sub_ps(a, _mm512_sub_ps(sv, bb)), _mm512_sub_ps(b, bb));
      const __m512 ls = _mm512_add_ps(_mm512_permutex2var_ps(l0, even, l1), _mm512_permutex2var_ps(l0, odd, l1));
      _mm512_storeu_ps(&l[i], _mm512_add_ps(e, ls));  // (i < 2i: read before written)
      _mm512_storeu_ps(&h[i], sv);
    }
#endif
  for (; w > 1; w >>= 1)
    for (int64_t i = 0; i < w / 2; ++i) {
      float s, e;
      two_sum(h[2 * i], h[2 * i + 1], s, e);
      l[i] = e + (l[2 * i] + l[2 * i + 1]);
      h[i] = s;
    }
  hi = h[0];
  lo = l[0];
}

// ggml_float.recip_pair, with XLA's contraction of its last two steps into FMAs.
inline float recip_pair(float hi, float lo) {
  const float q = 1.0f / hi;
  float p, r;
  exact_product(q, hi, p, r);
  const float t = (1.0f - p) - r;
  const float rem = std::fmaf(-q, lo, t);
  return std::fmaf(q, rem, q);
}

}  // namespace gf
}  // namespace llamay
