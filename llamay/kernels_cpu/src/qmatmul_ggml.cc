// Quantised matmul y[M, N] = x[M, K] · W[N, K]ᵀ over GGUF block rows in llama.cpp's
// numerics, as XLA FFI handlers (exact numerics: qmatmul_exact.cc).
//
// LlamayQmmQ8, LlamayQmmQ8K: the activations come already quantised (by the
// same jnp code the XLA path uses: llamay.quant.act_quant), and every f32 operation
// after the exact integer dots is ggml's, in ggml's order, with explicit fmaf and no
// other contraction (built with -ffp-contract=off): bit-identical to the XLA emulation
// in llamay.quant.qtensor (_q8_block_dot, _q4_0_repack_dot, kquant_dot_q8k).
//
// LLAMAY_SCALAR (a test build) leaves out every intrinsic: the integer
// sums are exact and the float operations are the same per lane either way.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "blocks.h"
#include "operands.h"
#include "parallel.h"
#include "xla/ffi/api/ffi.h"

#if !defined(LLAMAY_SCALAR) && defined(__AVX2__)
#include <immintrin.h>
#define LLAMAY_AVX2 1
#endif

namespace ffi = xla::ffi;

namespace llamay {
namespace {

// Output rows per task: whole tiles, a few tasks per thread (uneven progress evens out).
int64_t rows_per_task(int64_t n, int64_t threads, int64_t multiple) {
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

// -- llamacpp: integer lane sums -------------------------------------------------------

// ggml's AVX2 int32 lanes of one 32-byte chunk: lane l = Σ_{i<4} w[4l+i]·a[4l+i] (exact).
#if defined(LLAMAY_AVX2)
// w unsigned (0..255) times a signed.
inline __m256i lanes_u8(__m256i w, __m256i a) {
#if defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), w, a);
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, a);
#else  // the pair sums fit int16: |w| <= 128 and |a| <= 127 here
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1));
#endif
}
// Both signed: |w| times a with w's sign (exact while a > -128: ggml's Q8 quants are).
inline __m256i lanes_s8(__m256i w, __m256i a) {
  return lanes_u8(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
}
inline __m256i load256(const void* p) { return _mm256_loadu_si256((const __m256i*)p); }
#endif

inline void lanes_i8(const int8_t* w, const int8_t* a, int32_t* out) {
#if defined(LLAMAY_AVX2)
  _mm256_storeu_si256((__m256i*)out, lanes_s8(load256(w), load256(a)));
#else
  for (int l = 0; l < 8; ++l) {
    int32_t s = 0;
    for (int i = 0; i < 4; ++i) s += (int32_t)w[4 * l + i] * a[4 * l + i];
    out[l] = s;
  }
#endif
}

inline float hsum8(const float* v) {
  const float t0 = v[4] + v[0], t1 = v[5] + v[1], t2 = v[6] + v[2], t3 = v[7] + v[3];
  return (t0 + t2) + (t1 + t3);
}

#if defined(LLAMAY_AVX2)
// bit i of the 32-bit word at p -> byte i = 0xFF or 0
inline __m256i bytes_from_bits(const uint8_t* p) {
  uint32_t bits;
  std::memcpy(&bits, p, 4);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32((int)bits),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
  const __m256i others = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);  // all bits but the one
  return _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi64x(-1));
}

// A 32-element block's quants in element order (as q32_parts gives them).
inline __m256i decode_q32(int32_t t, const uint8_t* b) {
  if (t == Q8_0) return load256(b + 2);
  const int qs = t == Q4_0 ? 2 : t == Q4_1 ? 4 : t == Q5_0 ? 6 : 8;
  const __m128i v = _mm_loadu_si128((const __m128i*)(b + qs));
  const __m128i m4 = _mm_set1_epi8(0xF);
  __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_and_si128(v, m4));
  if (t == Q5_0 || t == Q5_1)
    q = _mm256_or_si256(q, _mm256_and_si256(bytes_from_bits(b + qs - 4), _mm256_set1_epi8(0x10)));
  if (t == Q4_0) q = _mm256_sub_epi8(q, _mm256_set1_epi8(8));
  if (t == Q5_0) q = _mm256_sub_epi8(q, _mm256_set1_epi8(16));
  return q;
}
#endif

