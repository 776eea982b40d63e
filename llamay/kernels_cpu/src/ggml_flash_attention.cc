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
// of 64 keys is converted and transposed once for all of them, and runs its rows' scores
// and P.V four rows at a time with the sums in registers): the scores as simd_gemm's
// FMA chain over the head dim (q unrounded), times the scale; the tile's maximum; a
// rescale by expf(Mold - M) when it grows; P = ggml_v_expf(s - M); S += the four 16-lane
// sums added in double (ggml_vec_soft_max_f32); VKQ += P.V as an FMA chain over the tile's
// keys. One_chunk: q rounded to f16, ggml_vec_dot_f16, the online softmax key by key into
// an f16 accumulator (ggml_vec_scale_f16 / ggml_vec_mad_f16), S = fma(S, ms, vs); a kv
// head's G heads side by side (each key's f16 rows read in place); on the split path each
// chunk is a task, the chunks merged after.
// Not here (the dispatcher keeps the emulation): softcaps, bf16 / f32 / quantised caches.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

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

// The vector paths: AVX-512's 16 lanes, AVX2's 8 (F16C and FMA beside it), each lane the
// same operations in the same order as the scalar code (which takes what is left).
#if defined(__AVX512F__) && !defined(LLAMAY_SCALAR)
#define LLAMAY_FA_AVX512 1
#endif
#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__) && !defined(LLAMAY_SCALAR)
#define LLAMAY_FA_AVX2 1
#endif

// ggml_vec_scale_f16 then ggml_vec_mad_f16 on an f16 accumulator held as f32 values, v an
// f16 row: acc[d] = f16(fma(v[d], vs, f16(acc[d] * ms))). The scale is left out when ms is
// 1 (every key but a new maximum): acc's values are f16s, so times 1 and rounded to f16
// they are themselves.
inline void mad_f16(float* acc, const uint16_t* v, float vs, float ms, int64_t D) {
  const bool scaled = ms != 1.0f;
  int64_t d = 0;
#if defined(LLAMAY_FA_AVX512) || defined(LLAMAY_FA_AVX2)
  constexpr int RN = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
#endif
#ifdef LLAMAY_FA_AVX512
  const __m512 vvs = _mm512_set1_ps(vs), vms = _mm512_set1_ps(ms);
  for (; d + 16 <= D; d += 16) {
    __m512 a = _mm512_loadu_ps(acc + d);
    if (scaled) a = _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_mul_ps(a, vms), RN));
    a = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(v + d))), vvs, a);
    _mm512_storeu_ps(acc + d, _mm512_cvtph_ps(_mm512_cvtps_ph(a, RN)));
  }
#endif
#ifdef LLAMAY_FA_AVX2
  const __m256 vvs8 = _mm256_set1_ps(vs), vms8 = _mm256_set1_ps(ms);
  for (; d + 8 <= D; d += 8) {
    __m256 a = _mm256_loadu_ps(acc + d);
    if (scaled) a = _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_mul_ps(a, vms8), RN));
    a = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(v + d))), vvs8, a);
    _mm256_storeu_ps(acc + d, _mm256_cvtph_ps(_mm256_cvtps_ph(a, RN)));
  }
#endif
  for (; d < D; ++d) {
    const float a = scaled ? round_f16(acc[d] * ms) : acc[d];
    acc[d] = round_f16(std::fma(f16_to_f32(v[d]), vs, a));
  }
}

// A one_chunk pass's state beside its accumulator: the maximum and the sum.
struct Pass {
  float M = NEG_INF, S = 0.0f;
};

