// Exact quantised matmul y[M, N] = x[M, K] · W[N, K]ᵀ in f32 (XLA FFI handler
// LlamayQmmExact). Built with FP contraction on: only "within 1e-5 of the f32 dot over
// the dequantised weight" is asked of it, and FMAs are both faster and closer.
//
// Each block decodes to its quants as f32 vectors of 16 plus, per sub-block, a scale
// and an offset (value = scale·q + offset: bit-exact with the dequantisation, the
// product being exact). Two loops use that:
// - one decode row (M = 1): per weight row, per sub-block, t = Σ q·x in vectors, then
//   acc += scale·t and, where there are offsets, acc_o += offset·Σx (Σx per sub-block
//   computed once per call): one pass over the weight, nothing stored.
// - 2..8 decode rows: each block dequantised once in registers (w = scale·q + offset),
//   then one FMA per value and x row (dequant_tile), two weight rows at a time.
// - more rows (prefill): x packed k-major once per call, WR weight rows at a time
//   dequantised into a panel (L1/L2), then register tiles of WR weight rows by 2 vectors
//   of x rows over all rows of x: each weight row decoded once (the panel loop).
// - with AMX-BF16 (Sapphire Rapids and later), 16+ rows of the integer-quant types: the
//   tile unit over x split exactly into three bf16 pieces (amx_range); LLAMAY_NO_AMX
//   builds without it.
// LLAMAY_SCALAR (a test build) takes the panel loop with scalar dequantisation.
// LlamayQmmExactMulti: several weights that read the same x (q, k, v; gate, up) in one
// call, all their rows in one split over the threads (one handoff instead of one each);
// a weight whose type differs per layer comes as its per-type stacks, one result.
// AVX2 (16 registers): vec16.h's 16-lane vectors are two ymm halves, and the 2..8-row
// tile keeps one 8-lane accumulator per output, at most 8 of them.

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "blocks.h"
#include "operands.h"
#include "parallel.h"
#include "vec16.h"
#include "xla/ffi/api/ffi.h"

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace ffi = xla::ffi;

namespace llamay {
namespace {

// A tree of adds (a loop over the lanes is a chain of 16 dependent adds per output).
inline float hsum(f16v v) {
#if defined(__AVX512F__)
  return _mm512_reduce_add_ps((__m512)v);
#elif defined(__AVX2__)
  const __m256 s = (__m256)(v.lo + v.hi);
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
#else
  float h[8];
  for (int i = 0; i < 8; ++i) h[i] = v[i] + v[i + 8];
  for (int i = 0; i < 4; ++i) h[i] += h[i + 4];
  return (h[0] + h[2]) + (h[1] + h[3]);
#endif
}

// Per type: VECS vectors of 16 quants per block, SUBS sub-blocks (VECS / SUBS vectors
// each), OFFS whether there are offsets; decode(block, q[VECS], scale[SUBS], offs[SUBS]).
struct DQ4_0 {
  static constexpr int BYTES = 18;
  static constexpr int VECS = 2, SUBS = 1, OFFS = 0;
  static void decode(const uint8_t* b, f16v* q, float* sc, float* of) {
    const i16v v = wide_u8(b + 2);
    q[0] = to_f((v & 0xF) - 8);
    q[1] = to_f((v >> 4) - 8);
    sc[0] = rdf16(b);
    of[0] = 0.0f;
  }
};
struct DQ4_1 {
  static constexpr int BYTES = 20;
  static constexpr int VECS = 2, SUBS = 1, OFFS = 1;
  static void decode(const uint8_t* b, f16v* q, float* sc, float* of) {
    const i16v v = wide_u8(b + 4);
    q[0] = to_f(v & 0xF);
    q[1] = to_f(v >> 4);
    sc[0] = rdf16(b);
    of[0] = rdf16(b + 2);
  }
};
#if defined(__AVX2__) && !defined(LLAMAY_SCALAR)
// 32 signed bytes as f32 vectors of 16: q[0] the first 16, q[1] the rest.
inline void bytes_to_f(__m256i v, f16v* q) {
  const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
#if defined(__AVX512F__)
  q[0] = (f16v)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo));
  q[1] = (f16v)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi));
#else
  const auto f = [](__m128i b) { return (f8v)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)); };
  q[0] = {f(lo), f(_mm_unpackhi_epi64(lo, lo))};
  q[1] = {f(hi), f(_mm_unpackhi_epi64(hi, hi))};
#endif
}
#endif

