// Vectors of 16 lanes in GCC's vector extension, shared by the exact kernels
// (qmatmul_exact.cc, paged_attention.cc), and a 16 x 16 transpose (AVX-512; the ggml
// kernels' too; 8 x 8 for AVX2): 16 floats / 16 int32, bytes widened to int32
// (AVX-512 or AVX2 intrinsics where there are, since GCC lowers the generic conversion
// byte by byte; the generic conversion elsewhere), int32 to float, loads and stores.
#pragma once

#include <cstdint>
#include <cstring>
#include <algorithm>
#include <limits>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace llamay {
// Internal linkage, as where each kernel defined them: the same inlining (and code).
namespace {

#if defined(__AVX2__) && !defined(__AVX512F__)
// AVX2: two 8-lane halves. GCC lowers a 64-byte generic vector on a 32-byte ISA through
// the stack (each accumulator stored and reloaded in 8-byte pieces every iteration: 5-10x
// slower kernels); a struct of two ymm-sized vectors stays in registers.
typedef float f8v __attribute__((vector_size(32)));
typedef int32_t i8v __attribute__((vector_size(32)));
template <class H, class S>
struct V2 {
  H lo, hi;
  S operator[](int i) const { return i < 8 ? lo[i] : hi[i - 8]; }
};
typedef V2<f8v, float> f16v;   // 16 floats
typedef V2<i8v, int32_t> i16v;  // 16 int32
#define LLAMAY_V2_OP(OP)                                                              \
  template <class H, class S>                                                          \
  inline V2<H, S> operator OP(V2<H, S> a, V2<H, S> b) { return {a.lo OP b.lo, a.hi OP b.hi}; } \
  template <class H, class S>                                                          \
  inline V2<H, S> operator OP(V2<H, S> a, S b) { return {a.lo OP b, a.hi OP b}; }      \
  template <class H, class S>                                                          \
  inline V2<H, S> operator OP(S a, V2<H, S> b) { return {a OP b.lo, a OP b.hi}; }      \
  template <class H, class S, class B>                                                 \
  inline V2<H, S>& operator OP##=(V2<H, S>& a, B b) { return a = a OP b; }
LLAMAY_V2_OP(+)
LLAMAY_V2_OP(-)
LLAMAY_V2_OP(*)
LLAMAY_V2_OP(&)
LLAMAY_V2_OP(|)
LLAMAY_V2_OP(^)
LLAMAY_V2_OP(<<)
LLAMAY_V2_OP(>>)
#undef LLAMAY_V2_OP
// Loops over a tile's registers unrolled (GCC leaves some rolled, the accumulators then in memory).
#define LLAMAY_UNROLL _Pragma("GCC unroll 16")
#else
#define LLAMAY_UNROLL
typedef float f16v __attribute__((vector_size(64)));   // 16 floats
typedef int32_t i16v __attribute__((vector_size(64)));  // 16 int32
#endif
typedef uint8_t u8x16 __attribute__((vector_size(16)));
typedef int8_t s8x16 __attribute__((vector_size(16)));

// 16 bytes widened to 16 int32, unsigned / signed.
#if defined(__AVX512F__)
inline i16v wide_u8(const uint8_t* p) {
  return (i16v)_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p));
}
inline i16v wide_s8(const uint8_t* p) {
  return (i16v)_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p));
}
#elif defined(__AVX2__)
inline i16v wide_u8(const uint8_t* p) {
  return {(i8v)_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p)),
          (i8v)_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(p + 8)))};
}
inline i16v wide_s8(const uint8_t* p) {
  return {(i8v)_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)),
          (i8v)_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(p + 8)))};
}
#else
inline i16v wide_u8(const uint8_t* p) {
  u8x16 b;
  std::memcpy(&b, p, 16);
  return __builtin_convertvector(b, i16v);
}
inline i16v wide_s8(const uint8_t* p) {
  s8x16 b;
  std::memcpy(&b, p, 16);
  return __builtin_convertvector(b, i16v);
}
#endif

#if defined(__AVX2__) && !defined(__AVX512F__)
inline f16v to_f(i16v v) {
  return {__builtin_convertvector(v.lo, f8v), __builtin_convertvector(v.hi, f8v)};
}
#else
inline f16v to_f(i16v v) { return __builtin_convertvector(v, f16v); }
#endif
#if defined(__AVX2__) && !defined(__AVX512F__)
inline f16v load16(const float* p) { return {(f8v)_mm256_loadu_ps(p), (f8v)_mm256_loadu_ps(p + 8)}; }
inline void store16(float* p, f16v v) {
  _mm256_storeu_ps(p, (__m256)v.lo);
  _mm256_storeu_ps(p + 8, (__m256)v.hi);
}
#else
inline f16v load16(const float* p) {
  f16v v;
  std::memcpy(&v, p, 64);
  return v;
}
inline void store16(float* p, f16v v) { std::memcpy(p, &v, 64); }
#endif
// x in every lane (x - 0, not 0 + x: a -0 stays -0).
inline f16v splat16(float x) {
  f16v z{};
  return x - z;
}

// max(x[0..n)) ignoring NaNs, as a chain of std::max(m, x[i]) (16 chains: one is
// latency-bound).
inline float max_of(const float* x, int64_t n) {
  float m[16];
  std::fill(m, m + 16, -std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int64_t l = 0; l < 16; ++l) m[l] = x[i + l] > m[l] ? x[i + l] : m[l];
  for (; i < n; ++i) m[0] = x[i] > m[0] ? x[i] : m[0];
  for (int64_t l = 1; l < 16; ++l) m[0] = m[l] > m[0] ? m[l] : m[0];
  return m[0];
}

#if defined(__AVX2__) && !defined(__AVX512F__)
const i16v LANE16 = {{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}};
#else
const i16v LANE16 = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
#endif

#if defined(__AVX512F__)
// 16 x 16 floats: out row i = column i of in (rows of 16 lanes).
inline void transpose16(__m512* r) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4)
    for (int j = 0; j < 2; ++j) {
      r[i + 2 * j] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + j]), _mm512_castps_pd(t[i + j + 2])));
      r[i + 2 * j + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + j]), _mm512_castps_pd(t[i + j + 2])));
    }
  for (int i = 0; i < 16; i += 8)
    for (int j = 0; j < 4; ++j) {
      t[i + j] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0x88);
      t[i + j + 4] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0xDD);
    }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
    r[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xDD);
  }
}
#endif

#if defined(__AVX2__)
// 8 x 8 floats: out row i = column i of in (rows of 8 lanes).
inline void transpose8(__m256* r) {
  __m256 t[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4)
    for (int j = 0; j < 2; ++j) {
      r[i + 2 * j] = _mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(t[i + j]), _mm256_castps_pd(t[i + j + 2])));
      r[i + 2 * j + 1] = _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(t[i + j]), _mm256_castps_pd(t[i + j + 2])));
    }
  for (int j = 0; j < 4; ++j) {
    t[j] = _mm256_permute2f128_ps(r[j], r[j + 4], 0x20);
    t[j + 4] = _mm256_permute2f128_ps(r[j], r[j + 4], 0x31);
  }
  for (int j = 0; j < 8; ++j) r[j] = t[j];
}
#endif

}  // namespace
}  // namespace llamay
