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
// LlamayArgmax: x [N, V] f32 -> [N] i32, the first index of each row's maximum, 0 for a
// row holding a NaN (the sampler's greedy pick, `llamay.kernels.argmax`: XLA CPU
// takes ~0.3 ms over one row of Gemma 3's 262144 logits, this ~0.03).
// LlamayTopK: x [N, V] f32 -> (values [N, K] f32, ids [N, K] i32), each row's K best as
// lax.top_k gives them on CPU (XLA's runtime TopK: a partial sort of all V indices under
// the total order -NaN < -inf < -0 < +0 < +inf < +NaN, ties to the lower index; ~0.5 ms
// for K = 512 of 262144): one pass keeping the candidates above the K-th best so far.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "ggml_float.h"
#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace llamay {
namespace {

using namespace gf;

constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

// (maximum, first index of it) of x[0, n), passing over NaNs (one never compares
// greater); returns whether there was one.
inline bool max_first(const float* x, int64_t n, float& m, int32_t& first) {
  int64_t i = 0;
  m = NEG_INF;
  first = 0;
  bool nan = false;
#ifdef LLAMAY_GF_AVX512
  if (n >= 16) {
    // per lane: its maximum and where it first occurs (a strict > keeps the first)
    __m512 vm = _mm512_set1_ps(NEG_INF);
    __m512i vi = _mm512_setzero_si512();
    __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i step = _mm512_set1_epi32(16);
    __mmask16 unord = 0;
    for (; i + 16 <= n; i += 16) {
      const __m512 v = _mm512_loadu_ps(x + i);
      unord |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
      const __mmask16 gt = _mm512_cmp_ps_mask(v, vm, _CMP_GT_OQ);
      vm = _mm512_mask_mov_ps(vm, gt, v);
      vi = _mm512_mask_mov_epi32(vi, gt, idx);
      idx = _mm512_add_epi32(idx, step);
    }
    m = _mm512_reduce_max_ps(vm);
    // the first occurrence overall: the least index among the lanes holding the maximum
    const __mmask16 at = _mm512_cmp_ps_mask(vm, _mm512_set1_ps(m), _CMP_EQ_OQ);
    first = at ? _mm512_mask_reduce_min_epi32(at, vi) : 0;
    nan = unord != 0;
  }
#elif defined(LLAMAY_GF_AVX2)
  if (n >= 8) {
    __m256 vm = _mm256_set1_ps(NEG_INF);
    __m256i vi = _mm256_setzero_si256();
    __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i step = _mm256_set1_epi32(8);
    __m256 unord = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
      const __m256 v = _mm256_loadu_ps(x + i);
      unord = _mm256_or_ps(unord, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
      const __m256 gt = _mm256_cmp_ps(v, vm, _CMP_GT_OQ);
      vm = _mm256_blendv_ps(vm, v, gt);
      vi = _mm256_blendv_epi8(vi, idx, _mm256_castps_si256(gt));
      idx = _mm256_add_epi32(idx, step);
    }
    alignas(32) float lm[8];
    alignas(32) int32_t li[8];
    _mm256_store_ps(lm, vm);
    _mm256_store_si256((__m256i*)li, vi);
    for (int l = 0; l < 8; ++l) m = lm[l] > m ? lm[l] : m;
    first = 0;
    bool found = false;
    for (int l = 0; l < 8; ++l)
      if (lm[l] == m && (!found || li[l] < first)) first = li[l], found = true;
    nan = _mm256_movemask_ps(unord) != 0;
  }
#endif
  for (; i < n; ++i) {
    if (x[i] > m) {
      m = x[i];
      first = (int32_t)i;
    }
    nan |= std::isnan(x[i]);
  }
  return nan;
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
#elif defined(LLAMAY_GF_AVX2)
  const __m256 vmax = _mm256_set1_ps(m);
  __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
  for (; i + 8 <= n; i += 8) {
    const __m256 e = v_expf8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmax));
    a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  }
  alignas(32) double h[4];
  _mm256_store_pd(h, _mm256_add_pd(a0, a1));
  s = (h[0] + h[2]) + (h[1] + h[3]);
#endif
  for (; i < n; ++i) s += (double)v_expf(x[i] - m);
  return s;
}

