// llama.cpp's CPU attention over an F16 (or BF16) KV cache, bit for bit as its XLA
// emulation computes it (numerics="llamacpp"): the reference and test oracle is
// `llamay.kernels.ggml_attention.attention` (read its module doc and
// `llamay.quant.ggml_float` first); this kernel performs the same f32 operations in the
// same order, on a dense cache or on the page pool read in place through the page table.
//
// Operands: q f32 [B, T, H, D]; K and V (f16 or bf16, each its own): a dense cache
// [B, S, K, D] (or the stacks [L, B, S, K, D] with `layer`) or pages [P, ps, K, D] / the pool [L, P, ps, K, D] with `layer` (s32
// scalar); the page table s32 [B, M] (dense: ignored) -- a row's slot j is row j % ps of
// page table[b, j / ps], S = M * ps, pages indexed as jnp indexes them (negative from the
// end, clamped); q_pos s32 [B, T]; the window (s32 scalar, <= 0: global). Attributes:
// kq_scale (llama.cpp's f32 scale), prescaled (q scaled before K.q), causal, paged.
// Result f32 [B, T, H, D].
//
// Per query token and kv head (GQA: its G query heads), as the emulation:
//   q (times kq_scale first when prescaled) rounded to f16;
//   K.q as ggml_vec_dot_f16 for one query token (4 accumulators of 16 lanes over steps
//   of 64, `_mm512_reduce_add_ps`, leftovers added in double as `ggml_float.dsum`) or as
//   tinyBLAS for >= 2 tokens (16 lanes chunk after chunk; D % 16 == 0), every product of
//   two f16 values exact; the score times kq_scale;
//   the softmax of ggml_soft_max_f32: max over the visible keys, ggml_v_expf (its FMAs
//   as `ggml_float.fma` builds them from error-free sums, so that the results are those
//   of the emulation even where that differs from a hardware FMA), per-16 sums reduced
//   as `_mm512_reduce_add_ps`, their sum as `dsum`'s pairwise tree of TwoSums, 1/sum as
//   `recip_pair` (with the two FMAs XLA contracts there), the probabilities rounded to f16;
//   P.V per output element over 16 lanes of keys, chunk after chunk (>= 2 tokens) or into
//   4 accumulators by chunk index (one token), then reduced.
// Keys a query cannot see contribute exact zeros to every sum in the emulation; they are
// skipped here (only the sign of an all-zero result can differ). Subnormals are flushed
// (FTZ/DAZ), as XLA's CPU runtime runs. Not here (the dispatcher keeps the emulation):
// softcaps (the emulation takes XLA's tanh), f32 caches, quantised caches.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