template <bool ONE>
struct DQ5 {
  static constexpr int BYTES = ONE ? 24 : 22;
  static constexpr int VECS = 2, SUBS = 1, OFFS = ONE;
  static void decode(const uint8_t* b, f16v* q, float* sc, float* of) {
    const int off = ONE ? 4 : 2;
    uint32_t qh;
    std::memcpy(&qh, b + off, 4);
#if defined(__AVX2__) && !defined(LLAMAY_SCALAR)
    // bytes first (32 lanes a vector: a third of the work of widening each part first)
    const __m256i v = q5_quants32(b + off + 4, qh);
    bytes_to_f(ONE ? v : _mm256_sub_epi8(v, _mm256_set1_epi8(16)), q);
#else
    const i16v v = wide_u8(b + off + 4), h = (i16v){} + (int32_t)qh;
    const i16v hl = ((h >> LANE16) & 1) << 4, hh = ((h >> (LANE16 + 16)) & 1) << 4;
    const int bias = ONE ? 0 : 16;
    q[0] = to_f(((v & 0xF) | hl) - bias);
    q[1] = to_f(((v >> 4) | hh) - bias);
#endif
    sc[0] = rdf16(b);
    of[0] = ONE ? rdf16(b + 2) : 0.0f;
  }
};
struct DQ8_0 {
  static constexpr int BYTES = 34;
  static constexpr int VECS = 2, SUBS = 1, OFFS = 0;
  static void decode(const uint8_t* b, f16v* q, float* sc, float* of) {
    q[0] = to_f(wide_s8(b + 2));
    q[1] = to_f(wide_s8(b + 18));
    sc[0] = rdf16(b);
    of[0] = 0.0f;
  }
};
struct DQ2_K {
  static constexpr int BYTES = 84;
  static constexpr int VECS = 16, SUBS = 16, OFFS = 1;
  static void decode(const uint8_t* b, f16v* q, float* sc, float* of) {
    const float d = rdf16(b + 80), dmin = rdf16(b + 82);
    for (int n = 0; n < 2; ++n)
      for (int h = 0; h < 2; ++h) {
        const i16v v = wide_u8(b + 16 + 32 * n + 16 * h);
        for (int j = 0; j < 4; ++j) q[8 * n + 2 * j + h] = to_f((v >> (2 * j)) & 3);
      }
    for (int s = 0; s < 16; ++s) {
      sc[s] = d * (float)(b[s] & 0xF);
      of[s] = -(dmin * (float)(b[s] >> 4));
    }
  }
};
struct DQ3_K {
  static constexpr int BYTES = 110;
  static constexpr int VECS = 16, SUBS = 16, OFFS = 0;
  static void decode(const uint8_t* b, f16v* q, float* sc, float* of) {
    const float d = rdf16(b + 108);
    int8_t s16[16];
    q3k_scales(b + 96, s16);
    for (int h = 0; h < 2; ++h) {
      const i16v hm = wide_u8(b + 16 * h);
      for (int n = 0; n < 2; ++n) {
        const i16v v = wide_u8(b + 32 + 32 * n + 16 * h);
        for (int j = 0; j < 4; ++j) {
          const i16v high = (hm >> (4 * n + j)) & 1;
          q[8 * n + 2 * j + h] = to_f(((v >> (2 * j)) & 3) - ((high ^ 1) << 2));
        }
      }
    }
    for (int s = 0; s < 16; ++s) {
      sc[s] = d * (float)s16[s];
      of[s] = 0.0f;
    }
  }
};
template <bool FIVE>
struct DQ45_K {
  static constexpr int BYTES = FIVE ? 176 : 144;
  static constexpr int VECS = 16, SUBS = 8, OFFS = 1;
  static void decode(const uint8_t* b, f16v* q, float* sc, float* of) {
    const float d = rdf16(b), dmin = rdf16(b + 2);
    const uint8_t* qs = b + (FIVE ? 48 : 16);
    i16v qh[2];
    if (FIVE) qh[0] = wide_u8(b + 16), qh[1] = wide_u8(b + 32);
    for (int n = 0; n < 4; ++n)
      for (int h = 0; h < 2; ++h) {
        const i16v v = wide_u8(qs + 32 * n + 16 * h);
        i16v lo = v & 0xF, hi = v >> 4;
        if (FIVE) {
          lo |= ((qh[h] >> (2 * n)) & 1) << 4;
          hi |= ((qh[h] >> (2 * n + 1)) & 1) << 4;
        }
        q[4 * n + h] = to_f(lo);
        q[4 * n + 2 + h] = to_f(hi);
      }
    for (int s = 0; s < 8; ++s) {
      uint8_t a, m;
      scale_min_k4(s, b + 4, &a, &m);
      sc[s] = d * (float)a;
      of[s] = -(dmin * (float)m);
    }
  }
};
struct DQ6_K {
  static constexpr int BYTES = 210;
  static constexpr int VECS = 16, SUBS = 16, OFFS = 0;
  static void decode(const uint8_t* b, f16v* q, float* sc, float* of) {
    const float d = rdf16(b + 208);
#if defined(__AVX2__) && !defined(LLAMAY_SCALAR)
    // bytes first, 32 lanes a vector: per half, the 4 runs of 32 quants (low / high
    // nibbles of ql[0..32) and ql[32..64), with 2 bits of qh each)
    const __m256i m4 = _mm256_set1_epi8(0xF), m3 = _mm256_set1_epi8(3), k32 = _mm256_set1_epi8(32);
    for (int n = 0; n < 2; ++n) {
      const __m256i l0 = _mm256_loadu_si256((const __m256i*)(b + 64 * n));
      const __m256i l1 = _mm256_loadu_si256((const __m256i*)(b + 64 * n + 32));
      const __m256i h = _mm256_loadu_si256((const __m256i*)(b + 128 + 32 * n));
      const __m256i lo[4] = {l0, l1, _mm256_srli_epi16(l0, 4), _mm256_srli_epi16(l1, 4)};
      for (int j = 0; j < 4; ++j) {
        const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(h, 2 * j), m3);
        const __m256i v = _mm256_or_si256(_mm256_and_si256(lo[j], m4), _mm256_slli_epi16(hb, 4));
        bytes_to_f(_mm256_sub_epi8(v, k32), q + 8 * n + 2 * j);
      }
    }
#else
    for (int n = 0; n < 2; ++n)
      for (int h = 0; h < 2; ++h) {
        const i16v qh = wide_u8(b + 128 + 32 * n + 16 * h);
        const i16v l0 = wide_u8(b + 64 * n + 16 * h), l1 = wide_u8(b + 64 * n + 32 + 16 * h);
        q[8 * n + 0 + h] = to_f(((l0 & 0xF) | ((qh & 3) << 4)) - 32);
        q[8 * n + 2 + h] = to_f(((l1 & 0xF) | (((qh >> 2) & 3) << 4)) - 32);
        q[8 * n + 4 + h] = to_f(((l0 >> 4) | (((qh >> 4) & 3) << 4)) - 32);
        q[8 * n + 6 + h] = to_f(((l1 >> 4) | (((qh >> 6) & 3) << 4)) - 32);
      }
#endif
    const int8_t* s = (const int8_t*)(b + 192);
    for (int i = 0; i < 16; ++i) {
      sc[i] = d * (float)s[i];
      of[i] = 0.0f;
    }
  }
};

// The i-quants, ternary types and MXFP4: blocks.h's iq_parts (int8 quants from the
// generated grids, one scale per sub-block), widened to f32 vectors.
constexpr int iq_subs(int32_t t) {
  return t == IQ4_NL || t == MXFP4 || t == TQ1_0 || t == TQ2_0 ? 1
         : t == IQ2_XS || t == IQ2_S || t == IQ1_M            ? 16
                                                                : 8;
}
template <int32_t T>
struct DIQ {
  static constexpr int BYTES = T == IQ4_NL ? 18 : T == MXFP4 ? 17 : T == IQ2_XXS ? 66
                             : T == IQ2_XS ? 74 : T == IQ2_S ? 82 : T == IQ3_XXS ? 98
                             : T == IQ3_S ? 110 : T == IQ1_S ? 50 : T == IQ1_M ? 56
                             : T == IQ4_XS ? 136 : T == TQ1_0 ? 54 : 66;
  static constexpr int VECS = T == IQ4_NL || T == MXFP4 ? 2 : 16;
  static constexpr int SUBS = iq_subs(T), OFFS = 0;
  static void decode(const uint8_t* b, f16v* q, float* sc, float* of) {
    int8_t buf[16 * VECS];
    iq_parts(T, b, buf, sc);
    for (int v = 0; v < VECS; ++v) q[v] = to_f(wide_s8((const uint8_t*)buf + 16 * v));
    for (int s = 0; s < SUBS; ++s) of[s] = 0.0f;
  }
};

