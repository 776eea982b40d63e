// Quantised matmul y[M, N] = x[M, K] · W[N, K]ᵀ over GGUF block rows, as XLA FFI handlers.
//
// exact (LlamayQmmExact): f32 activations; a few weight rows at a time are dequantised
// into a small f32 buffer (bit-exact values, see blocks.h) and dotted with every row of
// x in register tiles (each weight row is read and dequantised once for all M rows).
//
// llamacpp (LlamayQmmQ8, LlamayQmmQ8K): the activations come already quantised (by the
// same jnp code the XLA path uses: llamay.quant.act_quant), and every f32 operation
// after the exact integer dots is ggml's, in ggml's order, with explicit fmaf and no
// other contraction (built with -ffp-contract=off): bit-identical to the XLA emulation
// in llamay.quant.qtensor (_q8_block_dot, _q4_0_repack_dot, kquant_dot_q8k).
//
// LLAMAY_SCALAR (a test build) leaves out every intrinsic and vector type: the integer
// sums are exact and the float operations are the same per lane either way.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "blocks.h"
#include "parallel.h"
#include "xla/ffi/api/ffi.h"

#if !defined(LLAMAY_SCALAR) && defined(__AVX2__)
#include <immintrin.h>
#define LLAMAY_AVX2 1
#endif

namespace ffi = xla::ffi;

namespace llamay {
namespace {

// -- exact: f32 register tiles --------------------------------------------------------

#if defined(LLAMAY_SCALAR)
constexpr int VW = 1;
#elif defined(__AVX512F__)
constexpr int VW = 16;
#elif defined(__AVX__)
constexpr int VW = 8;
#else
constexpr int VW = 4;
#endif
typedef float vf __attribute__((vector_size(VW * 4)));

inline vf loadv(const float* p) { vf v; std::memcpy(&v, p, sizeof v); return v; }

inline float hsum(vf v) {
  float s = 0.0f;
  for (int i = 0; i < VW; ++i) s += v[i];
  return s;
}

constexpr int MR = 4;  // rows of x per tile
constexpr int NR = 4;  // weight rows per tile (dequantised together)

template <int R, int C>
void tile(const float* x, int64_t K, const float* w, float* y, int64_t ldy) {
  vf acc[R][C] = {};
  int64_t k = 0;
  for (; k + VW <= K; k += VW) {
    vf wv[C];
    for (int j = 0; j < C; ++j) wv[j] = loadv(w + j * K + k);
    for (int i = 0; i < R; ++i) {
      const vf xv = loadv(x + i * K + k);
      for (int j = 0; j < C; ++j) acc[i][j] += xv * wv[j];
    }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < C; ++j) {
      float s = hsum(acc[i][j]);
      for (int64_t kk = k; kk < K; ++kk) s += x[i * K + kk] * w[j * K + kk];
      y[i * ldy + j] = s;
    }
}

using TileFn = void (*)(const float*, int64_t, const float*, float*, int64_t);
template <int R, int C>
constexpr TileFn tile_fn() { return &tile<R, C>; }
constexpr TileFn TILES[MR][NR] = {
    {tile_fn<1, 1>(), tile_fn<1, 2>(), tile_fn<1, 3>(), tile_fn<1, 4>()},
    {tile_fn<2, 1>(), tile_fn<2, 2>(), tile_fn<2, 3>(), tile_fn<2, 4>()},
    {tile_fn<3, 1>(), tile_fn<3, 2>(), tile_fn<3, 3>(), tile_fn<3, 4>()},
    {tile_fn<4, 1>(), tile_fn<4, 2>(), tile_fn<4, 3>(), tile_fn<4, 4>()},
};

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
Dims dims_of(const XBuf& x, const ffi::Buffer<ffi::U8>& w) {
  auto xd = x.dimensions();
  auto wd = w.dimensions();
  const int64_t k = xd.size() == 0 ? 1 : xd.back();
  return {k ? (int64_t)x.element_count() / k : 0, k, wd[wd.size() - 2], wd.back()};
}

ffi::Error QmmExact(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::U8> w,
                    ffi::ResultBuffer<ffi::F32> y, int32_t type) {
  const Dims d = dims_of(x, w);
  if (auto err = check(type, d); err.failure()) return err;
  const float* xp = x.typed_data();
  const uint8_t* wp = w.typed_data();
  float* yp = y->typed_data();
  const int64_t per = rows_per_task(d.n, pool.num_threads(), NR);
  parallel_for(pool, (d.n + per - 1) / per, [&](int64_t task) {
    thread_local std::vector<float> buf;
    buf.resize(NR * d.k);
    const int64_t n_end = std::min(d.n, (task + 1) * per);
    for (int64_t n = task * per; n < n_end; n += NR) {
      const int nr = (int)std::min<int64_t>(NR, n_end - n);
      for (int j = 0; j < nr; ++j) dequant_row(type, wp + (n + j) * d.row_bytes, buf.data() + j * d.k, d.k);
      for (int64_t m = 0; m < d.m; m += MR) {
        const int mr = (int)std::min<int64_t>(MR, d.m - m);
        TILES[mr - 1][nr - 1](xp + m * d.k, d.k, buf.data(), yp + m * d.n + n, d.n);
      }
    }
  });
  return ffi::Error::Success();
}

// -- llamacpp: integer lane sums -------------------------------------------------------

// ggml's AVX2 int32 lanes of one 32-byte chunk: lane l = Σ_{i<4} w[4l+i]·a[4l+i] (exact).
inline void lanes_i8(const int8_t* w, const int8_t* a, int32_t* out) {
#if defined(LLAMAY_AVX2)
  const __m256i vw = _mm256_loadu_si256((const __m256i*)w);
  const __m256i va = _mm256_loadu_si256((const __m256i*)a);
  // |w| (unsigned) times a with w's sign: exact while a > -128 (ggml's Q8 quants are).
  const __m256i ax = _mm256_sign_epi8(vw, vw), sy = _mm256_sign_epi8(va, vw);
#if defined(__AVXVNNI__)
  const __m256i s = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), ax, sy);
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
  const __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ax, sy);