// One weight row of a 32-element type, unpacked for the dots: quants, d, m per block.
struct Q32Row {
  std::vector<int8_t> q;
  std::vector<float> d, m;
  __attribute__((always_inline)) void load(int32_t type, const uint8_t* row, int64_t nb) {
    q.resize(nb * 32);
    d.resize(nb);
    m.resize(nb);
    const int bb = block_bytes(type);
    for (int64_t b = 0; b < nb; ++b) {
#if defined(LLAMAY_AVX2)
      const uint8_t* p = row + b * bb;
      d[b] = rdf16(p);
      m[b] = (type == Q4_1 || type == Q5_1) ? rdf16(p + 2) : 0.0f;
      _mm256_storeu_si256((__m256i*)&q[b * 32], decode_q32(type, p));
#else
      q32_parts(type, row + b * bb, &q[b * 32], &d[b], &m[b]);
#endif
    }
  }
};

// vec_dot_{q4_0,q5_0,q8_0}_q8_0 / {q4_1,q5_1}_q8_1 (lanes) or the Q4_0x8 repack
// GEMV/GEMM (whole_block): see qtensor._q8_block_dot / _q4_0_repack_dot.
__attribute__((always_inline)) inline float q8_dot(const Q32Row& w, int64_t nb, const int8_t* qa, const float* da, const float* sa,
             bool has_m, bool whole_block) {
  if (whole_block) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      int32_t l[8];
      lanes_i8(&w.q[b * 32], qa + b * 32, l);
      const int32_t s = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
      acc = std::fmaf((float)s, da[b] * w.d[b], acc);
    }
    return acc;
  }
#if defined(LLAMAY_AVX2)
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const __m256 xy = _mm256_cvtepi32_ps(lanes_s8(load256(&w.q[b * 32]), load256(qa + b * 32)));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(da[b] * w.d[b]), xy, acc);
  }
  float a8[8];
  _mm256_storeu_ps(a8, acc);
#else
  float a8[8] = {};
  for (int64_t b = 0; b < nb; ++b) {
    int32_t l[8];
    lanes_i8(&w.q[b * 32], qa + b * 32, l);
    const float dd = da[b] * w.d[b];
    for (int i = 0; i < 8; ++i) a8[i] = std::fmaf(dd, (float)l[i], a8[i]);
  }
#endif
  float y = hsum8(a8);
  if (has_m) {
    float summs = 0.0f;
    for (int64_t b = 0; b < nb; ++b) summs = summs + sa[b] * w.m[b];
    y = y + summs;
  }
  return y;
}

struct Q8Job {
  const int8_t* qa;
  const float *da, *sa;
  const uint8_t* w;
  float* y;
  Dims d;
  int64_t nb;
  bool whole_block;
};

// Output rows [n0, n1) for weight type T (a template: the per-block decode specialised).
template <int32_t T>
void q8_rows(const Q8Job& j, int64_t n0, int64_t n1) {
  constexpr bool has_m = T == Q4_1 || T == Q5_1;
  Q32Row row;  // per task (a thread_local costs a TLS lookup per use in a shared library)
  for (int64_t n = n0; n < n1; ++n) {
    row.load(T, j.w + n * j.d.row_bytes, j.nb);
    for (int64_t m = 0; m < j.d.m; ++m)
      j.y[m * j.d.n + n] = q8_dot(row, j.nb, j.qa + m * j.d.k, j.da + m * j.nb, j.sa + m * j.nb,
                                  has_m, j.whole_block);
  }
}