#if defined(__AVX512F__)
// The 4-bit codebook types on AVX-512: 16 nibbles (as int32 lanes) through the table held
// as one f32 vector (vpermps): no per-element table loads.
template <int32_t T>
struct DNL {
  static constexpr int BYTES = T == IQ4_NL ? 18 : T == MXFP4 ? 17 : 136;
  static constexpr int VECS = T == IQ4_XS ? 16 : 2;
  static constexpr int SUBS = T == IQ4_XS ? 8 : 1, OFFS = 0;
  static void decode(const uint8_t* b, f16v* q, float* sc, float* of) {
    const int8_t* table = T == MXFP4 ? MXFP4_VALUES : IQ4NL_VALUES;
    const __m512 tab = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)table)));
    const uint8_t* qs = b + (T == IQ4_NL ? 2 : T == MXFP4 ? 1 : 8);
    for (int g = 0; g < VECS / 2; ++g) {
      const i16v v = wide_u8(qs + 16 * g);
      q[2 * g] = (f16v)_mm512_permutexvar_ps((__m512i)(v & 0xF), tab);
      q[2 * g + 1] = (f16v)_mm512_permutexvar_ps((__m512i)(v >> 4), tab);
    }
    if (T == IQ4_XS) {
      const float d = rdf16(b);
      const uint16_t sh = rd16(b + 2);
      for (int ib = 0; ib < 8; ++ib) {
        const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (((sh >> (2 * ib)) & 3) << 4);
        sc[ib] = d * (float)(ls - 32);
      }
    } else {
      sc[0] = T == MXFP4 ? e8m0_half(b[0]) : rdf16(b);
    }
    for (int s = 0; s < SUBS; ++s) of[s] = 0.0f;
  }
};
#else
template <int32_t T>
using DNL = DIQ<T>;
#endif

constexpr int MAX_DECODE_ROWS = 8;

// GCC schedules instructions before register allocation only when asked (clang always
// does). Without it the one-row loop decoded a 256-value block into its 32 vectors in
// source order and, with AVX2's 16 registers, stored each to the stack and read it back;
// pressure-aware scheduling interleaves the decoding with the dots. Measured on AVX2
// (bench/kernel_ab.py --flags=-DLLAMAY_NO_SCHEDULED, bit-identical): Q4_K / Q6_K at M = 1
// in 0.75 / 0.88 of the time. The 2..8-row tile takes it per type and row count (see
// schedule_tile); the panel loop not (the whole file so compiled measured mixed). AVX-512's
// 32 registers hold a block (not measured there).
#if defined(__GNUC__) && !defined(__clang__) && defined(__AVX2__) && !defined(__AVX512F__) && \
    !defined(LLAMAY_NO_SCHEDULED)
#define LLAMAY_SCHEDULED __attribute__((optimize("schedule-insns", "sched-pressure")))
#else
#define LLAMAY_SCHEDULED
#endif

// Σx per sub-block of each x row: sx[m][k / sub] (for the offsets).
void sub_sums(const float* x, int64_t m, int64_t k, int sub, float* sx) {
  for (int64_t i = 0; i < m * (k / sub); ++i) {
    float s = 0.0f;
    for (int e = 0; e < sub; ++e) s += x[i * sub + e];
    sx[i] = s;
  }
}

template <class D, int M>
LLAMAY_SCHEDULED void scale_after_rows(const float* x, const float* sx, int64_t k,
                                        const uint8_t* w, int64_t rb, int64_t n0, int64_t n1,
                                        float* y, int64_t n) {
  constexpr int BE = 16 * D::VECS, PER = D::VECS / D::SUBS;
  constexpr int bb = D::BYTES;
  const int64_t nb = k / BE;
  for (int64_t r = n0; r < n1; ++r) {
    const uint8_t* row = w + r * rb;
    f16v acc[M] = {};
    float acc_o[M] = {};
    for (int64_t b = 0; b < nb; ++b) {
      f16v q[D::VECS];
      float sc[D::SUBS], of[D::SUBS];
      prefetch(row + b * bb + PREFETCH_AHEAD);
      D::decode(row + b * bb, q, sc, of);
      LLAMAY_UNROLL
      for (int s = 0; s < D::SUBS; ++s)
        LLAMAY_UNROLL
        for (int m = 0; m < M; ++m) {
          const float* xs = x + m * k + b * BE + s * PER * 16;
          f16v t = q[s * PER] * load16(xs);
          LLAMAY_UNROLL
          for (int v = 1; v < PER; ++v) t += q[s * PER + v] * load16(xs + 16 * v);
          acc[m] += sc[s] * t;
          if (D::OFFS) acc_o[m] += of[s] * sx[(m * nb + b) * D::SUBS + s];
        }
    }
    for (int m = 0; m < M; ++m) y[m * n + r] = hsum(acc[m]) + acc_o[m];
  }
}

// Several x rows: R weight rows at a time (each x vector loaded once for R FMAs), each
// block's values dequantised in registers, w = scale·q + offset (one FMA per 16 values,
// the dequantisation's value exactly: scale·q is exact), then acc[r][m] += w·x: per
// value and x row one FMA, where scale_after_rows spends about 1.5.
#if defined(__AVX2__) && !defined(__AVX512F__)
// AVX2 (16 registers): one 8-lane accumulator per output, both halves of a 16-vector into it.
typedef f8v accv;
inline void fma_acc(accv& a, f16v w, f16v x) {
  a += w.lo * x.lo;
  a += w.hi * x.hi;
}
inline float hsum_acc(accv v) { return hsum(f16v{v, accv{}}); }
#else
typedef f16v accv;
inline void fma_acc(accv& a, f16v w, f16v x) { a += w * x; }
inline float hsum_acc(accv v) { return hsum(v); }
#endif

// The 2..8-row tile's body, compiled as part of whichever wrapper below takes it in.
template <class D, int M, int R>
__attribute__((always_inline)) inline void tile_body(const float* x, int64_t k,
                                                     const uint8_t* row, int64_t rb, float* y,
                                                     int64_t n) {
  constexpr int BE = 16 * D::VECS, PER = D::VECS / D::SUBS;
  const int64_t nb = k / BE;
  accv acc[R][M] = {};
  for (int64_t b = 0; b < nb; ++b) {
    f16v q[R][D::VECS];
    float sc[R][D::SUBS], of[R][D::SUBS];
    LLAMAY_UNROLL
    for (int j = 0; j < R; ++j) {
      prefetch(row + j * rb + b * D::BYTES + PREFETCH_AHEAD);
      D::decode(row + j * rb + b * D::BYTES, q[j], sc[j], of[j]);
    }
    const float* xb = x + b * BE;
    LLAMAY_UNROLL
    for (int v = 0; v < D::VECS; ++v) {
      f16v wv[R];
      LLAMAY_UNROLL
      for (int j = 0; j < R; ++j)
        wv[j] = D::OFFS ? sc[j][v / PER] * q[j][v] + of[j][v / PER] : sc[j][v / PER] * q[j][v];
      LLAMAY_UNROLL
      for (int m = 0; m < M; ++m) {
        const f16v xv = load16(xb + m * k + 16 * v);
        LLAMAY_UNROLL
        for (int j = 0; j < R; ++j) fma_acc(acc[j][m], wv[j], xv);
      }
    }
  }
  for (int j = 0; j < R; ++j)
    for (int m = 0; m < M; ++m) y[m * n + j] = hsum_acc(acc[j][m]);
}