#else
  const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1));
#endif
  _mm256_storeu_si256((__m256i*)out, s);
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

// One weight row of a 32-element type, unpacked for the dots: quants, d, m per block.
struct Q32Row {
  std::vector<int8_t> q;
  std::vector<float> d, m;
  void load(int32_t type, const uint8_t* row, int64_t nb) {
    q.resize(nb * 32);
    d.resize(nb);
    m.resize(nb);
    for (int64_t b = 0; b < nb; ++b) q32_parts(type, row + b * block_bytes(type), &q[b * 32], &d[b], &m[b]);
  }
};

// vec_dot_{q4_0,q5_0,q8_0}_q8_0 / {q4_1,q5_1}_q8_1 (lanes) or the Q4_0x8 repack
// GEMV/GEMM (whole_block): see qtensor._q8_block_dot / _q4_0_repack_dot.
float q8_dot(const Q32Row& w, int64_t nb, const int8_t* qa, const float* da, const float* sa,
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
    int32_t l[8];
    lanes_i8(&w.q[b * 32], qa + b * 32, l);
    const __m256 xy = _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i*)l));
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

ffi::Error QmmQ8(ffi::ThreadPool pool, ffi::Buffer<ffi::S8> qa, ffi::Buffer<ffi::F32> da,
                 ffi::Buffer<ffi::F32> sa, ffi::Buffer<ffi::U8> w, ffi::ResultBuffer<ffi::F32> y,
                 int32_t type, int32_t whole_block) {
  const Dims d = dims_of(qa, w);
  if (auto err = check(type, d); err.failure()) return err;
  if (block_elems(type) != 32) return ffi::Error::InvalidArgument("LlamayQmmQ8: needs a 32-element block type");
  const int64_t nb = d.k / 32;
  const bool has_m = type == Q4_1 || type == Q5_1;
  const int8_t* qp = qa.typed_data();
  const float *dp = da.typed_data(), *sp = sa.typed_data();
  const uint8_t* wp = w.typed_data();
  float* yp = y->typed_data();
  const int64_t per = rows_per_task(d.n, pool.num_threads(), 1);
  parallel_for(pool, (d.n + per - 1) / per, [&](int64_t task) {
    thread_local Q32Row row;
    const int64_t n_end = std::min(d.n, (task + 1) * per);
    for (int64_t n = task * per; n < n_end; ++n) {
      row.load(type, wp + n * d.row_bytes, nb);
      for (int64_t m = 0; m < d.m; ++m)
        yp[m * d.n + n] = q8_dot(row, nb, qp + m * d.k, dp + m * nb, sp + m * nb, has_m, whole_block);
    }
  });
  return ffi::Error::Success();
}

// -- llamacpp: K-quants x Q8_K ---------------------------------------------------------

enum KKernel : int32_t { K_VEC = 0, K_TILED = 1, K_REPACK = 2 };

// One weight row of a K-quant, unpacked: per super-block the products q·sc (int16, as
// ggml's dots multiply them), the first scale of each 16-element sub-block (Q6_K's
// correction), the mins and d, dmin.
struct KRow {
  std::vector<int16_t> prod, sc16, mins;
  std::vector<float> d, dmin;
  int n_mins = 0;
  void load(int32_t type, const uint8_t* row, int64_t nsb) {
    prod.resize(nsb * 256);
    sc16.resize(nsb * 16);
    mins.resize(nsb * 16);
    d.resize(nsb);
    dmin.resize(nsb);
    for (int64_t s = 0; s < nsb; ++s) {
      int8_t q[256];
      int16_t sc[256];
      n_mins = kquant_parts(type, row + s * block_bytes(type), q, sc, &mins[s * 16], &d[s], &dmin[s]);
      for (int e = 0; e < 256; ++e) prod[s * 256 + e] = (int16_t)(q[e] * sc[e]);
      for (int i = 0; i < 16; ++i) sc16[s * 16 + i] = sc[16 * i];
    }
  }
};

