// Two of the llama.cpp-numerics layers (`llamay.arch.ggml_ops`) natively, bit for bit as
// their XLA emulation (the reference and test oracle) computes them -- XLA runs those as
// chains of small fusions (v_expf from error-free sums, a pairwise tree of TwoSums):
//   LlamayGgmlSwiglu  y = g / (1 + v_expf(0 - g)) * u          (ggml_vec_swiglu_f32)
//   LlamayGgmlRmsNorm y = x * (1 / sqrt(mean + eps)) [* w], mean = (Σx² in double) / n as
//                     `ggml_float.dsum` and `div_pair` form it (ggml_compute_forward_rms_norm_f32)
//   LlamayGgmlRope    x [B, T, H, D] rotated by cos/sin [B, T, n_rot/2] as rotate_pairs
//                     with GCC's contraction: d0 = fma(x0, c, -(x1 s)), d1 = fma(x0, s, x1 c)
//                     (ggml_float.fma's bits), pairs adjacent ("norm") or halves ("neox")
// Operands f32, rows over the last axis; w [n] (rms_norm, `has_w`). Result f32.
#include <cmath>
#include <cstdint>
#include <vector>

#include "ggml_float.h"
#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace llamay {
namespace {

using namespace gf;

ffi::Error Swiglu(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> g, ffi::Buffer<ffi::F32> u,
                  ffi::ResultBuffer<ffi::F32> out) {
  const int64_t n = g.element_count();
  if ((int64_t)u.element_count() != n)
    return ffi::Error::InvalidArgument("LlamayGgmlSwiglu: g and u differ");
  const float* gp = g.typed_data();
  const float* up = u.typed_data();
  float* op = out->typed_data();
  constexpr int64_t CHUNK = 4096;
  parallel_for(pool, (n + CHUNK - 1) / CHUNK, [&](int64_t c) {
    ScopedFtz ftz;
    const int64_t i0 = c * CHUNK, i1 = std::min(n, (c + 1) * CHUNK);
    int64_t i = i0;
#ifdef LLAMAY_GF_AVX2
    const __m256 one = _mm256_set1_ps(1.0f);
    for (; i + 8 <= i1; i += 8) {
      const __m256 x = _mm256_loadu_ps(gp + i);
      const __m256 e = v_expf8(_mm256_sub_ps(_mm256_setzero_ps(), x));
      _mm256_storeu_ps(
          op + i, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
    }
#endif
    for (; i < i1; ++i) {
      const float x = gp[i];
      op[i] = x / (1.0f + v_expf(0.0f - x)) * up[i];
    }
  });
  return ffi::Error::Success();
}

// ggml_float.narrow_product (exact for q of 24 bits times an integer of at most 20).
inline void narrow_product(float a, float b, float& x, float& r) {
  float ah, al, bh, bl, s, e1, e2;
  split(a, ah, al);
  split(b, bh, bl);
  two_sum(ah * bl, al * bh, s, e1);
  two_sum(ah * bh, s, x, e2);
  r = e2 + (e1 + al * bl);
}

// ggml_float.div_pair: RN((hi + lo) / d).
inline float div_pair(float hi, float lo, float d) {
  const float q = hi / d;
  float p, r;
  narrow_product(q, d, p, r);
  const float rho = (hi - p) - r;
  return q + (rho + lo) / d;
}

ffi::Error RmsNorm(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                   ffi::ResultBuffer<ffi::F32> out, float eps, int32_t has_w) {
  auto xd = x.dimensions();
  if (xd.size() == 0) return ffi::Error::InvalidArgument("LlamayGgmlRmsNorm: x is a scalar");
  const int64_t n = xd.back(), rows = n ? x.element_count() / n : 0;
  if (has_w && (int64_t)w.element_count() != n)
    return ffi::Error::InvalidArgument("LlamayGgmlRmsNorm: w must have the row's length");
  const float* xp = x.typed_data();
  const float* wp = w.typed_data();
  float* op = out->typed_data();
  parallel_for(pool, rows, [&](int64_t r) {
    ScopedFtz ftz;
    thread_local std::vector<float> sq, h, l;
    const float* xr = xp + r * n;
    float* o = op + r * n;
    sq.resize(n);
    for (int64_t i = 0; i < n; ++i) sq[i] = xr[i] * xr[i];
    float hi, lo;
    dsum(sq.data(), n, h, l, hi, lo);
    const float mean = div_pair(hi, lo, (float)n);
    const float scale = 1.0f / std::sqrt(mean + eps);
    for (int64_t i = 0; i < n; ++i) o[i] = xr[i] * scale;
    if (has_w)
      for (int64_t i = 0; i < n; ++i) o[i] = o[i] * wp[i];
  });
  return ffi::Error::Success();
}

ffi::Error Rope(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> cos,
                ffi::Buffer<ffi::F32> sin, ffi::ResultBuffer<ffi::F32> out, int32_t neox) {
  auto xd = x.dimensions(), cd = cos.dimensions(), sd = sin.dimensions();
  if (xd.size() != 4 || cd.size() != 3 || sd.size() != 3)
    return ffi::Error::InvalidArgument("LlamayGgmlRope: x must be [B, T, H, D], cos/sin [B, T, n]");
  const int64_t B = xd[0], T = xd[1], H = xd[2], D = xd[3], half = cd[2];
  if (cd[0] != B || cd[1] != T || sd[0] != B || sd[1] != T || sd[2] != half || 2 * half > D)
    return ffi::Error::InvalidArgument("LlamayGgmlRope: shapes do not fit");
  const float* xp = x.typed_data();
  const float* cp = cos.typed_data();
  const float* sp = sin.typed_data();
  float* op = out->typed_data();
  parallel_for(pool, B * T, [&](int64_t bt) {
    ScopedFtz ftz;
    const float* c = cp + bt * half;
    const float* s = sp + bt * half;
    for (int64_t h = 0; h < H; ++h) {
      const float* xr = xp + (bt * H + h) * D;
      float* o = op + (bt * H + h) * D;
      for (int64_t i = 0; i < half; ++i) {
        const int64_t i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
        const float x0 = xr[i0], x1 = xr[i1];
        o[i0] = efma(x0, c[i], -(x1 * s[i]));
        o[i1] = efma(x0, s[i], x1 * c[i]);
      }
      for (int64_t d = 2 * half; d < D; ++d) o[d] = xr[d];
    }
  });
  return ffi::Error::Success();
}

}  // namespace
}  // namespace llamay

XLA_FFI_DEFINE_HANDLER_SYMBOL(LlamayGgmlRope, llamay::Rope,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int32_t>("neox"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(LlamayGgmlSwiglu, llamay::Swiglu,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(LlamayGgmlRmsNorm, llamay::RmsNorm,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("eps")
                                  .Attr<int32_t>("has_w"));