template <class D, int M, int R>
LLAMAY_SCHEDULED void scheduled_tile(const float* x, int64_t k, const uint8_t* row, int64_t rb,
                                     float* y, int64_t n) {
  tile_body<D, M, R>(x, k, row, rb, y, n);
}
template <class D, int M, int R>
void plain_tile(const float* x, int64_t k, const uint8_t* row, int64_t rb, float* y, int64_t n) {
  tile_body<D, M, R>(x, k, row, rb, y, n);
}

// Pressure scheduling in the tile, as measured on AVX2 (Zen 3; bench/kernel_ab.py
// --flags=-DLLAMAY_NO_SCHEDULED_TILE, M = 2, 3, 4, 8, bit-identical): faster for Q4_1 (up to
// 1.21x), Q5_0, Q8_0 (1.1x at M = 4), Q2_K, Q6_K (1.09-1.14x), IQ4_XS (1.23-1.55x), Q4_K /
// Q5_K at M = 4 (1.28x / 1.22x); slower for Q4_K / Q5_K at M = 2, 3 (0.85-0.93x) and 8 (Q5_K
// 0.95x), which keep the plain tile.
template <class D, int M>
constexpr bool schedule_tile() {
  return !(std::is_same_v<D, DQ45_K<false>> || std::is_same_v<D, DQ45_K<true>>) || M == 4;
}

template <class D, int M, int R>
inline void dequant_tile(const float* x, int64_t k, const uint8_t* row, int64_t rb, float* y,
                         int64_t n) {
#if !defined(LLAMAY_NO_SCHEDULED_TILE)
  if constexpr (schedule_tile<D, M>()) return scheduled_tile<D, M, R>(x, k, row, rb, y, n);
#endif
  plain_tile<D, M, R>(x, k, row, rb, y, n);
}

template <class D, int M>
void decode_rows(const float* x, const float* sx, int64_t k, const uint8_t* w, int64_t rb,
                 int64_t n0, int64_t n1, float* y, int64_t n) {
  if (M == 1) return scale_after_rows<D, M>(x, sx, k, w, rb, n0, n1, y, n);
#if defined(__AVX2__) && !defined(__AVX512F__)
  constexpr int R = M <= 4 ? 2 : 1;  // at most 8 accumulators of AVX2's 16 registers
#else
  constexpr int R = D::VECS > 2 ? 1 : 2;  // the K-quants' 16 vectors a row fill the registers
#endif
  int64_t r = n0;
  for (; r + R <= n1; r += R) dequant_tile<D, M, R>(x, k, w + r * rb, rb, y + r, n);
  for (; r < n1; ++r) dequant_tile<D, M, 1>(x, k, w + r * rb, rb, y + r, n);
}

// -- the panel loop (prefill; the scalar build) ---------------------------------------
// x packed once per call in blocks of MB rows stored k-major (xp[b][i][l] = x[b·MB + l][i]);
// then per task WR weight rows at a time dequantised into a panel (WR x k f32, L1/L2),
// and register tiles of MB x rows by WR weight rows over all blocks of x: per k, XV vector
// loads of x and WR broadcasts of the panel feed WR·XV FMAs, and each output's sum stays
// in one lane to the end (no horizontal adds). WR·XV accumulators + XV + 1 fit the
// registers: 16 vector registers (AVX2, SSE) take 6 x 2, 32 (AVX-512, NEON) 12 x 2.

#if defined(LLAMAY_SCALAR)
constexpr int VW = 1;
#elif defined(__AVX512F__)
constexpr int VW = 16;
#elif defined(__AVX__)
constexpr int VW = 8;
#else
constexpr int VW = 4;
#endif
#if defined(__AVX512F__) || defined(__aarch64__)
constexpr int WR = 12;
#else
constexpr int WR = 6;
#endif
constexpr int XV = 2, MB = XV * VW;
typedef float vf __attribute__((vector_size(4 * VW)));
inline vf loadv(const float* p) { vf v; std::memcpy(&v, p, sizeof v); return v; }
inline void storev(float* p, vf v) { std::memcpy(p, &v, sizeof v); }

// x [m, k] as ceil(m / MB) blocks [k][MB] (rows past m zero), blocks [b0, b1).
void pack_x(const float* x, int64_t m, int64_t k, int64_t b0, int64_t b1, float* xp) {
  for (int64_t b = b0; b < b1; ++b) {
    float* dst = xp + b * k * MB;
    const float* src = x + b * MB * k;
    const int rows = (int)std::min<int64_t>(MB, m - b * MB);
#if defined(__AVX__) && !defined(LLAMAY_SCALAR)
    if (rows == MB) {  // 8 x 8 transposes: rows l0..l0+7, columns i..i+7
      int64_t i = 0;
      for (; i + 8 <= k; i += 8)
        for (int l0 = 0; l0 < MB; l0 += 8) {
          __m256 r[8], t[8];
          for (int l = 0; l < 8; ++l) r[l] = _mm256_loadu_ps(src + (l0 + l) * k + i);
          for (int l = 0; l < 8; l += 2) {
            t[l] = _mm256_unpacklo_ps(r[l], r[l + 1]);
            t[l + 1] = _mm256_unpackhi_ps(r[l], r[l + 1]);
          }
          for (int l = 0; l < 8; l += 4) {
            r[l] = _mm256_shuffle_ps(t[l], t[l + 2], 0x44);
            r[l + 1] = _mm256_shuffle_ps(t[l], t[l + 2], 0xEE);
            r[l + 2] = _mm256_shuffle_ps(t[l + 1], t[l + 3], 0x44);
            r[l + 3] = _mm256_shuffle_ps(t[l + 1], t[l + 3], 0xEE);
          }
          // r[0..3]: columns (0,4) (1,5) (2,6) (3,7) of rows 0-3; r[4..7] of rows 4-7
          for (int c = 0; c < 4; ++c) {
            _mm256_storeu_ps(dst + (i + c) * MB + l0, _mm256_permute2f128_ps(r[c], r[c + 4], 0x20));
            _mm256_storeu_ps(dst + (i + c + 4) * MB + l0, _mm256_permute2f128_ps(r[c], r[c + 4], 0x31));
          }
        }
      for (; i < k; ++i)
        for (int l = 0; l < MB; ++l) dst[i * MB + l] = src[l * k + i];
      continue;
    }
#endif
    for (int64_t i = 0; i < k; ++i)
      for (int l = 0; l < MB; ++l) dst[i * MB + l] = l < rows ? src[l * k + i] : 0.0f;
  }
}

// y[rows of block, C weight rows] = x block · panel rows ᵀ (the panel: C rows of k).
template <int C>
void panel_tile(const float* xb, int64_t k, const float* p, float* y, int64_t n, int rows) {
  vf acc[C][XV] = {};
  for (int64_t i = 0; i < k; ++i) {
    vf xv[XV];
    for (int v = 0; v < XV; ++v) xv[v] = loadv(xb + i * MB + v * VW);
    for (int j = 0; j < C; ++j) {
      const float w = p[j * k + i];
      for (int v = 0; v < XV; ++v) acc[j][v] += w * xv[v];
    }
  }
  float t[C][MB];
  for (int j = 0; j < C; ++j)
    for (int v = 0; v < XV; ++v) storev(t[j] + v * VW, acc[j][v]);
  for (int l = 0; l < rows; ++l)
    for (int j = 0; j < C; ++j) y[l * n + j] = t[j][l];
}