// The 8 int32 lanes of one super-block: lane j = Σ_c Σ_{i<4} a[32c+4j+i]·p[32c+4j+i].
inline void lanes_i16(const int16_t* p, const int8_t* a, int32_t* out) {
#if defined(LLAMAY_AVX2)
  __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
  for (int c = 0; c < 8; ++c) {
    const __m256i a0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(a + 32 * c)));
    const __m256i a1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(a + 32 * c + 16)));
    lo = _mm256_add_epi32(lo, _mm256_madd_epi16(a0, _mm256_loadu_si256((const __m256i*)(p + 32 * c))));
    hi = _mm256_add_epi32(hi, _mm256_madd_epi16(a1, _mm256_loadu_si256((const __m256i*)(p + 32 * c + 16))));
  }
  // lo holds the pair sums of elements 0..15 of each chunk, hi of 16..31; hadd pairs them
  // per 128-bit half: [lanes 0 1 4 5 | 2 3 6 7].
  const __m256i s = _mm256_hadd_epi32(lo, hi);
  alignas(32) int32_t t[8];
  _mm256_store_si256((__m256i*)t, s);
  out[0] = t[0]; out[1] = t[1]; out[4] = t[2]; out[5] = t[3];
  out[2] = t[4]; out[3] = t[5]; out[6] = t[6]; out[7] = t[7];
#else
  for (int j = 0; j < 8; ++j) {
    int32_t s = 0;
    for (int c = 0; c < 8; ++c)
      for (int i = 0; i < 4; ++i) s += (int32_t)a[32 * c + 4 * j + i] * p[32 * c + 4 * j + i];
    out[j] = s;
  }
#endif
}

// Σ of a[e]·p[e] over a contiguous run (exact).
inline int32_t dot_i16(const int16_t* p, const int8_t* a, int n) {
  int32_t s = 0;
  for (int e = 0; e < n; ++e) s += (int32_t)a[e] * p[e];
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

float kquant_dot(const KRow& w, int32_t type, int32_t kernel, int parts, int64_t nsb,
                 const int8_t* qa, const float* da, const int16_t* bsums) {
  int32_t m_sub[16];
  if (kernel == K_TILED) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nsb; ++b) {
      int32_t s1 = dot_i16(&w.prod[b * 256], qa + b * 256, 256);
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
      for (int p = 0; p < parts; ++p) {
        const int32_t total = dot_i16(&w.prod[b * 256 + p * elems], qa + b * 256 + p * elems, elems);
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
    int32_t lanes[8];
    lanes_i16(&w.prod[b * 256], qa + b * 256, lanes);
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

ffi::Error QmmQ8K(ffi::ThreadPool pool, ffi::Buffer<ffi::S8> qa, ffi::Buffer<ffi::F32> da,
                  ffi::Buffer<ffi::S16> bsums, ffi::Buffer<ffi::U8> w, ffi::ResultBuffer<ffi::F32> y,
                  int32_t type, int32_t kernel) {
  const Dims d = dims_of(qa, w);
  if (auto err = check(type, d); err.failure()) return err;
  if (block_elems(type) != 256) return ffi::Error::InvalidArgument("LlamayQmmQ8K: needs a K-quant weight");
  if (kernel == K_REPACK && type != Q4_K && type != Q2_K)
    return ffi::Error::InvalidArgument("LlamayQmmQ8K: the repack kernel is Q4_K/Q2_K only");
  const int64_t nsb = d.k / 256;
  const int parts = kernel == K_REPACK && d.m >= 4 ? (type == Q4_K ? 4 : 2) : 1;
  const int8_t* qp = qa.typed_data();
  const float* dp = da.typed_data();
  const int16_t* bp = bsums.typed_data();
  const uint8_t* wp = w.typed_data();
  float* yp = y->typed_data();
  const int64_t per = rows_per_task(d.n, pool.num_threads(), 1);
  parallel_for(pool, (d.n + per - 1) / per, [&](int64_t task) {
    thread_local KRow row;
    const int64_t n_end = std::min(d.n, (task + 1) * per);
    for (int64_t n = task * per; n < n_end; ++n) {
      row.load(type, wp + n * d.row_bytes, nsb);
      for (int64_t m = 0; m < d.m; ++m)
        yp[m * d.n + n] = kquant_dot(row, type, kernel, parts, nsb, qp + m * d.k, dp + m * nsb,
                                     bp + m * nsb * 16);
    }
  });
  return ffi::Error::Success();
}

}  // namespace
}  // namespace llamay

XLA_FFI_DEFINE_HANDLER_SYMBOL(LlamayQmmExact, llamay::QmmExact,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int32_t>("ggml_type"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(LlamayQmmQ8, llamay::QmmQ8,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
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
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int32_t>("ggml_type")
                                  .Attr<int32_t>("kernel"));