ffi::Error QmmQ8(ffi::ThreadPool pool, ffi::Buffer<ffi::S8> qa, ffi::Buffer<ffi::F32> da,
                 ffi::Buffer<ffi::F32> sa, ffi::Buffer<ffi::U8> w, ffi::BufferR0<ffi::S32> layer, ffi::ResultBuffer<ffi::F32> y,
                 int32_t type, int32_t whole_block) {
  Weight wt;
  if (auto err = weight_of(w, layer, &wt); err.failure()) return err;
  const Dims d = dims_of(qa, wt);
  if (auto err = check(type, d); err.failure()) return err;
  if (block_elems(type) != 32) return ffi::Error::InvalidArgument("LlamayQmmQ8: needs a 32-element block type");
  const int64_t nb = d.k / 32;
  const int8_t* qp = qa.typed_data();
  const float *dp = da.typed_data(), *sp = sa.typed_data();
  const uint8_t* wp = wt.data;
  float* yp = y->typed_data();
  const Q8Job job{qp, dp, sp, wp, yp, d, nb, whole_block != 0};
  void (*rows)(const Q8Job&, int64_t, int64_t) = nullptr;
  switch (type) {
    case Q4_0: rows = &q8_rows<Q4_0>; break;
    case Q4_1: rows = &q8_rows<Q4_1>; break;
    case Q5_0: rows = &q8_rows<Q5_0>; break;
    case Q5_1: rows = &q8_rows<Q5_1>; break;
    default: rows = &q8_rows<Q8_0>; break;
  }
  const int64_t per = rows_per_task(d.n, pool.num_threads(), 1);
  parallel_for(pool, (d.n + per - 1) / per, [&](int64_t task) {
    rows(job, task * per, std::min(d.n, (task + 1) * per));
  });
  return ffi::Error::Success();
}

// -- llamacpp: K-quants x Q8_K ---------------------------------------------------------

enum KKernel : int32_t { K_VEC = 0, K_TILED = 1, K_REPACK = 2 };

// The scales of one K-quant super-block: per sub-block scale (16 or 8 sub-blocks) and
// mins (16 for Q2_K, 8 for Q4_K/Q5_K, else none), d and dmin; returns the sub-blocks.
inline int kquant_scales(int32_t t, const uint8_t* b, int16_t* sc, int16_t* mins, int* n_mins,
                         float* d, float* dmin) {
  *dmin = 0.0f;
  *n_mins = 0;
  switch (t) {
    case Q2_K:
      *d = rdf16(b + 80);
      *dmin = rdf16(b + 82);
      for (int s = 0; s < 16; ++s) sc[s] = b[s] & 0xF, mins[s] = b[s] >> 4;
      *n_mins = 16;
      return 16;
    case Q3_K: {
      int8_t s16[16];
      q3k_scales(b + 96, s16);
      for (int s = 0; s < 16; ++s) sc[s] = s16[s];
      *d = rdf16(b + 108);
      return 16;
    }
    case Q4_K:
    case Q5_K:
      *d = rdf16(b);
      *dmin = rdf16(b + 2);
      for (int s = 0; s < 8; ++s) {
        uint8_t a, m;
        scale_min_k4(s, b + 4, &a, &m);
        sc[s] = a, mins[s] = m;
      }
      *n_mins = 8;
      return 8;
    default:  // Q6_K
      for (int s = 0; s < 16; ++s) sc[s] = ((const int8_t*)(b + 192))[s];
      *d = rdf16(b + 208);
      return 16;
  }
}

