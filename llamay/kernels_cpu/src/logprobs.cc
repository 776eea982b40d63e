// LlamayLogprobArgmax: what scoring needs of each row of logits, in one pass over the
// row with the row kept in L2 for a second (XLA CPU runs the reductions as separate,
// single-threaded loops, and argmax as a scalar variadic reduce: ~190 ms for Gemma 3's
// 256 x 262144 logits of one perplexity chunk, a quarter of the chunk):
//   logits x [N, V] f32 and picks t [N, J] int32 (J tokens a row: a multiple-choice
//   task's answers after one shared context) ->
//   lp [N, J] f32  x[t] - m - log Σ_i exp(x[i] - m), m the row's maximum; the sum in
//                  double, as llama.cpp's perplexity tool forms it (exp: ggml's v_expf)
//   first [N] i32  the first index of the row's maximum (jnp.argmax's tie rule)
// A pick outside [0, V) is clamped into it.
#include <cmath>
#include <cstdint>
#include <limits>

#include "ggml_float.h"
#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace llamay {
namespace {

using namespace gf;

constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

// (maximum, first index of it) of x[0, n).
inline void max_first(const float* x, int64_t n, float& m, int32_t& first) {
  int64_t i = 0;
  m = NEG_INF;
  first = 0;
#ifdef LLAMAY_GF_AVX512
  if (n >= 16) {
    // per lane: its maximum and where it first occurs (a strict > keeps the first)
    __m512 vm = _mm512_set1_ps(NEG_INF);
    __m512i vi = _mm512_setzero_si512();
    __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i step = _mm512_set1_epi32(16);
    for (; i + 16 <= n; i += 16) {
      const __m512 v = _mm512_loadu_ps(x + i);
      const __mmask16 gt = _mm512_cmp_ps_mask(v, vm, _CMP_GT_OQ);
      vm = _mm512_mask_mov_ps(vm, gt, v);
      vi = _mm512_mask_mov_epi32(vi, gt, idx);
      idx = _mm512_add_epi32(idx, step);
    }
    m = _mm512_reduce_max_ps(vm);
    // the first occurrence overall: the least index among the lanes holding the maximum
    const __mmask16 at = _mm512_cmp_ps_mask(vm, _mm512_set1_ps(m), _CMP_EQ_OQ);
    first = at ? _mm512_mask_reduce_min_epi32(at, vi) : 0;
  }
#endif
  for (; i < n; ++i) {
    if (x[i] > m) {
      m = x[i];
      first = (int32_t)i;
    }
  }
}

// Σ exp(x[i] - m) over x[0, n), in double.
inline double sum_exp(const float* x, int64_t n, float m) {
  int64_t i = 0;
  double s = 0.0;
#ifdef LLAMAY_GF_AVX512
  const __m512 vmax = _mm512_set1_ps(m);
  __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
  for (; i + 16 <= n; i += 16) {
    const __m512 e = v_expf16(_mm512_sub_ps(_mm512_loadu_ps(x + i), vmax));
    a0 = _mm512_add_pd(a0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
    a1 = _mm512_add_pd(a1, _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1)));
  }
  s = _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
#endif
  for (; i < n; ++i) s += (double)v_expf(x[i] - m);
  return s;
}

ffi::Error LogprobArgmax(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> logits,
                         ffi::Buffer<ffi::S32> picks, ffi::ResultBuffer<ffi::F32> lp,
                         ffi::ResultBuffer<ffi::S32> first) {
  auto dims = logits.dimensions();
  if (dims.size() == 0) return ffi::Error::InvalidArgument("LlamayLogprobArgmax: a scalar");
  const int64_t V = dims.back(), N = V ? logits.element_count() / V : 0;
  auto pdims = picks.dimensions();
  const int64_t J = pdims.size() ? pdims.back() : 0;
  if (J == 0 || (int64_t)picks.element_count() != N * J)
    return ffi::Error::InvalidArgument("LlamayLogprobArgmax: picks [rows of logits, J]");
  if (V == 0 || V > std::numeric_limits<int32_t>::max())
    return ffi::Error::InvalidArgument("LlamayLogprobArgmax: rows of 1 to 2^31 - 1 logits");
  const float* x = logits.typed_data();
  const int32_t* t = picks.typed_data();
  float* out = lp->typed_data();
  int32_t* arg = first->typed_data();
  parallel_for(pool, N, [&](int64_t r) {
    const float* row = x + r * V;
    float m;
    int32_t at;
    max_first(row, V, m, at);
    const double lse = (double)m + std::log(sum_exp(row, V, m));
    for (int64_t j = 0; j < J; ++j) {
      const int32_t pick = t[r * J + j];
      const int64_t k = pick < 0 ? 0 : pick >= V ? V - 1 : pick;
      out[r * J + j] = (float)((double)row[k] - lse);
    }
    arg[r] = at;
  });
  return ffi::Error::Success();
}

}  // namespace
}  // namespace llamay

XLA_FFI_DEFINE_HANDLER_SYMBOL(LlamayLogprobArgmax, llamay::LogprobArgmax,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>());