template <int... C>
constexpr auto panel_tiles(std::integer_sequence<int, C...>) {
  using Fn = void (*)(const float*, int64_t, const float*, float*, int64_t, int);
  return std::array<Fn, sizeof...(C)>{&panel_tile<C + 1>...};
}
constexpr auto PANEL_TILES = panel_tiles(std::make_integer_sequence<int, WR>{});

// One weight row as f32 values: the vector decoders where there is one.
template <class D>
void dequant_row_v(const uint8_t* row, float* out, int64_t k) {
  constexpr int PER = D::VECS / D::SUBS;
  constexpr int bb = D::BYTES;
  for (int64_t b = 0; b < k / (16 * D::VECS); ++b) {
    f16v q[D::VECS];
    float sc[D::SUBS], of[D::SUBS];
    D::decode(row + b * bb, q, sc, of);
    for (int v = 0; v < D::VECS; ++v) {
      // in native-width vectors: GCC broadcasts a scalar into a 16-lane vector wider
      // than the registers (AVX2) through 16 stores to the stack
      vf h[16 / VW];
      std::memcpy(h, &q[v], sizeof h);
      for (int u = 0; u < 16 / VW; ++u)
        storev(out + (b * D::VECS + v) * 16 + u * VW, sc[v / PER] * h[u] + of[v / PER]);
    }
  }
}

using RowFn = void (*)(const uint8_t*, float*, int64_t);

// Weight rows [n0, n1) against every block of the packed x (`pack_x`).
void panel_rows(RowFn dq, const float* xp, int64_t m_rows, int64_t k, const uint8_t* w,
                int64_t rb, int64_t n0, int64_t n1, float* y, int64_t n) {
  std::vector<float> panel(WR * k);
  for (int64_t r = n0; r < n1; r += WR) {
    const int c = (int)std::min<int64_t>(WR, n1 - r);
    for (int j = 0; j < c; ++j) dq(w + (r + j) * rb, panel.data() + j * k, k);
    for (int64_t b = 0; b * MB < m_rows; ++b) {
      const int rows = (int)std::min<int64_t>(MB, m_rows - b * MB);
      PANEL_TILES[c - 1](xp + b * k * MB, k, panel.data(), y + b * MB * n + r, n, rows);
    }
  }
}

template <int32_t T>
void scalar_row(const uint8_t* row, float* out, int64_t k) { dequant_row(T, row, out, k); }


// -- the handler -----------------------------------------------------------------------

struct Job {
  const float* x;
  const float* sx;
  int64_t m, k, n, rb;
  const uint8_t* w;
  float* y;
  const uint16_t* xb = nullptr;  // amx_range: x's bf16 pieces (pack_pieces)
  const float* sxt = nullptr;    // amx_range: Σx per 32 for 16 rows at a time
};

using RangeFn = void (*)(const Job&, int64_t, int64_t);

template <class D, int M>
void decode_range(const Job& j, int64_t n0, int64_t n1) {
  decode_rows<D, M>(j.x, j.sx, j.k, j.w, j.rb, n0, n1, j.y, j.n);
}

template <class D>
RangeFn decode_fn(int64_t m) {
  switch (m) {
    case 1: return &decode_range<D, 1>;
    case 2: return &decode_range<D, 2>;
    case 3: return &decode_range<D, 3>;
    case 4: return &decode_range<D, 4>;
    case 5: return &decode_range<D, 5>;
    case 6: return &decode_range<D, 6>;
    case 7: return &decode_range<D, 7>;
    default: return &decode_range<D, 8>;
  }
}

// 9 to 3 x MAX_DECODE_ROWS rows short of a panel block (the panel loop pads x to MB rows:
// at 9-16 rows on AVX-512 it did the work of 32, 3.7x the 8-row tile's time): the decode
// tiles over even groups of x rows (each >= 4: no one-row tile, which needs Σx), weight
// rows 16 at a time so a group after the first reads them from L1. Session 11 (Zen 4),
// Q4_1 1536 x 576: 2.9x at 9 rows, 1.9x at 16, 1.3x at 24; the Q8_0 head at 16: 1.5x.
template <class D>
void grouped_range(const Job& j, int64_t n0, int64_t n1) {
  const int64_t groups = (j.m + MAX_DECODE_ROWS - 1) / MAX_DECODE_ROWS;
  for (int64_t r = n0; r < n1; r += 16)
    for (int64_t g = 0, m0 = 0; g < groups; ++g) {
      const int64_t rows = (j.m - m0) / (groups - g);
      Job part = j;
      part.x = j.x + m0 * j.k;
      part.y = j.y + m0 * j.n;
      part.m = rows;
      decode_fn<D>(rows)(part, r, std::min(n1, r + 16));
      m0 += rows;
    }
}

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && defined(__linux__) && \
    !defined(LLAMAY_SCALAR) && !defined(LLAMAY_NO_AMX)
#define LLAMAY_AMX 1
// -- AMX (8+ x rows, CPUs with AMX-BF16) ---------------------------------------------
// The tile unit multiplies bf16 pairs with f32 sums: x is split exactly into three bf16
// pieces (x = hi + mid + lo: 8 significant bits each, every residual exact in f32), the
// weight's quants are small integers (exact in bf16), so each product is exact and the
// tiles give Σ x·q per sub-block of 32 (16: Q6_K) in f32, which the vector unit scales:
// y += scale·Σx·q + offset·Σx, the dequantisation's value·x summed in another order (as
// the FMA tiles do). Weights are the A tile (16 rows x a sub-block, row-major as decoded),
// x's pieces the B tile (VNNI pairs of k for 16 x rows, packed once per call): C holds
// [weight row][x row]; the 16 x 16 sums are transposed once per tile of outputs.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// The process asks Linux once for the AMX state (arch_prctl); false where refused.
bool amx_allowed() {
  static const bool ok = [] {
    constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
  }();
  return ok;
}

constexpr int64_t AMX_ROWS = 16;
#ifndef AMX_MIN_ROWS
// fewer x rows: slower than the FMA tiles (session 12, kernel_ab, the chunked loop: at
// M = 8 Q5_0 2048 x 640 0.62x, the Q8_0 head 49152 x 576 0.89x; at 16: 1.09x, 1.56x;
// Q4_1 1536 x 576 at 16 and 24: 0.97x, 1.06x)
#define AMX_MIN_ROWS 16
#endif