struct Scratch {
  std::vector<float> q, kt, vt, s, acc, m, sum, kr, parts, h, l, fin;
  std::vector<Pass> part;
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

// The scores of NR rows over a tile, simd_gemm's FMA chains over d from 0: s[r][k] =
// fma(q_r[d], kt[d][k], s[r][k]) for d = 0..D-1 (kt: the tile's K transposed, [D][64]).
template <int NR>
inline void tile_scores(const float* const* qs, const float* kt, int64_t D, float* s) {
#ifdef LLAMAY_FA_AVX512
  __m512 acc[NR][4];
  for (int r = 0; r < NR; ++r)
    for (int i = 0; i < 4; ++i) acc[r][i] = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; ++d) {
    __m512 kv[4];
    for (int i = 0; i < 4; ++i) kv[i] = _mm512_loadu_ps(kt + d * TILE + 16 * i);
    for (int r = 0; r < NR; ++r) {
      const __m512 qb = _mm512_set1_ps(qs[r][d]);
      for (int i = 0; i < 4; ++i) acc[r][i] = _mm512_fmadd_ps(qb, kv[i], acc[r][i]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int i = 0; i < 4; ++i) _mm512_storeu_ps(s + r * TILE + 16 * i, acc[r][i]);
#elif defined(LLAMAY_FA_AVX2)
  for (int64_t k0 = 0; k0 < TILE; k0 += 16) {  // 16 keys a pass: 8 accumulators, 2 of K
    __m256 acc[NR][2];
    for (int r = 0; r < NR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; ++d) {
      const __m256 k0v = _mm256_loadu_ps(kt + d * TILE + k0);
      const __m256 k1v = _mm256_loadu_ps(kt + d * TILE + k0 + 8);
      for (int r = 0; r < NR; ++r) {
        const __m256 qb = _mm256_set1_ps(qs[r][d]);
        acc[r][0] = _mm256_fmadd_ps(qb, k0v, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(qb, k1v, acc[r][1]);
      }
    }
    for (int r = 0; r < NR; ++r) {
      _mm256_storeu_ps(s + r * TILE + k0, acc[r][0]);
      _mm256_storeu_ps(s + r * TILE + k0 + 8, acc[r][1]);
    }
  }
#else
  for (int r = 0; r < NR; ++r) {
    float* sr = s + r * TILE;
    for (int64_t k = 0; k < TILE; ++k) sr[k] = 0.0f;
    for (int64_t d = 0; d < D; ++d)
      for (int64_t k = 0; k < TILE; ++k) sr[k] = std::fma(qs[r][d], kt[d * TILE + k], sr[k]);
  }
#endif
}

// VKQ += P.V for NR rows, simd_gemm's FMA chains over the tile's keys: acc_r[d] =
// fma(p_r[k], vt[k][d], acc_r[d]) for k = 0..63 (keys a row cannot see have p = 0 and add
// exact zeros).
template <int NR>
inline void tile_pv(const float* const* ps, const float* vt, int64_t D, float* const* accs) {
#ifdef LLAMAY_FA_AVX512
  if (D % 64 == 0) {
    for (int64_t d0 = 0; d0 < D; d0 += 64) {
      __m512 acc[NR][4];
      for (int r = 0; r < NR; ++r)
        for (int i = 0; i < 4; ++i) acc[r][i] = _mm512_loadu_ps(accs[r] + d0 + 16 * i);
      for (int64_t k = 0; k < TILE; ++k) {
        __m512 vv[4];
        for (int i = 0; i < 4; ++i) vv[i] = _mm512_loadu_ps(vt + k * D + d0 + 16 * i);
        for (int r = 0; r < NR; ++r) {
          const __m512 pb = _mm512_set1_ps(ps[r][k]);
          for (int i = 0; i < 4; ++i) acc[r][i] = _mm512_fmadd_ps(pb, vv[i], acc[r][i]);
        }
      }
      for (int r = 0; r < NR; ++r)
        for (int i = 0; i < 4; ++i) _mm512_storeu_ps(accs[r] + d0 + 16 * i, acc[r][i]);
    }
    return;
  }
#endif
#ifdef LLAMAY_FA_AVX2
  if (D % 16 == 0) {
    for (int64_t d0 = 0; d0 < D; d0 += 16) {  // 16 outputs a pass: 8 accumulators, 2 of V
      __m256 acc[NR][2];
      for (int r = 0; r < NR; ++r)
        for (int i = 0; i < 2; ++i) acc[r][i] = _mm256_loadu_ps(accs[r] + d0 + 8 * i);
      for (int64_t k = 0; k < TILE; ++k) {
        const __m256 v0 = _mm256_loadu_ps(vt + k * D + d0), v1 = _mm256_loadu_ps(vt + k * D + d0 + 8);
        for (int r = 0; r < NR; ++r) {
          const __m256 pb = _mm256_set1_ps(ps[r][k]);
          acc[r][0] = _mm256_fmadd_ps(pb, v0, acc[r][0]);
          acc[r][1] = _mm256_fmadd_ps(pb, v1, acc[r][1]);
        }
      }
      for (int r = 0; r < NR; ++r)
        for (int i = 0; i < 2; ++i) _mm256_storeu_ps(accs[r] + d0 + 8 * i, acc[r][i]);
    }
    return;
  }
#endif
  for (int r = 0; r < NR; ++r)
    for (int64_t k = 0; k < TILE; ++k)
      for (int64_t d = 0; d < D; ++d) accs[r][d] = std::fma(ps[r][k], vt[k * D + d], accs[r][d]);
}

// f(rows, n) over `live` in groups of up to 4 rows (f templated on the group's size).
template <class F>
inline void in_groups(const std::vector<int64_t>& live, F&& f) {
  size_t i = 0;
  for (; i + 4 <= live.size(); i += 4) f(std::integral_constant<int, 4>(), &live[i]);
  const size_t left = live.size() - i;
  if (left == 3) f(std::integral_constant<int, 3>(), &live[i]);
  if (left == 2) f(std::integral_constant<int, 2>(), &live[i]);
  if (left == 1) f(std::integral_constant<int, 1>(), &live[i]);
}

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
  sc.s.resize(R * TILE);
  sc.kr.resize(D);
  std::vector<int64_t> j0(t1 - t0), j1(t1 - t0), live;
  int64_t lo = p.S, hi = -1;
  for (int64_t t = t0; t < t1; ++t) {
    visible(p, b, t, j0[t - t0], j1[t - t0]);
    if (j1[t - t0] >= j0[t - t0]) lo = std::min(lo, j0[t - t0]), hi = std::max(hi, j1[t - t0]);
    for (int64_t g = 0; g < G; ++g) query_row(p, b, t, kh * G + g, &sc.q[((t - t0) * G + g) * D]);
  }
  for (int64_t c0 = lo / TILE * TILE; c0 <= hi; c0 += TILE) {
    const int64_t n = std::min(TILE, p.S - c0);
    std::fill(sc.kt.begin(), sc.kt.end(), 0.0f);
    std::fill(sc.vt.begin(), sc.vt.end(), 0.0f);
    for (int64_t k = 0; k < n; ++k) {  // the tile's K transposed, its V as rows, as f32
      load_row(row_of(p, p.k, b, c0 + k, kh), D, false, sc.kr.data());
      for (int64_t d = 0; d < D; ++d) sc.kt[d * TILE + k] = sc.kr[d];
      load_row(row_of(p, p.v, b, c0 + k, kh), D, false, &sc.vt[k * D]);
    }
    live.clear();  // the rows that see a key of this tile (the others skip it)
    for (int64_t r = 0; r < R; ++r)
      if (std::min(j1[r / G], c0 + n - 1) >= std::max(j0[r / G], c0)) live.push_back(r);
    in_groups(live, [&](auto nr, const int64_t* rows) {
      const float* qs[nr];
      for (int i = 0; i < nr; ++i) qs[i] = &sc.q[rows[i] * D];
      alignas(64) float s[nr * TILE];
      tile_scores<nr>(qs, sc.kt.data(), D, s);
      for (int i = 0; i < nr; ++i) std::copy(s + i * TILE, s + (i + 1) * TILE, &sc.s[rows[i] * TILE]);
    });
    for (int64_t r : live) {  // the online softmax: P into sc.s
      const int64_t u = r / G, a = std::max(j0[u], c0), z = std::min(j1[u], c0 + n - 1);
      float* s = &sc.s[r * TILE];
      float tmax = NEG_INF;
      for (int64_t k = 0; k < TILE; ++k) {
        const bool vis = c0 + k >= a && c0 + k <= z;
        s[k] = vis ? s[k] * scale : NEG_INF;
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
      alignas(64) float pr[TILE];
      v_expf_n(s, M, pr, TILE);
      for (int64_t k = 0; k < TILE; ++k) s[k] = s[k] == NEG_INF ? 0.0f : pr[k];
      double tile_sum = 0.0;
      for (int64_t c = 0; c < TILE; c += L16) tile_sum += (double)reduce16(s + c);
      S = (float)((double)S + tile_sum);
    }
    in_groups(live, [&](auto nr, const int64_t* rows) {
      const float* ps[nr];
      float* accs[nr];
      for (int i = 0; i < nr; ++i) ps[i] = &sc.s[rows[i] * TILE], accs[i] = &sc.acc[rows[i] * D];
      tile_pv<nr>(ps, sc.vt.data(), D, accs);
    });
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

// ggml_float.dot_f16_vec of q (f16 values as f32) and the f16 row k, for D % 64 == 0 (no
// leftovers): four accumulators of 16 lanes, chunk i into accumulator i % 4 (products of
// f16 values: exact, so mul then add is the emulation's sum), (a0 + a2) + (a1 + a3),
// reduce16; else the general form (k converted into sc.kr).
inline float dot_f16(const float* q, const uint16_t* k, int64_t D, Scratch& sc) {
#ifdef LLAMAY_FA_AVX512
  if (D % 64 == 0) {
    const auto term = [&](int64_t i) {
      return _mm512_mul_ps(_mm512_loadu_ps(q + 16 * i),
                           _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(k + 16 * i))));
    };
    __m512 acc[4];
    for (int i = 0; i < 4; ++i) acc[i] = term(i);
    for (int64_t i = 4; i < D / 16; ++i) acc[i % 4] = _mm512_add_ps(acc[i % 4], term(i));
    alignas(64) float t[16];
    _mm512_store_ps(t, _mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3])));
    return reduce16(t);
  }
#elif defined(LLAMAY_FA_AVX2)
  if (D % 64 == 0) {  // each 16-lane accumulator as two halves of 8
    const auto term = [&](int64_t i, int h) {
      return _mm256_mul_ps(_mm256_loadu_ps(q + 16 * i + 8 * h),
                           _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(k + 16 * i + 8 * h))));
    };
    __m256 acc[4][2];
    for (int i = 0; i < 4; ++i)
      for (int h = 0; h < 2; ++h) acc[i][h] = term(i, h);
    for (int64_t i = 4; i < D / 16; ++i)
      for (int h = 0; h < 2; ++h) acc[i % 4][h] = _mm256_add_ps(acc[i % 4][h], term(i, h));
    alignas(32) float t[16];
    for (int h = 0; h < 2; ++h)
      _mm256_store_ps(t + 8 * h, _mm256_add_ps(_mm256_add_ps(acc[0][h], acc[2][h]),
                                               _mm256_add_ps(acc[1][h], acc[3][h])));
    return reduce16(t);
  }
