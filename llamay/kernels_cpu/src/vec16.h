// Vectors of 16 lanes in GCC's vector extension, shared by the exact kernels
// (qmatmul_exact.cc, paged_attention.cc): 16 floats / 16 int32, bytes widened to int32
// (AVX-512 or AVX2 intrinsics where there are, since GCC lowers the generic conversion
// byte by byte; the generic conversion elsewhere), int32 to float, loads and stores.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace llamay {
// Internal linkage, as where each kernel defined them: the same inlining (and code).
namespace {

typedef float f16v __attribute__((vector_size(64)));   // 16 floats
typedef int32_t i16v __attribute__((vector_size(64)));  // 16 int32
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
  i16v v;
  const __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p));
  const __m256i hi = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(p + 8)));
  std::memcpy(&v, &lo, 32);
  std::memcpy((char*)&v + 32, &hi, 32);
  return v;
}
inline i16v wide_s8(const uint8_t* p) {
  i16v v;
  const __m256i lo = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p));
  const __m256i hi = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(p + 8)));
  std::memcpy(&v, &lo, 32);
  std::memcpy((char*)&v + 32, &hi, 32);
  return v;
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

inline f16v to_f(i16v v) { return __builtin_convertvector(v, f16v); }
inline f16v load16(const float* p) {
  f16v v;
  std::memcpy(&v, p, 64);
  return v;
}
inline void store16(float* p, f16v v) { std::memcpy(p, &v, 64); }
const i16v LANE16 = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

}  // namespace
}  // namespace llamay