// x [m, k] -> pieces [m16][3][k / 2][16][2] bf16 (B tiles: rows of k pairs, 16 x rows,
// zero past m) and, with offsets, Σx per 32 as [m16][k / 32][16]. Per 32 values of 16 x
// rows, each row's pieces as 16 pairs (dwords), then per piece the 16 x 16 dwords
// transposed to rows of pairs (one scalar store per pair took a sixth of a Gemma 3
// ffn_down at 128 rows).
void pack_pieces(const float* x, int64_t m, int64_t k, int64_t g0, int64_t g1, uint16_t* xb, float* sxt) {
  for (int64_t g = g0; g < g1; ++g) {
    uint16_t* base = xb + g * 3 * k * AMX_ROWS;
    for (int64_t c = 0; c < k; c += 32) {
      __m512 pairs[3][16];  // [piece][x row]: 16 pairs of bf16
      for (int64_t t = 0; t < AMX_ROWS; ++t) {
        const int64_t row = g * AMX_ROWS + t;
        __m512 v0 = _mm512_setzero_ps(), v1 = _mm512_setzero_ps();
        if (row < m) v0 = _mm512_loadu_ps(x + row * k + c), v1 = _mm512_loadu_ps(x + row * k + c + 16);
        if (sxt) sxt[(g * (k / 32) + c / 32) * AMX_ROWS + t] = _mm512_reduce_add_ps(_mm512_add_ps(v0, v1));
        for (int piece = 0; piece < 3; ++piece) {
          const __m512bh h = _mm512_cvtne2ps_pbh(v1, v0);  // round to nearest even; v0 in the low half
          const __m512i hi = (__m512i)h;
          v0 = _mm512_sub_ps(v0, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(hi)), 16)));
          v1 = _mm512_sub_ps(v1, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(hi, 1)), 16)));
          pairs[piece][t] = _mm512_castsi512_ps(hi);  // (each subtraction exact)
        }
      }
      for (int piece = 0; piece < 3; ++piece) {
        transpose16(pairs[piece]);  // [pair][x row]
        float* out = (float*)(base + piece * k * AMX_ROWS) + (c / 2) * AMX_ROWS;
        for (int i = 0; i < 16; ++i) _mm512_storeu_ps(out + i * AMX_ROWS, pairs[piece][i]);
      }
    }
  }
}

// Weight rows in chunks of up to AMX_CHUNK groups of 16, decoded once (bf16, [group of
// 16 rows][sub-block][row][SB]); then per 16 x rows and sub-block, x's three pieces are
// loaded into tiles once and serve every weight group of the chunk (their sums kept in
// an L1 buffer): per product tile one 1 KB weight tile is loaded, where loading x's 3 KB
// per weight group ran at a third of the tile unit's speed (from L2). Two sets of weight
// and sum tiles alternate, so that one group's products overlap the last one's store.
constexpr int64_t AMX_CHUNK = 8;

template <class D>
void amx_range(const Job& j, int64_t n0, int64_t n1) {
  constexpr int BE = 16 * D::VECS, SB = BE / D::SUBS;  // sub-block: 32 or 16 elements
  const int64_t nb = j.k / BE, ng = j.k / SB, m16 = (j.m + AMX_ROWS - 1) / AMX_ROWS;
  TileConfig cfg;
  for (int t : {0, 5}) cfg.rows[t] = 16, cfg.colsb[t] = 64;              // C [w row][x row]
  for (int t = 1; t <= 3; ++t) cfg.rows[t] = SB / 2, cfg.colsb[t] = 64;  // x pieces
  for (int t : {4, 6}) cfg.rows[t] = 16, cfg.colsb[t] = 2 * SB;          // weights
  _tile_loadconfig(&cfg);
  const int64_t per_group = ng * AMX_ROWS * SB;  // bf16 values of one group of 16 rows
  // (not zeroed: the decode writes every element, zeros past n1; a vector's zeroing of
  // the 512 KB of a Gemma 3 ffn_down task took 7 % of its time)
  const std::unique_ptr<uint16_t[]> wq(new uint16_t[AMX_CHUNK * per_group]);
  const std::unique_ptr<float[]> sc(new float[AMX_CHUNK * ng * AMX_ROWS]);
  const std::unique_ptr<float[]> of(new float[D::OFFS ? AMX_CHUNK * ng * AMX_ROWS : 1]);
  std::vector<__m512> accs(AMX_CHUNK * 16);
  alignas(64) float cbuf[2][16][16];
  for (int64_t c0 = n0; c0 < n1; c0 += AMX_CHUNK * AMX_ROWS) {
    const int64_t groups = std::min<int64_t>(AMX_CHUNK, (n1 - c0 + AMX_ROWS - 1) / AMX_ROWS);
    for (int64_t r = 0; r < groups * AMX_ROWS; ++r) {  // decode (rows past n1: zeros)
      const int64_t wg = r / AMX_ROWS, rr = r % AMX_ROWS;
      for (int64_t b = 0; b < nb; ++b) {
        f16v q[D::VECS];
        float s[D::SUBS], o[D::SUBS];
        if (c0 + r < n1) {
          const uint8_t* blk = j.w + (c0 + r) * j.rb + b * D::BYTES;
          prefetch(blk + PREFETCH_AHEAD);
          D::decode(blk, q, s, o);
        } else {
          for (auto& v : q) v = f16v{};
          for (int i = 0; i < D::SUBS; ++i) s[i] = o[i] = 0.0f;
        }
        for (int v = 0; v < D::VECS; ++v) {
          const int64_t e = b * BE + 16 * v, g = e / SB;
          uint16_t* dst = &wq[wg * per_group + (g * AMX_ROWS + rr) * SB + e % SB];
          _mm256_storeu_si256((__m256i*)dst, (__m256i)_mm512_cvtneps_pbh((__m512)q[v]));
        }
        for (int i = 0; i < D::SUBS; ++i) {
          const int64_t at = (wg * ng + b * D::SUBS + i) * AMX_ROWS + rr;
          sc[at] = s[i];
          if (D::OFFS) of[at] = o[i];
        }
      }
    }
    for (int64_t tg = 0; tg < m16; ++tg) {
      for (auto& a : accs) a = _mm512_setzero_ps();
      const uint16_t* xb = j.xb + tg * 3 * j.k * AMX_ROWS;
      for (int64_t g = 0; g < ng; ++g) {
        _tile_loadd(1, xb + g * SB * AMX_ROWS, 64);
        _tile_loadd(2, xb + (j.k + g * SB) * AMX_ROWS, 64);
        _tile_loadd(3, xb + (2 * j.k + g * SB) * AMX_ROWS, 64);
        const __m512 sx = D::OFFS ? _mm512_loadu_ps(j.sxt + (tg * (j.k / 32) + g) * AMX_ROWS) : __m512{};
        // the sums of weight group wg, stored to cbuf[wg % 2], into its accumulators
        const auto scale = [&](int64_t wg) {
          __m512* acc = &accs[wg * 16];
          const float* sg = &sc[(wg * ng + g) * AMX_ROWS];
          for (int r = 0; r < 16; ++r) acc[r] = _mm512_fmadd_ps(_mm512_load_ps(cbuf[wg % 2][r]), _mm512_set1_ps(sg[r]), acc[r]);
          if (D::OFFS) {
            const float* og = &of[(wg * ng + g) * AMX_ROWS];
            for (int r = 0; r < 16; ++r) acc[r] = _mm512_fmadd_ps(sx, _mm512_set1_ps(og[r]), acc[r]);
          }
        };
        for (int64_t wg = 0; wg < groups; ++wg) {
          const uint16_t* a = &wq[wg * per_group + g * AMX_ROWS * SB];
          if (wg % 2 == 0) {
            _tile_loadd(4, a, 2 * SB);
            _tile_zero(0);
            _tile_dpbf16ps(0, 4, 1);
            _tile_dpbf16ps(0, 4, 2);
            _tile_dpbf16ps(0, 4, 3);
          } else {
            _tile_loadd(6, a, 2 * SB);
            _tile_zero(5);
            _tile_dpbf16ps(5, 6, 1);
            _tile_dpbf16ps(5, 6, 2);
            _tile_dpbf16ps(5, 6, 3);
          }
          if (wg > 0) scale(wg - 1);  // the last group's sums, while these run
          if (wg % 2 == 0) _tile_stored(0, cbuf[0], 64);
          else _tile_stored(5, cbuf[1], 64);
        }
        scale(groups - 1);
      }
      const int64_t rows = std::min<int64_t>(AMX_ROWS, j.m - tg * AMX_ROWS);
      for (int64_t wg = 0; wg < groups; ++wg) {
        __m512* acc = &accs[wg * 16];
        transpose16(acc);  // acc[t]: x row t's 16 outputs
        const int64_t r0 = c0 + wg * AMX_ROWS, nr = std::min<int64_t>(AMX_ROWS, n1 - r0);
        const __mmask16 keep = (__mmask16)((1u << nr) - 1);
        for (int64_t t = 0; t < rows; ++t) _mm512_mask_storeu_ps(j.y + (tg * AMX_ROWS + t) * j.n + r0, keep, acc[t]);
      }
    }
  }
  _tile_release();
}