#if defined(LLAMAY_AVX2)
// A K-quant super-block's 256 quants in element order (as kquant_parts gives them).
inline void decode_kquant(int32_t t, const uint8_t* b, int8_t* q) {
  const __m256i m2 = _mm256_set1_epi8(3), m4 = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1);
  auto st = [q](int at, __m256i v) { _mm256_storeu_si256((__m256i*)(q + at), v); };
  auto shr = [](__m256i v, int s) { return _mm256_srli_epi16(v, s); };  // then masked per byte
  switch (t) {
    case Q2_K:
      for (int n = 0; n < 2; ++n) {
        const __m256i v = load256(b + 16 + 32 * n);
        for (int j = 0; j < 4; ++j) st(128 * n + 32 * j, _mm256_and_si256(shr(v, 2 * j), m2));
      }
      return;
    case Q3_K: {
      const __m256i hm = load256(b);
      for (int n = 0; n < 2; ++n) {
        const __m256i v = load256(b + 32 + 32 * n);
        for (int j = 0; j < 4; ++j) {
          const __m256i low = _mm256_and_si256(shr(v, 2 * j), m2);
          const __m256i high = _mm256_and_si256(shr(hm, 4 * n + j), one);
          st(128 * n + 32 * j, _mm256_add_epi8(_mm256_sub_epi8(low, _mm256_set1_epi8(4)),
                                               _mm256_slli_epi16(high, 2)));
        }
      }
      return;
    }
    case Q4_K:
    case Q5_K: {
      const uint8_t* qs = b + (t == Q5_K ? 48 : 16);
      const __m256i qh = t == Q5_K ? load256(b + 16) : _mm256_setzero_si256();
      for (int n = 0; n < 4; ++n) {
        const __m256i v = load256(qs + 32 * n);
        __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(shr(v, 4), m4);
        if (t == Q5_K) {
          lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(shr(qh, 2 * n), one), 4));
          hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(shr(qh, 2 * n + 1), one), 4));
        }
        st(64 * n, lo);
        st(64 * n + 32, hi);
      }
      return;
    }
    default:  // Q6_K
      for (int n = 0; n < 2; ++n) {
        const __m256i l0 = load256(b + 64 * n), l1 = load256(b + 64 * n + 32);
        const __m256i h = load256(b + 128 + 32 * n);
        auto hb = [&](int s) { return _mm256_slli_epi16(_mm256_and_si256(shr(h, s), m2), 4); };
        st(128 * n + 0, _mm256_or_si256(_mm256_and_si256(l0, m4), hb(0)));
        st(128 * n + 32, _mm256_or_si256(_mm256_and_si256(l1, m4), hb(2)));
        st(128 * n + 64, _mm256_or_si256(_mm256_and_si256(shr(l0, 4), m4), hb(4)));
        st(128 * n + 96, _mm256_or_si256(_mm256_and_si256(shr(l1, 4), m4), hb(6)));
      }
  }
}
#endif

// One weight row of a K-quant, unpacked: per super-block the quants q (Q6_K unsigned),
// the sub-block scales sc16 (16 or 8 of them: `subs`), the mins and d, dmin.
struct KRow {
  std::vector<int8_t> q;
  std::vector<int16_t> sc16, mins;
  std::vector<float> d, dmin;
  int n_mins = 0, subs = 0;
  __attribute__((always_inline)) void load(int32_t type, const uint8_t* row, int64_t nsb) {
    q.resize(nsb * 256);
    sc16.resize(nsb * 16);
    mins.resize(nsb * 16);
    d.resize(nsb);
    dmin.resize(nsb);
    const int bb = block_bytes(type);
    for (int64_t s = 0; s < nsb; ++s) {
      const uint8_t* b = row + s * bb;
      subs = kquant_scales(type, b, &sc16[s * 16], &mins[s * 16], &n_mins, &d[s], &dmin[s]);
#if defined(LLAMAY_AVX2)
      decode_kquant(type, b, &q[s * 256]);
#else
      int16_t sc[256], mn[16];
      float dd, dm;
      kquant_parts(type, b, &q[s * 256], sc, mn, &dd, &dm);
#endif
    }
  }
};

// S[8c + j] = lane j of chunk c, scaled: sc · Σ_{i<4} a[32c+4j+i]·q[32c+4j+i] (exact), the
// scale of chunk c's lanes 0-3 and 4-7 being those of 16-element sub-blocks 2c and 2c+1,
// or of 32-element sub-block c.
inline void chunk_sums(const KRow& w, int64_t sb, bool signed_q, const int8_t* a, int32_t* S) {
  const int8_t* q = &w.q[sb * 256];
  const int16_t* sc = &w.sc16[sb * 16];
#if defined(LLAMAY_AVX2)
  for (int c = 0; c < 8; ++c) {
    const __m256i qv = load256(q + 32 * c), av = load256(a + 32 * c);
    const __m256i p = signed_q ? lanes_s8(qv, av) : lanes_u8(qv, av);
    const __m256i scv = w.subs == 16 ? _mm256_set_m128i(_mm_set1_epi32(sc[2 * c + 1]), _mm_set1_epi32(sc[2 * c]))
                                     : _mm256_set1_epi32(sc[c]);
    _mm256_storeu_si256((__m256i*)(S + 8 * c), _mm256_mullo_epi32(p, scv));
  }
#else
  (void)signed_q;
  for (int c = 0; c < 8; ++c)
    for (int j = 0; j < 8; ++j) {
      int32_t p = 0;
      for (int i = 0; i < 4; ++i) p += (int32_t)a[32 * c + 4 * j + i] * q[32 * c + 4 * j + i];
      S[8 * c + j] = sc[w.subs == 16 ? 2 * c + j / 4 : c] * p;
    }
#endif
}