#include "blocks.h"
#include "ggml_float.h"
#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace llamay {
namespace {

constexpr int64_t L16 = 16;

using namespace gf;

struct Scratch {
  std::vector<float> q, kr, s, e, acc, sums, h, l, parts;
  std::vector<const uint16_t*> rows;  // the visible keys' V rows
};

// ggml_float.dot_f16_vec over exact products (a, b: f16 values as f32).
inline float dot_vec(const float* a, const float* b, int64_t D, Scratch& sc) {
  const int64_t main = D - D % 64;
  sc.parts.clear();
  if (main) {
    float s[4][L16];
    for (int64_t i = 0; i < main / L16; ++i) {
      const float* ca = a + i * L16;
      const float* cb = b + i * L16;
      float* sj = s[i % 4];
      if (i < 4)
        for (int l = 0; l < L16; ++l) sj[l] = ca[l] * cb[l];
      else
        for (int l = 0; l < L16; ++l) sj[l] = sj[l] + ca[l] * cb[l];
    }
    float t[L16];
    for (int l = 0; l < L16; ++l) t[l] = (s[0][l] + s[2][l]) + (s[1][l] + s[3][l]);
    const float red = reduce16(t);
    if (main == D) return red;
    sc.parts.push_back(red);
  }
  for (int64_t i = main; i < D; ++i) sc.parts.push_back(a[i] * b[i]);
  float hi, lo;
  dsum(sc.parts.data(), (int64_t)sc.parts.size(), sc.h, sc.l, hi, lo);
  return hi + lo;
}

// ggml_float.dot_f16_sgemm (D % 16 == 0).
inline float dot_sgemm(const float* a, const float* b, int64_t D) {
  float acc[L16];
  for (int l = 0; l < L16; ++l) acc[l] = a[l] * b[l];
  for (int64_t c = L16; c < D; c += L16)
    for (int l = 0; l < L16; ++l) acc[l] = acc[l] + a[c + l] * b[c + l];
  return reduce16(acc);
}

struct Problem {
  int64_t B, T, H, D, K, G, S;
  bool paged, causal, prescaled;
  int64_t P, ps, M;
  const int32_t* table;
  const uint16_t *k, *v;
  bool kbf16, vbf16;
  const float* q;
  const int32_t* qpos;
  float* out;
  int32_t window;
  float kq_scale;
};

// Row j of row b's cache, kv head kh.
inline const uint16_t* row_of(const Problem& p, const uint16_t* base, int64_t b, int64_t j,
                              int64_t kh) {
  if (!p.paged) return base + ((b * p.S + j) * p.K + kh) * p.D;
  int64_t pg = p.table[b * p.M + j / p.ps];
  if (pg < 0) pg += p.P;
  pg = std::min<int64_t>(std::max<int64_t>(pg, 0), p.P - 1);
  return base + ((pg * p.ps + j % p.ps) * p.K + kh) * p.D;
}

void task(const Problem& p, int64_t b, int64_t t, int64_t kh, Scratch& sc) {
  ScopedFtz ftz;
  const int64_t D = p.D, G = p.G, S = p.S;
  const bool batched = p.T > 1;
  const bool sgemm = batched && D % L16 == 0;
  // visible keys: [j0, j1] (as ggml_attention._visible)
  const int64_t i = p.qpos[b * p.T + t];
  int64_t j1;
  if (p.causal) {
    j1 = i;
  } else {
    j1 = -1;
    for (int64_t u = 0; u < p.T; ++u) {
      const int64_t qp = p.qpos[b * p.T + u];
      j1 = std::max(j1, qp < S ? qp : -1);
    }
  }
  j1 = std::min(j1, S - 1);
  int64_t j0 = p.window > 0 ? std::max<int64_t>(0, i - p.window + 1) : 0;
  float* out = p.out + ((b * p.T + t) * p.H + kh * G) * D;
  const int64_t n = j1 - j0 + 1;
  if (n <= 0) {  // no visible key: p = 0 everywhere, a zero output
    std::fill(out, out + G * D, 0.0f);
    return;
  }
  // q rounded to f16 (scaled first if prescaled)
  sc.q.resize(G * D);
  const float* qsrc = p.q + ((b * p.T + t) * p.H + kh * G) * D;
  for (int64_t r = 0; r < G * D; ++r) {
    const float x = p.prescaled ? qsrc[r] * p.kq_scale : qsrc[r];
    sc.q[r] = round_f16(x);
  }
  const float kq_scale = p.prescaled ? 1.0f : p.kq_scale;
  // scores wp[g][j - j0]
  sc.s.resize(G * n);
  sc.kr.resize(D);
  for (int64_t j = j0; j <= j1; ++j) {
    const uint16_t* kr = row_of(p, p.k, b, j, kh);
    load_row(kr, D, p.kbf16, sc.kr.data());
    for (int64_t g = 0; g < G; ++g) {
      const float* qg = sc.q.data() + g * D;
      const float dot = sgemm ? dot_sgemm(qg, sc.kr.data(), D) : dot_vec(qg, sc.kr.data(), D, sc);
      sc.s[g * n + (j - j0)] = dot * kq_scale;
    }
  }
  // softmax per head: e over the absolute 16-chunks c0..c1, probabilities rounded to f16
  const int64_t c0 = j0 / L16, c1 = j1 / L16, nc = c1 - c0 + 1, nchunks = S / L16;
  sc.e.assign(G * nc * L16, 0.0f);  // e[g][(j - c0*16)]
  sc.sums.assign(nchunks, 0.0f);
  for (int64_t g = 0; g < G; ++g) {
    const float* wp = sc.s.data() + g * n;
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t r = 0; r < n; ++r) mx = std::max(mx, wp[r]);
    if (!std::isfinite(mx)) mx = 0.0f;
    float* e = sc.e.data() + g * nc * L16;
    float* ev = e + (j0 - c0 * L16);
    v_expf_n(wp, mx, ev, n);
    std::fill(sc.sums.begin(), sc.sums.end(), 0.0f);
    for (int64_t c = c0; c <= c1; ++c) sc.sums[c] = reduce16(e + (c - c0) * L16);
    float hi, lo;
    dsum(sc.sums.data(), nchunks, sc.h, sc.l, hi, lo);
    const float inv = hi > 0.0f ? recip_pair(hi, lo) : 0.0f;
    round_f16_scaled(e, nc * L16, inv);
  }
  // P.V: acc[g][a][lane][d], a = chunk % 4 for one token, a = 0 for a batch. Each sum
  // is kept in registers over its lane's keys (in order: the same operations as one key
  // after another through the whole array, which was load- and store-bound), 16 outputs
  // at a time.
  const int64_t na = batched ? 1 : 4;
  sc.acc.resize(G * na * L16 * D);
  sc.rows.resize(n);
  for (int64_t j = j0; j <= j1; ++j) sc.rows[j - j0] = row_of(p, p.v, b, j, kh);
  for (int64_t g = 0; g < G; ++g) {
    const float* eg = sc.e.data() + g * nc * L16 - c0 * L16;  // eg[j]: key j's probability
    for (int64_t lane = 0; lane < L16; ++lane) {
      const int64_t first = j0 + ((lane - j0 % L16) % L16 + L16) % L16;  // its first key
      int64_t d0 = 0;
#if defined(__AVX512F__) && !defined(LLAMAY_SCALAR)
      if (!p.vbf16 && na == 1)  // four registers of outputs at once: four sums in flight
        for (; d0 + 4 * L16 <= D; d0 += 4 * L16) {
          __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
          for (int64_t j = first; j <= j1; j += L16) {
            const __m512 w = _mm512_set1_ps(eg[j]);
            const uint16_t* vr = sc.rows[j - j0] + d0;
            for (int u = 0; u < 4; ++u)
              acc[u] = _mm512_add_ps(acc[u], _mm512_mul_ps(w, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(vr + u * L16)))));
          }
          for (int u = 0; u < 4; ++u) _mm512_storeu_ps(sc.acc.data() + (g * L16 + lane) * D + d0 + u * L16, acc[u]);
        }
      if (!p.vbf16)  // f16 values, 16 outputs a register (mul, then add: no contraction)
        for (; d0 + L16 <= D; d0 += L16) {
          const auto term = [&](int64_t j) {
            const __m512 v = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(sc.rows[j - j0] + d0)));
            return _mm512_mul_ps(_mm512_set1_ps(eg[j]), v);
          };
          float* out = sc.acc.data() + (g * na * L16 + lane) * D + d0;
          if (na == 1) {
            __m512 acc = _mm512_setzero_ps();
            for (int64_t j = first; j <= j1; j += L16) acc = _mm512_add_ps(acc, term(j));
            _mm512_storeu_ps(out, acc);
          } else {  // chunk c into accumulator c % 4
            __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
            int64_t j = first;
            for (; j <= j1 && j / L16 % 4; j += L16) acc[j / L16 % 4] = _mm512_add_ps(acc[j / L16 % 4], term(j));
            for (; j + 3 * L16 <= j1; j += 4 * L16)
              for (int a = 0; a < 4; ++a) acc[a] = _mm512_add_ps(acc[a], term(j + a * L16));
            for (; j <= j1; j += L16) acc[j / L16 % 4] = _mm512_add_ps(acc[j / L16 % 4], term(j));
            for (int64_t a = 0; a < 4; ++a) _mm512_storeu_ps(out + a * L16 * D, acc[a]);
          }
        }