// Per row of x [N, V]: its maximum, the first index of it, whether it holds a NaN and,
// with `lse`, m + log Σ exp(x - m). With fewer rows than threads (a decode step's few
// rows of a 262k vocabulary) each row is split into chunks over the threads: the chunks'
// maxima first, then their sums of exp(x - m) against the row's m (the same terms as one
// pass over the row, summed in another order).
struct RowStats {
  std::vector<float> m;
  std::vector<int32_t> first;
  std::vector<char> nan;
  std::vector<double> lse;
};

constexpr int64_t CHUNK = 16384;

RowStats row_stats(ffi::ThreadPool& pool, const float* x, int64_t N, int64_t V, bool lse) {
  RowStats st{std::vector<float>(N), std::vector<int32_t>(N), std::vector<char>(N),
              std::vector<double>(lse ? N : 0)};
  const int64_t C = N >= pool.num_threads() || V < 2 * CHUNK ? 1 : (V + CHUNK - 1) / CHUNK;
  const int64_t L = (V + C - 1) / C;  // a chunk's length (the last may be shorter)
  std::vector<float> cm(N * C);
  std::vector<int32_t> cf(N * C);
  std::vector<char> cn(N * C);
  parallel_for(pool, N * C, [&](int64_t i) {
    const int64_t r = i / C, c = i % C, at = c * L;
    cn[i] = max_first(x + r * V + at, std::min(L, V - at), cm[i], cf[i]);
    cf[i] += (int32_t)at;
  });
  for (int64_t r = 0; r < N; ++r) {
    int64_t best = r * C;  // the first chunk holding the row's maximum
    bool nan = false;
    for (int64_t i = r * C; i < (r + 1) * C; ++i) {
      if (cm[i] > cm[best]) best = i;
      nan |= cn[i] != 0;
    }
    st.m[r] = cm[best], st.first[r] = cf[best], st.nan[r] = nan;
  }
  if (!lse) return st;
  std::vector<double> cs(N * C);
  parallel_for(pool, N * C, [&](int64_t i) {
    const int64_t r = i / C, at = (i % C) * L;
    cs[i] = sum_exp(x + r * V + at, std::min(L, V - at), st.m[r]);
  });
  for (int64_t r = 0; r < N; ++r) {
    double s = 0.0;
    for (int64_t i = r * C; i < (r + 1) * C; ++i) s += cs[i];
    st.lse[r] = (double)st.m[r] + std::log(s);
  }
  return st;
}

ffi::Error Argmax(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> logits,
                  ffi::ResultBuffer<ffi::S32> first) {
  auto dims = logits.dimensions();
  if (dims.size() == 0) return ffi::Error::InvalidArgument("LlamayArgmax: a scalar");
  const int64_t V = dims.back(), N = V ? logits.element_count() / V : 0;
  if (V == 0 || V > std::numeric_limits<int32_t>::max())
    return ffi::Error::InvalidArgument("LlamayArgmax: rows of 1 to 2^31 - 1 logits");
  const RowStats st = row_stats(pool, logits.typed_data(), N, V, false);
  int32_t* arg = first->typed_data();
  // jnp.max returns a NaN the row holds, and the sampler's argmax then gives 0
  for (int64_t r = 0; r < N; ++r) arg[r] = st.nan[r] ? 0 : st.first[r];
  return ffi::Error::Success();
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
  const RowStats st = row_stats(pool, x, N, V, true);
  for (int64_t r = 0; r < N; ++r) {
    for (int64_t j = 0; j < J; ++j) {
      const int32_t pick = t[r * J + j];
      const int64_t k = pick < 0 ? 0 : pick >= V ? V - 1 : pick;
      out[r * J + j] = (float)((double)x[r * V + k] - st.lse[r]);
    }
    arg[r] = st.first[r];
  }
  return ffi::Error::Success();
}

// The total order of XLA's TopK as int32 keys: a float's bits, the negatives' reversed.
inline int32_t order_key(uint32_t b) { return (int32_t)(b ^ ((uint32_t)((int32_t)b >> 31) & 0x7FFFFFFFu)); }
inline int32_t key_at(const float* x, int64_t i) {
  uint32_t b;
  std::memcpy(&b, x + i, 4);
  return order_key(b);
}

struct Cand {
  int32_t key, id;
};
inline bool before(const Cand& a, const Cand& b) { return a.key != b.key ? a.key > b.key : a.id < b.id; }

