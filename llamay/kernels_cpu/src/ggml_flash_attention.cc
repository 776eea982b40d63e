// llama.cpp's CPU flash attention over an F16 KV cache (-fa on), as its XLA emulation
// `llamay.kernels.ggml_attention.flash_attention` computes it (read the comment above that
// function first): the same f32 operations in the same order, the cache read in place
// (a dense cache or the page pool through the page table: `ggml_cache.h`).
//
// The path is the emulation's, from the step's real token count `rows` (llama.cpp's
// batch): >= 64 tokens the tiled path, else one pass per query row (one_chunk), split into
// chunks of ceil(n_kv / threads) cells merged as ggml_flash_attn_ext_reduce_partials does
// when the step is one token over n_kv >= 512 cells. Both read each key a query sees once,
// in cell order; keys it cannot see add exact zeros in the emulation and are skipped.
//
// Tiled, per query row (a task takes a kv head's rows for a block of tokens, so each tile
// of 64 keys is converted and transposed once for all of them): the scores as simd_gemm's
// FMA chain over the head dim (q unrounded), times the scale; the tile's maximum; a
// rescale by expf(Mold - M) when it grows; P = ggml_v_expf(s - M); S += the four 16-lane
// sums added in double (ggml_vec_soft_max_f32); VKQ += P.V as an FMA chain over the tile's
// keys. One_chunk: q rounded to f16, ggml_vec_dot_f16, the online softmax key by key into
// an f16 accumulator (ggml_vec_scale_f16 / ggml_vec_mad_f16), S = fma(S, ms, vs).
// Not here (the dispatcher keeps the emulation): softcaps, bf16 / f32 / quantised caches.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "ggml_cache.h"
#include "ggml_float.h"
#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace llamay {
namespace {

using namespace gf;
using namespace gc;

constexpr int64_t TILE = 64;         // GGML_FA_TILE_Q = GGML_FA_TILE_KV
constexpr int64_t SPLIT_MIN = 512;   // one token over at least this many cells: split
constexpr int64_t CELL_PAD = 256;    // llama.cpp's n_kv: the used cells rounded up to this
constexpr int64_t BLOCK_TOKENS = 8;  // query tokens a tiled task takes (x G heads)
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

// A one_chunk pass's state beside its accumulator: the maximum and the sum.
struct Pass {
  float M = NEG_INF, S = 0.0f;
};

struct Scratch {
  std::vector<float> q, kt, vt, p, acc, m, sum, kr, vr, parts, h, l, fin;
  std::vector<Pass> part, final;
};

// The query row of token t, head h, times the scale first when prescaled.
inline void query_row(const Problem& p, int64_t b, int64_t t, int64_t h, float* out) {
  const float* src = p.q + ((b * p.T + t) * p.H + h) * p.D;
  for (int64_t d = 0; d < p.D; ++d) out[d] = p.prescaled ? src[d] * p.kq_scale : src[d];
}

inline float score_scale(const Problem& p) { return p.prescaled ? 1.0f : p.kq_scale; }

// out[d] = acc[d] * (1 / S), 0 where no key was visible.
inline void normalise(const float* acc, float S, int64_t D, float* out) {
  const float inv = S == 0.0f ? 0.0f : 1.0f / S;
  for (int64_t d = 0; d < D; ++d) out[d] = acc[d] * inv;
}

// -- tiled ---------------------------------------------------------------------------------

void tiled_task(const Problem& p, int64_t b, int64_t kh, int64_t t0, int64_t t1, Scratch& sc) {
  ScopedFtz ftz;
  const int64_t D = p.D, G = p.G, R = (t1 - t0) * G;
  const float scale = score_scale(p);
  sc.q.resize(R * D);
  sc.acc.assign(R * D, 0.0f);
  sc.m.assign(R, NEG_INF);
  sc.sum.assign(R, 0.0f);
  sc.kt.resize(D * TILE);
  sc.vt.resize(TILE * D);
  sc.p.resize(TILE);
  sc.kr.resize(D);
  sc.vr.resize(D);
  std::vector<int64_t> j0(t1 - t0), j1(t1 - t0);
  int64_t lo = p.S, hi = -1;
  for (int64_t t = t0; t < t1; ++t) {
    visible(p, b, t, j0[t - t0], j1[t - t0]);
    if (j1[t - t0] >= j0[t - t0]) lo = std::min(lo, j0[t - t0]), hi = std::max(hi, j1[t - t0]);
    for (int64_t g = 0; g < G; ++g) query_row(p, b, t, kh * G + g, &sc.q[((t - t0) * G + g) * D]);
  }
  for (int64_t c0 = lo / TILE * TILE; c0 <= hi; c0 += TILE) {
    const int64_t n = std::min(TILE, p.S - c0);
    std::fill(sc.kt.begin(), sc.kt.end(), 0.0f);
    for (int64_t k = 0; k < n; ++k) {  // the tile's K transposed, its V as rows, as f32
      load_row(row_of(p, p.k, b, c0 + k, kh), D, false, sc.kr.data());
      for (int64_t d = 0; d < D; ++d) sc.kt[d * TILE + k] = sc.kr[d];
      load_row(row_of(p, p.v, b, c0 + k, kh), D, false, &sc.vt[k * D]);
    }
    for (int64_t r = 0; r < R; ++r) {
      const int64_t u = r / G, a = std::max(j0[u], c0), z = std::min(j1[u], c0 + n - 1);
      if (z < a) continue;  // no key of this tile visible: the row skips it
      const float* q = &sc.q[r * D];
      alignas(64) float s[TILE] = {};
      for (int64_t d = 0; d < D; ++d) {
        const float qd = q[d];
        const float* kd = &sc.kt[d * TILE];
        for (int64_t k = 0; k < TILE; ++k) s[k] = std::fma(qd, kd[k], s[k]);
      }
      float tmax = NEG_INF;
      for (int64_t k = 0; k < TILE; ++k) {
        const bool live = c0 + k >= a && c0 + k <= z;
        s[k] = live ? s[k] * scale : NEG_INF;
        tmax = std::max(tmax, s[k]);
      }
      float& M = sc.m[r];
      float& S = sc.sum[r];
      float* acc = &sc.acc[r * D];
      const float m_new = std::max(M, tmax);
      if (m_new > M) {
        const float ms = std::exp(M - m_new);
        for (int64_t d = 0; d < D; ++d) acc[d] = acc[d] * ms;
        S = S * ms;
      }
      M = m_new;
      float* pr = sc.p.data();
      v_expf_n(s, M, pr, TILE);
      for (int64_t k = 0; k < TILE; ++k)
        if (s[k] == NEG_INF) pr[k] = 0.0f;
      double tile_sum = 0.0;
      for (int64_t c = 0; c < TILE; c += L16) tile_sum += (double)reduce16(pr + c);
      S = (float)((double)S + tile_sum);
      for (int64_t k = a - c0; k <= z - c0; ++k) {
        const float pk = pr[k];
        if (pk == 0.0f) continue;  // adds exact zeros
        const float* vk = &sc.vt[k * D];
        for (int64_t d = 0; d < D; ++d) acc[d] = std::fma(pk, vk[d], acc[d]);
      }
    }
  }
  for (int64_t r = 0; r < R; ++r) {
    const int64_t t = t0 + r / G, h = kh * G + r % G;
    normalise(&sc.acc[r * D], sc.sum[r], D, p.out + ((b * p.T + t) * p.H + h) * D);
  }
}

// -- one_chunk, split ------------------------------------------------------------------------

// ggml_flash_attn_ext_reduce_partials adding one chunk's pass (M, S, vc) to the running
// one (M, S, vf): vf = fma(vf, so, vc * sn) as GCC contracts it; a chunk with S == 0 adds
// nothing.
inline void merge(Pass& f, float* vf, const Pass& c, const float* vc, int64_t D) {
  if (c.S == 0.0f) return;
  const float mn = std::max(f.M, c.M);
  const float so = std::exp(f.M - mn), sn = std::exp(c.M - mn);
  for (int64_t d = 0; d < D; ++d) vf[d] = std::fma(vf[d], so, vc[d] * sn);
  f.S = std::fma(f.S, so, c.S * sn);
  f.M = mn;
}

// Query token t of row b, kv head kh: its G heads' passes side by side, each key's K and V
// rows converted once for them; `chunk` the split path's cells a chunk (> S: one pass).
void chunk_task(const Problem& p, int64_t b, int64_t t, int64_t kh, int64_t chunk, Scratch& sc) {
  ScopedFtz ftz;
  const int64_t D = p.D, G = p.G;
  const float scale = score_scale(p);
  int64_t j0, j1;
  visible(p, b, t, j0, j1);
  sc.q.resize(G * D);
  sc.kr.resize(D);
  sc.vr.resize(D);
  sc.acc.assign(G * D, 0.0f);
  sc.fin.assign(G * D, 0.0f);
  sc.part.assign(G, Pass());
  sc.final.assign(G, Pass());
  for (int64_t g = 0; g < G; ++g) {
    float* q = &sc.q[g * D];
    query_row(p, b, t, kh * G + g, q);
    for (int64_t d = 0; d < D; ++d) q[d] = round_f16(q[d]);
  }
  int64_t cur = j0 < 0 ? 0 : j0 / chunk;
  for (int64_t j = std::max<int64_t>(j0, 0); j <= j1; ++j) {
    if (j / chunk != cur) {  // a new chunk: the last one's passes merged, fresh ones
      for (int64_t g = 0; g < G; ++g) {
        merge(sc.final[g], &sc.fin[g * D], sc.part[g], &sc.acc[g * D], D);
        sc.part[g] = Pass();
      }
      std::fill(sc.acc.begin(), sc.acc.end(), 0.0f);
      cur = j / chunk;
    }
    load_row(row_of(p, p.k, b, j, kh), D, false, sc.kr.data());
    load_row(row_of(p, p.v, b, j, kh), D, false, sc.vr.data());
    for (int64_t g = 0; g < G; ++g) {
      Pass& part = sc.part[g];
      float* acc = &sc.acc[g * D];
      const float s = dot_vec(&sc.q[g * D], sc.kr.data(), D, sc.parts, sc.h, sc.l) * scale;
      const bool new_max = s > part.M;
      const float ms = new_max ? std::exp(part.M - s) : 1.0f;
      const float vs = new_max ? 1.0f : std::exp(s - part.M);
      for (int64_t d = 0; d < D; ++d)
        acc[d] = round_f16(std::fma(sc.vr[d], vs, round_f16(acc[d] * ms)));
      part.S = std::fma(part.S, ms, vs);
      if (new_max) part.M = s;
    }
  }
  for (int64_t g = 0; g < G; ++g) {
    float* o = p.out + ((b * p.T + t) * p.H + kh * G + g) * D;
    if (chunk > p.S) {
      normalise(&sc.acc[g * D], sc.part[g].S, D, o);
    } else {
      merge(sc.final[g], &sc.fin[g * D], sc.part[g], &sc.acc[g * D], D);
      normalise(&sc.fin[g * D], sc.final[g].S, D, o);
    }
  }
}

// The split path's cells a chunk for row b (rows == 1, n_kv >= 512), else S + 1.
int64_t split_chunk(const Problem& p, int64_t b, int32_t rows, int32_t threads) {
  int64_t last = -1;
  for (int64_t t = 0; t < p.T; ++t) {
    const int64_t qp = p.qpos[b * p.T + t];
    last = std::max(last, qp < p.S ? qp : -1);
  }
  const int64_t n_kv = std::max(CELL_PAD, (last + 1 + CELL_PAD - 1) / CELL_PAD * CELL_PAD);
  if (rows != 1 || n_kv < SPLIT_MIN) return p.S + 1;
  const int64_t th = std::max<int32_t>(threads, 1);
  return (n_kv + th - 1) / th;
}

ffi::Error GgmlFlashAttention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::AnyBuffer k,
                              ffi::AnyBuffer v, ffi::BufferR0<ffi::S32> layer,
                              ffi::Buffer<ffi::S32> table, ffi::Buffer<ffi::S32> qpos,
                              ffi::BufferR0<ffi::S32> window, ffi::BufferR0<ffi::S32> rows,
                              ffi::ResultBuffer<ffi::F32> out, float kq_scale, int32_t prescaled,
                              int32_t causal, int32_t paged, int32_t threads) {
  Problem p;
  if (ffi::Error e = read_problem("LlamayGgmlFlashAttention", q, k, v, layer, table, qpos,
                                  window, out, kq_scale, prescaled, causal, paged, p);
      e.failure())
    return e;
  if (p.kbf16 || p.vbf16)
    return ffi::Error::InvalidArgument("LlamayGgmlFlashAttention: K and V must be f16");
  if (p.B * p.T * p.K == 0 || p.D == 0) return ffi::Error::Success();
  const int32_t n_rows = *rows.typed_data();
  if (n_rows >= TILE) {
    const int64_t nb = (p.T + BLOCK_TOKENS - 1) / BLOCK_TOKENS;
    parallel_for(pool, p.B * p.K * nb, [&](int64_t i) {
      thread_local Scratch sc;
      const int64_t blk = i % nb, kh = i / nb % p.K, b = i / nb / p.K;
      tiled_task(p, b, kh, blk * BLOCK_TOKENS, std::min(p.T, (blk + 1) * BLOCK_TOKENS), sc);
    });
    return ffi::Error::Success();
  }
  std::vector<int64_t> chunk(p.B);
  for (int64_t b = 0; b < p.B; ++b) chunk[b] = split_chunk(p, b, n_rows, threads);
  parallel_for(pool, p.B * p.T * p.K, [&](int64_t i) {
    thread_local Scratch sc;
    const int64_t b = i / (p.T * p.K);
    chunk_task(p, b, i / p.K % p.T, i % p.K, chunk[b], sc);
  });
  return ffi::Error::Success();
}

}  // namespace
}  // namespace llamay

XLA_FFI_DEFINE_HANDLER_SYMBOL(LlamayGgmlFlashAttention, llamay::GgmlFlashAttention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::BufferR0<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::BufferR0<ffi::S32>>()
                                  .Arg<ffi::BufferR0<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("kq_scale")
                                  .Attr<int32_t>("prescaled")
                                  .Attr<int32_t>("causal")
                                  .Attr<int32_t>("paged")
                                  .Attr<int32_t>("threads"));