#endif
      for (; d0 < D; d0 += L16) {
        const int64_t w16 = std::min<int64_t>(L16, D - d0);
        float acc[4][L16] = {};
        float v[L16];
        for (int64_t j = first; j <= j1; j += L16) {
          load_row(sc.rows[j - j0] + d0, w16, p.vbf16, v);
          const float w = eg[j];
          float* a = acc[na == 4 ? j / L16 % 4 : 0];
          for (int64_t d = 0; d < w16; ++d) a[d] = a[d] + w * v[d];
        }
        for (int64_t a = 0; a < na; ++a)
          std::copy(acc[a], acc[a] + w16, sc.acc.data() + ((g * na + a) * L16 + lane) * D + d0);
      }
    }
  }
  // the lanes' sums, vectorised over d: (a0 + a2) + (a1 + a3) for one token, then
  // reduce16 across the lanes (halves, quarters, pairs)
  for (int64_t g = 0; g < G; ++g) {
    float* acc = sc.acc.data() + g * na * L16 * D;  // [na][16][D]
    if (na == 4)
      for (int64_t l = 0; l < L16; ++l) {
        float* a0 = acc + l * D;
        const float *a1 = acc + (L16 + l) * D, *a2 = acc + (2 * L16 + l) * D,
                    *a3 = acc + (3 * L16 + l) * D;
        for (int64_t d = 0; d < D; ++d) a0[d] = (a0[d] + a2[d]) + (a1[d] + a3[d]);
      }
    for (int64_t l = 0; l < 8; ++l)
      for (int64_t d = 0; d < D; ++d) acc[l * D + d] = acc[(8 + l) * D + d] + acc[l * D + d];
    for (int64_t l = 0; l < 4; ++l)
      for (int64_t d = 0; d < D; ++d) acc[l * D + d] = acc[(4 + l) * D + d] + acc[l * D + d];
    float* o = out + g * D;
    for (int64_t d = 0; d < D; ++d)
      o[d] = (acc[d] + acc[2 * D + d]) + (acc[D + d] + acc[3 * D + d]);
  }
}