#endif
  load_row(k, D, false, sc.kr.data());
  return dot_vec(q, sc.kr.data(), D, sc.parts, sc.h, sc.l);
}

// One pass over the keys of [lo, hi] query token t of row b sees, for kv head kh's G heads
// side by side (each key's K and V rows read in place for them): their states into
// `pass` [G] and their f16 accumulators into acc [G, D]. q16 [G, D]: the queries rounded
// to f16.
void pass_range(const Problem& p, int64_t b, int64_t t, int64_t kh, int64_t lo, int64_t hi,
                const float* q16, Pass* pass, float* acc, Scratch& sc) {
  const int64_t D = p.D, G = p.G;
  const float scale = score_scale(p);
  int64_t j0, j1;
  visible(p, b, t, j0, j1);
  for (int64_t g = 0; g < G; ++g) pass[g] = Pass();
  std::fill(acc, acc + G * D, 0.0f);
  sc.kr.resize(D);
  for (int64_t j = std::max(j0, lo); j <= std::min(j1, hi); ++j) {
    const uint16_t *kr = row_of(p, p.k, b, j, kh), *vr = row_of(p, p.v, b, j, kh);
    for (int64_t g = 0; g < G; ++g) {
      Pass& part = pass[g];
      const float s = dot_f16(q16 + g * D, kr, D, sc) * scale;
      const bool new_max = s > part.M;
      const float ms = new_max ? std::exp(part.M - s) : 1.0f;
      const float vs = new_max ? 1.0f : std::exp(s - part.M);
      mad_f16(acc + g * D, vr, vs, ms, D);
      part.S = std::fma(part.S, ms, vs);
      if (new_max) part.M = s;
    }
  }
}