// The K best of x[0, n) (n >= K) by `before`, unsorted, their ids offset by `base`,
// appended to `out`. Keeps every candidate above t, the K-th best key seen so far: a
// later one equal to it loses the tie to the K already kept.
void best_k(const float* x, int64_t n, int64_t K, int32_t base, std::vector<Cand>& out) {
  std::vector<Cand> buf;
  const int64_t cap = 4 * K;
  buf.reserve(cap + 8);
  for (int64_t i = 0; i < K; ++i) buf.push_back({key_at(x, i), (int32_t)i});
  const auto compact = [&]() {
    std::nth_element(buf.begin(), buf.begin() + (K - 1), buf.end(), before);
    buf.resize(K);
    int32_t t = buf[0].key;
    for (const Cand& c : buf) t = c.key < t ? c.key : t;
    return t;
  };
  int32_t t = compact();
  int64_t i = K;
  const auto take = [&](int64_t j) {
    const int32_t k = key_at(x, j);
    if (k > t) {
      buf.push_back({k, (int32_t)j});
      if ((int64_t)buf.size() >= cap) t = compact();
    }
  };
#ifdef LLAMAY_GF_AVX2
  const __m256i low31 = _mm256_set1_epi32(0x7FFFFFFF);
  for (; i + 8 <= n; i += 8) {
    const __m256i b = _mm256_castps_si256(_mm256_loadu_ps(x + i));
    const __m256i k = _mm256_xor_si256(b, _mm256_and_si256(_mm256_srai_epi32(b, 31), low31));
    int hit = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(k, _mm256_set1_epi32(t))));
    while (hit) {
      take(i + __builtin_ctz(hit));
      hit &= hit - 1;
    }
  }
#endif
  for (; i < n; ++i) take(i);
  if ((int64_t)buf.size() > K) compact();
  for (Cand& c : buf) c.id += base;
  out.insert(out.end(), buf.begin(), buf.end());
}

ffi::Error TopK(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> logits,
                ffi::ResultBuffer<ffi::F32> values, ffi::ResultBuffer<ffi::S32> ids) {
  auto dims = logits.dimensions();
  auto kdims = values->dimensions();
  if (dims.size() == 0 || kdims.size() != dims.size())
    return ffi::Error::InvalidArgument("LlamayTopK: logits [..., V], values [..., K]");
  const int64_t V = dims.back(), K = kdims.back(), N = V ? logits.element_count() / V : 0;
  if (V == 0 || V > std::numeric_limits<int32_t>::max() || K < 1 || K > V)
    return ffi::Error::InvalidArgument("LlamayTopK: 1 <= K <= V < 2^31");
  const float* x = logits.typed_data();
  // fewer rows than threads: each row in as many chunks as it has threads, their bests
  // merged (no more: each chunk starts its threshold afresh, a 16384-logit chunk costs
  // a third of a 262144-logit row)
  const int64_t T = pool.num_threads();
  const int64_t C = N >= T || V < 2 * CHUNK || K > CHUNK / 4
                        ? 1
                        : std::min((T + N - 1) / N, (V + CHUNK - 1) / CHUNK);
  const int64_t L = (V + C - 1) / C;
  std::vector<std::vector<Cand>> parts(N * C);
  parallel_for(pool, N * C, [&](int64_t i) {
    const int64_t r = i / C, at = (i % C) * L, n = std::min(L, V - at);
    std::vector<Cand>& part = parts[i];
    if (n <= K) {  // a whole (short) chunk is its own best
      for (int64_t j = 0; j < n; ++j) part.push_back({key_at(x + r * V + at, j), (int32_t)(at + j)});
    } else {
      best_k(x + r * V + at, n, K, (int32_t)at, part);
    }
  });
  float* vo = values->typed_data();
  int32_t* io = ids->typed_data();
  parallel_for(pool, N, [&](int64_t r) {
    std::vector<Cand> all;
    for (int64_t c = 0; c < C; ++c) all.insert(all.end(), parts[r * C + c].begin(), parts[r * C + c].end());
    std::partial_sort(all.begin(), all.begin() + K, all.end(), before);
    for (int64_t j = 0; j < K; ++j) {
      io[r * K + j] = all[j].id;
      vo[r * K + j] = x[r * V + all[j].id];
    }
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

XLA_FFI_DEFINE_HANDLER_SYMBOL(LlamayArgmax, llamay::Argmax,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(LlamayTopK, llamay::TopK,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>());