ffi::Error GgmlAttention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::AnyBuffer k,
                         ffi::AnyBuffer v, ffi::BufferR0<ffi::S32> layer,
                         ffi::Buffer<ffi::S32> table, ffi::Buffer<ffi::S32> qpos,
                         ffi::BufferR0<ffi::S32> window, ffi::ResultBuffer<ffi::F32> out,
                         float kq_scale, int32_t prescaled, int32_t causal, int32_t paged) {
  auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions(), td = table.dimensions();
  const int64_t r = kd.size();
  if (qd.size() != 4 || td.size() != 2 || vd.size() != kd.size() || (r != 4 && r != 5))
    return ffi::Error::InvalidArgument(
        "LlamayGgmlAttention: q must be [B, T, H, D]; K, V a cache [B, S, K, D] or pages "
        "[P, ps, K, D] / [L, P, ps, K, D]; the page table [B, M]");
  for (int64_t a = 0; a < r; ++a)
    if (vd[a] != kd[a]) return ffi::Error::InvalidArgument("LlamayGgmlAttention: K and V differ");
  auto half = [](ffi::DataType t, bool* bf) {
    *bf = t == ffi::DataType::BF16;
    return t == ffi::DataType::F16 || t == ffi::DataType::BF16;
  };
  Problem p;
  if (!half(k.element_type(), &p.kbf16) || !half(v.element_type(), &p.vbf16))
    return ffi::Error::InvalidArgument("LlamayGgmlAttention: K and V must be f16 or bf16");
  p.B = qd[0], p.T = qd[1], p.H = qd[2], p.D = qd[3];
  p.K = kd[r - 2];
  p.paged = paged != 0;
  p.causal = causal != 0;
  p.prescaled = prescaled != 0;
  int64_t lidx = 0;
  if (r == 5) {  // a stack of layers: the one at `layer` (as jnp indexes: wrapped, clamped)
    lidx = *layer.typed_data();
    if (lidx < 0) lidx += kd[0];
    lidx = std::min<int64_t>(std::max<int64_t>(lidx, 0), kd[0] - 1);
  }
  if (p.paged) {
    p.P = kd[r - 4], p.ps = kd[r - 3], p.M = td[1];
    p.S = p.M * p.ps;
    if (td[0] != p.B) return ffi::Error::InvalidArgument("LlamayGgmlAttention: page table rows");
  } else {
    p.P = p.ps = p.M = 0;
    p.S = kd[r - 3];
    if (kd[r - 4] != p.B) return ffi::Error::InvalidArgument("LlamayGgmlAttention: cache rows");
  }
  if (kd[r - 1] != p.D || p.K == 0 || p.H % p.K || p.S % L16 ||
      qpos.element_count() != (size_t)(p.B * p.T))
    return ffi::Error::InvalidArgument("LlamayGgmlAttention: shapes do not fit");
  if (p.paged && p.P == 0 && p.B * p.T > 0)
    return ffi::Error::InvalidArgument("LlamayGgmlAttention: no pages");
  p.G = p.H / p.K;
  const int64_t layer_elems = kd[r - 4] * kd[r - 3] * p.K * p.D;
  p.k = static_cast<const uint16_t*>(k.untyped_data()) + lidx * layer_elems;
  p.v = static_cast<const uint16_t*>(v.untyped_data()) + lidx * layer_elems;
  p.table = table.typed_data();
  p.q = q.typed_data();
  p.qpos = qpos.typed_data();
  p.out = out->typed_data();
  p.window = *window.typed_data();
  p.kq_scale = kq_scale;
  const int64_t n = p.B * p.T * p.K;
  if (n == 0 || p.D == 0) return ffi::Error::Success();
  parallel_for(pool, n, [&](int64_t idx) {
    thread_local Scratch sc;
    task(p, idx / (p.T * p.K), idx / p.K % p.T, idx % p.K, sc);
  });
  return ffi::Error::Success();
}

}  // namespace
}  // namespace llamay

XLA_FFI_DEFINE_HANDLER_SYMBOL(LlamayGgmlAttention, llamay::GgmlAttention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::BufferR0<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::BufferR0<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("kq_scale")
                                  .Attr<int32_t>("prescaled")
                                  .Attr<int32_t>("causal")
                                  .Attr<int32_t>("paged"));