// One pass of token t's G heads (kv head kh) over the cells [lo, hi]: the queries rounded
// to f16 into sc.q, the heads' states into sc.part, their accumulators into sc.acc [G, D].
void heads_pass(const Problem& p, int64_t b, int64_t t, int64_t kh, int64_t lo, int64_t hi,
                Scratch& sc) {
  const int64_t D = p.D, G = p.G;
  sc.q.resize(G * D);
  sc.acc.resize(G * D);
  sc.part.resize(G);
  for (int64_t g = 0; g < G; ++g) {
    float* q16 = &sc.q[g * D];
    query_row(p, b, t, kh * G + g, q16);
    for (int64_t d = 0; d < D; ++d) q16[d] = round_f16(q16[d]);
  }
  pass_range(p, b, t, kh, lo, hi, sc.q.data(), sc.part.data(), sc.acc.data(), sc);
}

// One pass a query row: token t of row b, kv head kh's G heads.
void one_chunk_task(const Problem& p, int64_t b, int64_t t, int64_t kh, Scratch& sc) {
  ScopedFtz ftz;
  const int64_t D = p.D, G = p.G;
  heads_pass(p, b, t, kh, 0, p.S - 1, sc);
  for (int64_t g = 0; g < G; ++g)
    normalise(&sc.acc[g * D], sc.part[g].S, D, p.out + ((b * p.T + t) * p.H + kh * G + g) * D);
}