// The types whose decoded quants are integers exact in bf16, with sub-blocks of 32 or 16.
constexpr bool amx_type(int32_t t) {
  return t == Q4_0 || t == Q4_1 || t == Q5_0 || t == Q5_1 || t == Q8_0 || t == Q4_K || t == Q5_K || t == Q6_K;
}
#endif

struct Plan {
  RangeFn decode = nullptr;  // null: the buffer loop with `row`
  RowFn row = nullptr;
  int sub = 0;  // elements per sub-block with offsets (0: none)
  bool amx = false, amx_offsets = false;  // decode is amx_range (x packed for it)
};

template <class D>
Plan plan_of(int64_t m, bool amx) {
  Plan p;
  p.row = &dequant_row_v<D>;
#if defined(LLAMAY_AMX)
  constexpr int SB = 16 * D::VECS / D::SUBS;  // sub-blocks of 16 or 32; offsets: Σx per 32
  if constexpr (SB == 32 || (SB == 16 && !D::OFFS)) {
    if (amx && m >= AMX_MIN_ROWS && amx_allowed()) {
      p.decode = &amx_range<D>;
      p.amx = true;
      p.amx_offsets = D::OFFS;
      return p;
    }
  }
#endif
  if (m <= MAX_DECODE_ROWS) {
    p.decode = decode_fn<D>(m);
    if (D::OFFS && m == 1) p.sub = 16 * D::VECS / D::SUBS;
  } else if (m < MB && m <= 3 * MAX_DECODE_ROWS) {
    p.decode = &grouped_range<D>;
  }
  return p;
}

Plan plan(int32_t t, int64_t m) {
  Plan p;
#if defined(LLAMAY_AMX)
  const bool amx = amx_type(t);
#else
  const bool amx = false;
#endif
#if !defined(LLAMAY_SCALAR)
  switch (t) {
    case Q4_0: return plan_of<DQ4_0>(m, amx);
    case Q4_1: return plan_of<DQ4_1>(m, amx);
    case Q5_0: return plan_of<DQ5<false>>(m, amx);
    case Q5_1: return plan_of<DQ5<true>>(m, amx);
    case Q8_0: return plan_of<DQ8_0>(m, amx);
    case Q2_K: return plan_of<DQ2_K>(m, amx);
    case Q3_K: return plan_of<DQ3_K>(m, amx);
    case Q4_K: return plan_of<DQ45_K<false>>(m, amx);
    case Q5_K: return plan_of<DQ45_K<true>>(m, amx);
    case Q6_K: return plan_of<DQ6_K>(m, amx);
    case IQ4_NL: return plan_of<DNL<IQ4_NL>>(m, amx);
    case IQ4_XS: return plan_of<DNL<IQ4_XS>>(m, amx);
    case MXFP4: return plan_of<DNL<MXFP4>>(m, amx);
    case TQ1_0: return plan_of<DIQ<TQ1_0>>(m, amx);
    case TQ2_0: return plan_of<DIQ<TQ2_0>>(m, amx);
    case IQ2_XXS: return plan_of<DIQ<IQ2_XXS>>(m, amx);
    case IQ2_XS: return plan_of<DIQ<IQ2_XS>>(m, amx);
    case IQ2_S: return plan_of<DIQ<IQ2_S>>(m, amx);
    case IQ3_XXS: return plan_of<DIQ<IQ3_XXS>>(m, amx);
    case IQ3_S: return plan_of<DIQ<IQ3_S>>(m, amx);
    case IQ1_S: return plan_of<DIQ<IQ1_S>>(m, amx);
    case IQ1_M: return plan_of<DIQ<IQ1_M>>(m, amx);
  }
#endif
  switch (t) {
    case F32: p.row = &scalar_row<F32>; break;
    case F16: p.row = &scalar_row<F16>; break;
    case BF16: p.row = &scalar_row<BF16>; break;
    case Q4_0: p.row = &scalar_row<Q4_0>; break;
    case Q4_1: p.row = &scalar_row<Q4_1>; break;
    case Q5_0: p.row = &scalar_row<Q5_0>; break;
    case Q5_1: p.row = &scalar_row<Q5_1>; break;
    case Q8_0: p.row = &scalar_row<Q8_0>; break;
    case Q2_K: p.row = &scalar_row<Q2_K>; break;
    case Q3_K: p.row = &scalar_row<Q3_K>; break;
    case Q4_K: p.row = &scalar_row<Q4_K>; break;
    case Q5_K: p.row = &scalar_row<Q5_K>; break;
    case Q6_K: p.row = &scalar_row<Q6_K>; break;
    case IQ4_NL: p.row = &scalar_row<IQ4_NL>; break;
    case IQ4_XS: p.row = &scalar_row<IQ4_XS>; break;
    case MXFP4: p.row = &scalar_row<MXFP4>; break;
    case TQ1_0: p.row = &scalar_row<TQ1_0>; break;
    case TQ2_0: p.row = &scalar_row<TQ2_0>; break;
    case IQ2_XXS: p.row = &scalar_row<IQ2_XXS>; break;
    case IQ2_XS: p.row = &scalar_row<IQ2_XS>; break;
    case IQ2_S: p.row = &scalar_row<IQ2_S>; break;
    case IQ3_XXS: p.row = &scalar_row<IQ3_XXS>; break;
    case IQ3_S: p.row = &scalar_row<IQ3_S>; break;
    case IQ1_S: p.row = &scalar_row<IQ1_S>; break;
    case IQ1_M: p.row = &scalar_row<IQ1_M>; break;
  }
  return p;
}