inline int32_t sum_i32(const int32_t* v, int n) {
  int32_t s = 0;
  for (int i = 0; i < n; ++i) s += v[i];
  return s;
}

// m_sub[s] = (Σ of the activation quants over sub-block s) · min[s]  (integers).
inline void min_sums(const KRow& w, int64_t sb, const int16_t* bsums, int32_t* m_sub) {
  const int per = 16 / w.n_mins;  // bsums (of 16 elements) per sub-block
  for (int s = 0; s < w.n_mins; ++s) {
    int32_t b = 0;
    for (int i = 0; i < per; ++i) b += bsums[s * per + i];
    m_sub[s] = b * w.mins[sb * 16 + s];
  }
}

__attribute__((always_inline)) inline float kquant_dot(const KRow& w, int32_t type, int32_t kernel, int parts, int64_t nsb,
                 const int8_t* qa, const float* da, const int16_t* bsums) {
  int32_t m_sub[16];
  if (kernel == K_TILED) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nsb; ++b) {
      int32_t S[64];
      chunk_sums(w, b, type == Q3_K, qa + b * 256, S);
      int32_t s1 = sum_i32(S, 64);
      if (type == Q6_K) {
        int32_t c = 0;
        for (int s = 0; s < 16; ++s) c += (int32_t)bsums[b * 16 + s] * w.sc16[b * 16 + s];
        s1 -= 32 * c;
      }
      float r = (float)s1 * w.d[b];
      if (w.n_mins) {
        min_sums(w, b, bsums + b * 16, m_sub);
        int32_t s2 = 0;
        for (int s = 0; s < w.n_mins; ++s) s2 += m_sub[s];
        r = std::fmaf(-w.dmin[b], (float)s2, r);
      }
      acc = std::fmaf(r, da[b], acc);
    }
    return acc;
  }
  if (kernel == K_REPACK) {
    const int elems = 256 / parts, subs = w.n_mins / parts;
    float acc = 0.0f, acc_min = 0.0f;
    for (int64_t b = 0; b < nsb; ++b) {
      min_sums(w, b, bsums + b * 16, m_sub);
      const float d = da[b] * w.d[b], dmin = da[b] * w.dmin[b];
      int32_t S[64];
      chunk_sums(w, b, type == Q3_K, qa + b * 256, S);
      for (int p = 0; p < parts; ++p) {
        const int32_t total = sum_i32(S + p * elems / 4, elems / 4);
        int32_t m_total = 0;
        for (int s = 0; s < subs; ++s) m_total += m_sub[p * subs + s];
        acc = std::fmaf((float)total, d, acc);
        acc_min = std::fmaf((float)m_total, dmin, acc_min);
      }
    }
    return acc - acc_min;
  }
  float acc[8] = {}, acc_m[4] = {}, summs = 0.0f;
  for (int64_t b = 0; b < nsb; ++b) {
    int32_t S[64], lanes[8];
    chunk_sums(w, b, type == Q3_K, qa + b * 256, S);
    for (int j = 0; j < 8; ++j) {
      int32_t l = 0;
      for (int c = 0; c < 8; ++c) l += S[8 * c + j];
      lanes[j] = l;
    }
    const float d = da[b] * w.d[b], dmin = da[b] * w.dmin[b];
    if (w.n_mins) min_sums(w, b, bsums + b * 16, m_sub);
    if (type == Q6_K) {  // quants stored unsigned: less 32·Σ sc·bsums, lane k over sub-blocks 2k, 2k+1
      for (int k = 0; k < 8; ++k) {
        const int32_t c0 = (int32_t)bsums[b * 16 + 2 * k] * w.sc16[b * 16 + 2 * k];
        const int32_t c1 = (int32_t)bsums[b * 16 + 2 * k + 1] * w.sc16[b * 16 + 2 * k + 1];
        lanes[k] -= 32 * (c0 + c1);
      }
    } else if (type == Q2_K) {  // 8 lanes of min sums into the same accumulator, first
      for (int k = 0; k < 8; ++k) acc[k] = std::fmaf(-dmin, (float)(m_sub[2 * k] + m_sub[2 * k + 1]), acc[k]);
    } else if (type == Q4_K) {
      for (int k = 0; k < 4; ++k) acc_m[k] = std::fmaf(-dmin, (float)(m_sub[2 * k] + m_sub[2 * k + 1]), acc_m[k]);
    } else if (type == Q5_K) {
      int32_t s = 0;
      for (int k = 0; k < 8; ++k) s += m_sub[k];
      summs = std::fmaf(-dmin, (float)s, summs);
    }
    for (int k = 0; k < 8; ++k) acc[k] = std::fmaf(d, (float)lanes[k], acc[k]);
  }
  float y = hsum8(acc);
  if (type == Q4_K) y = y + ((acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]));
  if (type == Q5_K) y = y + summs;
  return y;
}