// The split path's chunk c of row b's one token (t), kv head kh: its passes into
// `parts` [G, 2 + D] (M, S, the accumulator).
void split_task(const Problem& p, int64_t b, int64_t t, int64_t kh, int64_t c, int64_t chunk,
                float* parts, Scratch& sc) {
  ScopedFtz ftz;
  const int64_t D = p.D, G = p.G;
  heads_pass(p, b, t, kh, c * chunk, (c + 1) * chunk - 1, sc);
  for (int64_t g = 0; g < G; ++g) {
    float* out = parts + g * (2 + D);
    out[0] = sc.part[g].M, out[1] = sc.part[g].S;
    std::copy(&sc.acc[g * D], &sc.acc[(g + 1) * D], out + 2);
  }
}

// The chunks' passes of kv head kh merged in order (ggml_flash_attn_ext_reduce_partials)
// and normalised. parts [nc, G, 2 + D].
void merge_task(const Problem& p, int64_t b, int64_t t, int64_t kh, int64_t nc,
                const float* parts, Scratch& sc) {
  ScopedFtz ftz;
  const int64_t D = p.D, G = p.G;
  sc.fin.resize(D);
  for (int64_t g = 0; g < G; ++g) {
    Pass f;
    std::fill(sc.fin.begin(), sc.fin.end(), 0.0f);
    for (int64_t c = 0; c < nc; ++c) {
      const float* part = parts + (c * G + g) * (2 + D);
      Pass cp;
      cp.M = part[0], cp.S = part[1];
      merge(f, sc.fin.data(), cp, part + 2, D);
    }
    normalise(sc.fin.data(), f.S, D, p.out + ((b * p.T + t) * p.H + kh * G + g) * D);
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
  // one pass a query row, but a row's one token over n_kv >= 512 cells split into chunks
  // (a task each), then merged
  std::vector<int64_t> chunk(p.B), nc(p.B);
  for (int64_t b = 0; b < p.B; ++b) {
    chunk[b] = split_chunk(p, b, n_rows, threads);
    nc[b] = chunk[b] > p.S ? 0 : (p.S + chunk[b] - 1) / chunk[b];
  }
  std::vector<int64_t> tasks;  // (b, t, kh, c): c < 0 one pass
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t t = 0; t < p.T; ++t)
      for (int64_t kh = 0; kh < p.K; ++kh)
        for (int64_t c = nc[b] ? 0 : -1; c < std::max<int64_t>(nc[b], 0); ++c)
          tasks.insert(tasks.end(), {b, t, kh, c});
  const int64_t stride = p.G * (2 + p.D);
  std::vector<float> parts;
  std::vector<int64_t> at(tasks.size() / 4, -1);
  for (size_t i = 0, n = 0; i < at.size(); ++i)
    if (tasks[4 * i + 3] >= 0) at[i] = (int64_t)n++ * stride;
  parts.resize(std::count_if(at.begin(), at.end(), [](int64_t a) { return a >= 0; }) * stride);
  parallel_for(pool, (int64_t)at.size(), [&](int64_t i) {
    thread_local Scratch sc;
    const int64_t* tk = &tasks[4 * i];
    if (tk[3] < 0)
      one_chunk_task(p, tk[0], tk[1], tk[2], sc);
    else
      split_task(p, tk[0], tk[1], tk[2], tk[3], chunk[tk[0]], &parts[at[i]], sc);
  });
  // the split rows' merges: their chunks' parts lie consecutively (c fastest)
  std::vector<int64_t> merges;
  for (size_t i = 0; i < at.size(); ++i)
    if (tasks[4 * i + 3] == 0) merges.push_back((int64_t)i);
  parallel_for(pool, (int64_t)merges.size(), [&](int64_t m) {
    thread_local Scratch sc;
    const int64_t* tk = &tasks[4 * merges[m]];
    merge_task(p, tk[0], tk[1], tk[2], nc[tk[0]], &parts[at[merges[m]]], sc);
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