// Rows per task: about four tasks a thread, a multiple of `unit` (whole panels).
int64_t rows_per_task(int64_t n, int64_t threads, int64_t unit) {
  int64_t per = (n + 4 * threads - 1) / (4 * threads);
  per = std::max<int64_t>(per, 16);
  return (per + unit - 1) / unit * unit;
}

// One weight's share of a call: its plan, its job and how its rows split into tasks.
struct Part {
  Plan p;
  Job job;
  std::vector<float> sx;
  int64_t per = 0, tasks = 0;
};

ffi::Error part_of(const ffi::Buffer<ffi::F32>& x, const ffi::Buffer<ffi::U8>& w,
                   const ffi::BufferR0<ffi::S32>& layer, float* y, int32_t type,
                   int64_t threads, Part* part) {
  auto xd = x.dimensions();
  Weight wt;
  if (auto err = weight_of(w, layer, &wt); err.failure()) return err;
  const int64_t k = xd.size() == 0 ? 1 : xd.back();
  const int64_t m = k ? (int64_t)x.element_count() / k : 0, n = wt.n, rb = wt.row_bytes;
  if (block_elems(type) == 0) return ffi::Error::InvalidArgument("LlamayQmmExact: unsupported weight type");
  if (k % block_elems(type) || k / block_elems(type) * block_bytes(type) != rb)
    return ffi::Error::InvalidArgument("LlamayQmmExact: x's last dim does not match the weight rows");
  part->p = plan(type, m);
  if (part->p.sub) {
    part->sx.resize(m * (k / part->p.sub));
    sub_sums(x.typed_data(), m, k, part->p.sub, part->sx.data());
  }
  part->job = Job{x.typed_data(), part->sx.data(), m, k, n, rb, wt.data, y};
  part->per = rows_per_task(n, threads, part->p.amx ? 16 : part->p.decode ? 4 : WR);
  part->tasks = (n + part->per - 1) / part->per;
  return ffi::Error::Success();
}

// Every part's row tasks in one split over the pool (one handoff to the threads). The
// parts read one x: packed once for those that take the panel loop.
void run_parts(ffi::ThreadPool& pool, const Part* parts, int64_t count) {
  int64_t total = 0;
  bool panels = false;
  for (int64_t i = 0; i < count; ++i) total += parts[i].tasks, panels |= !parts[i].p.decode;
  std::vector<float> xp;
  if (panels && count) {
    const Job& j = parts[0].job;
    const int64_t blocks = (j.m + MB - 1) / MB;
    xp.resize(blocks * MB * j.k);
    parallel_for(pool, blocks, [&](int64_t b) { pack_x(j.x, j.m, j.k, b, b + 1, xp.data()); });
  }
#if defined(LLAMAY_AMX)
  bool amx = false, offsets = false;
  for (int64_t i = 0; i < count; ++i) amx |= parts[i].p.amx, offsets |= parts[i].p.amx_offsets;
  std::unique_ptr<uint16_t[]> xb;  // (not zeroed: pack_pieces writes every element)
  std::unique_ptr<float[]> sxt;
  if (amx) {  // x's pieces for the AMX tiles, once for all parts
    const Job& j = parts[0].job;
    const int64_t m16 = (j.m + AMX_ROWS - 1) / AMX_ROWS;
    xb.reset(new uint16_t[m16 * 3 * j.k * AMX_ROWS]);
    if (offsets) sxt.reset(new float[m16 * (j.k / 32) * AMX_ROWS]);
    parallel_for(pool, m16, [&](int64_t g) { pack_pieces(j.x, j.m, j.k, g, g + 1, xb.get(), sxt.get()); });
  }
#endif
  parallel_for(pool, total, [&](int64_t task) {
    const Part* part = parts;
    while (task >= part->tasks) task -= (part++)->tasks;
    const Job& j = part->job;
    const int64_t n0 = task * part->per, n1 = std::min(j.n, n0 + part->per);
#if defined(LLAMAY_AMX)
    if (part->p.amx) {
      Job with = j;
      with.xb = xb.get(), with.sxt = sxt.get();
      return part->p.decode(with, n0, n1);
    }
#endif
    if (part->p.decode) {
      part->p.decode(j, n0, n1);
    } else {
      panel_rows(part->p.row, xp.data(), j.m, j.k, j.w, j.rb, n0, n1, j.y, j.n);
    }
  });
}

ffi::Error QmmExact(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::U8> w,
                    ffi::BufferR0<ffi::S32> layer,
                    ffi::ResultBuffer<ffi::F32> y, int32_t type) {
  Part part;
  if (auto err = part_of(x, w, layer, y->typed_data(), type, pool.num_threads(), &part); err.failure())
    return err;
  run_parts(pool, &part, 1);
  return ffi::Error::Success();
}

// Several weights that read the same x (q, k, v; gate, up), all their rows in one split
// over the threads; `ggml_types[i]` is stack i's type, `results` as for_each_stack.
ffi::Error QmmExactMulti(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::RemainingArgs args,
                         ffi::RemainingRets rets, ffi::Span<const int32_t> types,
                         ffi::Span<const int32_t> results) {
  if (types.size() != results.size())
    return ffi::Error::InvalidArgument("LlamayQmmExactMulti: one type per stack");
  std::vector<Part> parts;
  parts.reserve(types.size());
  auto err = for_each_stack("LlamayQmmExactMulti", args, rets, results,
                            [&](int64_t i, const ffi::Buffer<ffi::U8>& w, const ffi::BufferR0<ffi::S32>& layer,
                                float* y) {
                              parts.emplace_back();
                              return part_of(x, w, layer, y, types[i], pool.num_threads(), &parts.back());
                            });
  if (err.failure()) return err;
  run_parts(pool, parts.data(), (int64_t)parts.size());
  return ffi::Error::Success();
}

}  // namespace
}  // namespace llamay

XLA_FFI_DEFINE_HANDLER_SYMBOL(LlamayQmmExact, llamay::QmmExact,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Arg<ffi::BufferR0<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int32_t>("ggml_type"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(LlamayQmmExactMulti, llamay::QmmExactMulti,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<ffi::Span<const int32_t>>("ggml_types")
                                  .Attr<ffi::Span<const int32_t>>("results"));