struct KJob {
  const int8_t* qa;
  const float* da;
  const int16_t* bsums;
  const uint8_t* w;
  float* y;
  Dims d;
  int64_t nsb;
  int32_t kernel;
  int parts;
};

template <int32_t T>
void k_rows(const KJob& j, int64_t n0, int64_t n1) {
  KRow row;
  for (int64_t n = n0; n < n1; ++n) {
    row.load(T, j.w + n * j.d.row_bytes, j.nsb);
    for (int64_t m = 0; m < j.d.m; ++m)
      j.y[m * j.d.n + n] = kquant_dot(row, T, j.kernel, j.parts, j.nsb, j.qa + m * j.d.k,
                                      j.da + m * j.nsb, j.bsums + m * j.nsb * 16);
  }
}

ffi::Error QmmQ8K(ffi::ThreadPool pool, ffi::Buffer<ffi::S8> qa, ffi::Buffer<ffi::F32> da,
                  ffi::Buffer<ffi::S16> bsums, ffi::Buffer<ffi::U8> w, ffi::BufferR0<ffi::S32> layer, ffi::ResultBuffer<ffi::F32> y,
                  int32_t type, int32_t kernel) {
  Weight wt;
  if (auto err = weight_of(w, layer, &wt); err.failure()) return err;
  const Dims d = dims_of(qa, wt);
  if (auto err = check(type, d); err.failure()) return err;
  if (block_elems(type) != 256) return ffi::Error::InvalidArgument("LlamayQmmQ8K: needs a K-quant weight");
  if (kernel == K_REPACK && type != Q4_K && type != Q2_K)
    return ffi::Error::InvalidArgument("LlamayQmmQ8K: the repack kernel is Q4_K/Q2_K only");
  const int64_t nsb = d.k / 256;
  const int parts = kernel == K_REPACK && d.m >= 4 ? (type == Q4_K ? 4 : 2) : 1;
  const int8_t* qp = qa.typed_data();
  const float* dp = da.typed_data();
  const int16_t* bp = bsums.typed_data();
  const uint8_t* wp = wt.data;
  float* yp = y->typed_data();
  const KJob job{qp, dp, bp, wp, yp, d, nsb, kernel, parts};
  void (*rows)(const KJob&, int64_t, int64_t) = nullptr;
  switch (type) {
    case Q2_K: rows = &k_rows<Q2_K>; break;
    case Q3_K: rows = &k_rows<Q3_K>; break;
    case Q4_K: rows = &k_rows<Q4_K>; break;
    case Q5_K: rows = &k_rows<Q5_K>; break;
    default: rows = &k_rows<Q6_K>; break;
  }
  const int64_t per = rows_per_task(d.n, pool.num_threads(), 1);
  parallel_for(pool, (d.n + per - 1) / per, [&](int64_t task) {
    rows(job, task * per, std::min(d.n, (task + 1) * per));
  });
  return ffi::Error::Success();
}

}  // namespace
}  // namespace llamay

XLA_FFI_DEFINE_HANDLER_SYMBOL(LlamayQmmQ8, llamay::QmmQ8,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Arg<ffi::BufferR0<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int32_t>("ggml_type")
                                  .Attr<int32_t>("whole_block"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(LlamayQmmQ8K, llamay::QmmQ8K,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S16>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Arg<ffi::BufferR0<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int32_t>("ggml_type")
                                  .Attr<int32_t>("kernel"));
