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
// skipped here (only the sign of an all-zero result can differ). Two paths compute this:
// the tiles (below: a kv head's rows together, each sum's lanes vectorised across keys),
// which take whole-chunk dots (D % 16 == 0 for a batch, D % 64 == 0 for one token), and
// per query token and kv head (`task`) otherwise. Subnormals are flushed
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
#include "ggml_cache.h"
#include "ggml_float.h"
#include "parallel.h"
#include "vec16.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace llamay {
namespace {


using namespace gf;
using namespace gc;

struct Scratch {
  std::vector<float> q, kr, e, acc, sums, h, l, parts;
  std::vector<const uint16_t*> rows;  // the visible keys' V rows
};

// ggml_float.dot_f16_sgemm (D % 16 == 0).
inline float dot_sgemm(const float* a, const float* b, int64_t D) {
  float acc[L16];
  for (int l = 0; l < L16; ++l) acc[l] = a[l] * b[l];
  for (int64_t c = L16; c < D; c += L16)
    for (int l = 0; l < L16; ++l) acc[l] = acc[l] + a[c + l] * b[c + l];
  return reduce16(acc);
}

// P.V's lane sums acc [na][16][D] (na = 4: accumulators by chunk index, one token) to
// the outputs o[dlo..dhi), vectorised over d: (a0 + a2) + (a1 + a3), then reduce16 across
// the lanes (halves, quarters, pairs). acc is overwritten.
inline void reduce_lanes(float* acc, int64_t na, int64_t D, float* o, int64_t dlo = 0,
                         int64_t dhi = -1) {
  if (dhi < 0) dhi = D;
  if (na == 4)
    for (int64_t l = 0; l < L16; ++l) {
      float* a0 = acc + l * D;
      const float *a1 = acc + (L16 + l) * D, *a2 = acc + (2 * L16 + l) * D,
                  *a3 = acc + (3 * L16 + l) * D;
      for (int64_t d = dlo; d < dhi; ++d) a0[d] = (a0[d] + a2[d]) + (a1[d] + a3[d]);
    }
  for (int64_t l = 0; l < 8; ++l)
    for (int64_t d = dlo; d < dhi; ++d) acc[l * D + d] = acc[(8 + l) * D + d] + acc[l * D + d];
  for (int64_t l = 0; l < 4; ++l)
    for (int64_t d = dlo; d < dhi; ++d) acc[l * D + d] = acc[(4 + l) * D + d] + acc[l * D + d];
  for (int64_t d = dlo; d < dhi; ++d)
    o[d] = (acc[d] + acc[2 * D + d]) + (acc[D + d] + acc[3 * D + d]);
}

// out[c] = reduce16(x + 16 c) for c < n: 16 chunks at a time transposed, reduce16's tree
// then elementwise across them.
inline void chunk_sums(const float* x, int64_t n, float* out) {
  int64_t c = 0;
#if defined(__AVX512F__) && !defined(LLAMAY_SCALAR)
  for (; c + 16 <= n; c += 16) {
    __m512 m[16];
    for (int i = 0; i < 16; ++i) m[i] = _mm512_loadu_ps(x + (c + i) * L16);
    transpose16(m);  // m[l]: lane l of the 16 chunks
    for (int l = 0; l < 8; ++l) m[l] = _mm512_add_ps(m[8 + l], m[l]);
    for (int l = 0; l < 4; ++l) m[l] = _mm512_add_ps(m[4 + l], m[l]);
    _mm512_storeu_ps(out + c, _mm512_add_ps(_mm512_add_ps(m[0], m[2]), _mm512_add_ps(m[1], m[3])));
  }
#elif defined(__AVX2__) && !defined(LLAMAY_SCALAR)
  for (; c + 8 <= n; c += 8) {  // reduce16's first level, then 8 chunks transposed
    __m256 m[8];
    for (int i = 0; i < 8; ++i)
      m[i] = _mm256_add_ps(_mm256_loadu_ps(x + (c + i) * L16 + 8), _mm256_loadu_ps(x + (c + i) * L16));
    transpose8(m);  // m[l]: lane l of the 8 chunks' first level
    for (int l = 0; l < 4; ++l) m[l] = _mm256_add_ps(m[4 + l], m[l]);
    _mm256_storeu_ps(out + c, _mm256_add_ps(_mm256_add_ps(m[0], m[2]), _mm256_add_ps(m[1], m[3])));
  }
#endif
  for (; c < n; ++c) out[c] = reduce16(x + c * L16);
}

// One query row's softmax as ggml_soft_max_f32, in place: x[j - base] holds the scores
// of the visible keys j0..j1 (base = a multiple of 16 at or below j0); it gets their
// probabilities rounded to f16 and zeros for the rest of their 16-chunks. The max over the
// visible keys, ggml_v_expf, per-chunk sums (reduce16) in the pairwise double sum over
// all nchunks of the cache (the others zero), 1/sum as recip_pair.
inline void softmax_row(float* x, int64_t base, int64_t j0, int64_t j1, int64_t nchunks,
                        std::vector<float>& sums, std::vector<float>& h, std::vector<float>& l) {
  const int64_t c0 = j0 / L16, c1 = j1 / L16;
  float* v = x + (j0 - base);
  const int64_t n = j1 - j0 + 1;
  float mx = max_of(v, n);
  if (!std::isfinite(mx)) mx = 0.0f;
  v_expf_n(v, mx, v, n);
  float* e = x + (c0 * L16 - base);  // the row's chunks
  std::fill(e, v, 0.0f);
  std::fill(v + n, e + (c1 - c0 + 1) * L16, 0.0f);
  sums.assign(nchunks, 0.0f);
  chunk_sums(e, c1 - c0 + 1, sums.data() + c0);
  float hi, lo;
  dsum(sums.data(), nchunks, h, l, hi, lo);
  const float inv = hi > 0.0f ? recip_pair(hi, lo) : 0.0f;
  round_f16_scaled(e, (c1 - c0 + 1) * L16, inv);
}

void task(const Problem& p, int64_t b, int64_t t, int64_t kh, Scratch& sc) {
  ScopedFtz ftz;
  const int64_t D = p.D, G = p.G, S = p.S;
  const bool batched = p.T > 1;
  const bool sgemm = batched && D % L16 == 0;
  int64_t j0, j1;
  visible(p, b, t, j0, j1);
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
  // scores, in e[g][j - c0*16] over the absolute 16-chunks c0..c1
  const int64_t c0 = j0 / L16, c1 = j1 / L16, nc = c1 - c0 + 1;
  sc.e.resize(G * nc * L16);
  sc.kr.resize(D);
  for (int64_t j = j0; j <= j1; ++j) {
    const uint16_t* kr = row_of(p, p.k, b, j, kh);
    load_row(kr, D, p.kbf16, sc.kr.data());
    for (int64_t g = 0; g < G; ++g) {
      const float* qg = sc.q.data() + g * D;
      const float dot = sgemm ? dot_sgemm(qg, sc.kr.data(), D) : dot_vec(qg, sc.kr.data(), D, sc.parts, sc.h, sc.l);
      sc.e[g * nc * L16 + (j - c0 * L16)] = dot * kq_scale;
    }
  }
  for (int64_t g = 0; g < G; ++g)
    softmax_row(sc.e.data() + g * nc * L16, c0 * L16, j0, j1, S / L16, sc.sums, sc.h, sc.l);
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
  for (int64_t g = 0; g < G; ++g) reduce_lanes(sc.acc.data() + g * na * L16 * D, na, D, out + g * D);
}

// -- Tiles: a block of query tokens and its G heads together -------------------------------
//
// The path above computes one query token's heads at a time and sums each key's score
// across its 16 lanes (reduce16) key by key: ~22 ns a (row, key) at a 4,096-token depth.
// Here a task takes the R = tokens x G rows of a kv head that share its keys (a decode
// step's heads, or a block of a prefill chunk's tokens), with the same operations in the
// same order, vectorised across keys: each 16-key chunk of K is converted and transposed
// once for all R rows (kt [D][16 keys]); a row's 16 lane sums are then 16 vectors over the
// keys, built chunk after chunk (sgemm) or into 4 accumulators by chunk (vec_dot), and
// reduce16's tree runs between those vectors, elementwise. The softmax per row as above.
// P.V over a group of rows, each V row read once for the group: a batch's each lane's
// sum in a register over its keys (pv_rows), one token's with the keys in memory order
// and the sums in L1 (pv_stream). Keys a row cannot see but its tile's other rows can
// enter with p = 0: they add exact zeros, as in the emulation (which sums over the whole
// cache). Taken when the emulation's dots are whole chunks: D % 16 == 0 for a batch
// (sgemm), D % 64 == 0 for one token (vec_dot, no leftover products).
constexpr int64_t TILE_ROWS = 16;  // query rows (tokens x G) a task aims at
constexpr int64_t PV_AHEAD = 8;  // chunks ahead that pv_rows prefetches a lane's V rows
// Small loops over a tile's registers unrolled on every target (indices known: registers).
#define LLAMAY_UNROLL_ALL _Pragma("GCC unroll 16")
constexpr int64_t STREAM_ROWS = 4;  // rows of a pv_stream group: 4 x 8 KB of sums
#if defined(__AVX512F__)
constexpr int64_t PV_ROWS = 16;  // rows of a pv_rows group: 16 accumulators, one pt line
#else
constexpr int64_t PV_ROWS = 4;
#endif

// acc + a * b: one FMA where the product is exact and never below the normals (f16 times
// f16), which rounds as the emulation's multiply then add; both roundings otherwise (a
// bf16 operand: its product can flush to zero under FTZ, which a fused one would not).
// AVX2 without AVX-512: f16v is two 8-lane halves (vec16.h).
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && !defined(__AVX512F__) && \
    !defined(LLAMAY_SCALAR)
#define LLAMAY_GA_AVX2 1
// 8 f16 / bf16 values as floats.
inline __m256 load_half8(const uint16_t* p, bool bf16) {
  const __m128i h = _mm_loadu_si128((const __m128i*)p);
  if (!bf16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
#endif

template <bool FUSED>
inline f16v madd(f16v acc, f16v a, f16v b) {
#if defined(__AVX512F__) && !defined(LLAMAY_SCALAR)
  if constexpr (FUSED) return (f16v)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)acc);
#elif defined(LLAMAY_GA_AVX2)
  if constexpr (FUSED)
    return {(f8v)_mm256_fmadd_ps((__m256)a.lo, (__m256)b.lo, (__m256)acc.lo),
            (f8v)_mm256_fmadd_ps((__m256)a.hi, (__m256)b.hi, (__m256)acc.hi)};
#endif
  return acc + a * b;
}

// 16 f16 / bf16 values as floats.
inline f16v load_half16(const uint16_t* p, bool bf16) {
#if defined(__AVX512F__) && !defined(LLAMAY_SCALAR)
  const __m256i h = _mm256_loadu_si256((const __m256i*)p);
  if (!bf16) return (f16v)_mm512_cvtph_ps(h);
  return (f16v)_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
#elif defined(LLAMAY_GA_AVX2)
  return {(f8v)load_half8(p, bf16), (f8v)load_half8(p + 8, bf16)};
#else
  float v[16];
  load_row(p, 16, bf16, v);
  return load16(v);
#endif
}

// kt[d][i] = K row i's element d, for the 16 rows kr (D % 16 == 0).
inline void transpose_keys(const uint16_t* const* kr, int64_t D, bool bf16, float* kt) {
#if defined(__AVX512F__) && !defined(LLAMAY_SCALAR)
  for (int64_t d0 = 0; d0 < D; d0 += L16) {
    __m512 r[16];
    for (int i = 0; i < 16; ++i) r[i] = (__m512)load_half16(kr[i] + d0, bf16);
    transpose16(r);
    for (int x = 0; x < 16; ++x) _mm512_storeu_ps(kt + (d0 + x) * L16, r[x]);
  }
#elif defined(LLAMAY_GA_AVX2)
  for (int64_t d0 = 0; d0 < D; d0 += 8)  // 8 x 8 blocks: keys 8 ib.., elements d0..
    for (int ib = 0; ib < 2; ++ib) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) r[i] = load_half8(kr[8 * ib + i] + d0, bf16);
      transpose8(r);
      for (int x = 0; x < 8; ++x) _mm256_storeu_ps(kt + (d0 + x) * L16 + 8 * ib, r[x]);
    }
#else
  float row[L16];
  for (int64_t i = 0; i < L16; ++i)
    for (int64_t d0 = 0; d0 < D; d0 += L16) {
      load_row(kr[i] + d0, L16, bf16, row);
      for (int64_t x = 0; x < L16; ++x) kt[(d0 + x) * L16 + i] = row[x];
    }
#endif
}

// The scores (before kq_scale) of one row q [D] against 16 keys kt [D][16]: each lane l's
// sum as dot_sgemm (chunk after chunk) or dot_vec (chunk i into accumulator i % 4, then
// (s0 + s2) + (s1 + s3)) builds it, one lane a vector over the keys; then reduce16's tree.
template <bool VEC, bool FUSED>
inline f16v scores16(const float* q, const float* kt, int64_t D) {
  f16v t[16];
  if constexpr (!VEC) {
    LLAMAY_UNROLL for (int l = 0; l < 16; ++l) t[l] = splat16(q[l]) * load16(kt + L16 * l);
    for (int64_t c = L16; c < D; c += L16)
      LLAMAY_UNROLL for (int l = 0; l < 16; ++l)
        t[l] = madd<FUSED>(t[l], splat16(q[c + l]), load16(kt + L16 * (c + l)));
  } else {
    LLAMAY_UNROLL for (int l = 0; l < 16; ++l) {
      f16v s[4];
      for (int a = 0; a < 4; ++a) s[a] = splat16(q[L16 * a + l]) * load16(kt + L16 * (L16 * a + l));
      for (int64_t i = 4; i < D / L16; i += 4)
        for (int a = 0; a < 4; ++a) {
          const int64_t d = L16 * (i + a) + l;
          s[a] = madd<FUSED>(s[a], splat16(q[d]), load16(kt + L16 * d));
        }
      t[l] = (s[0] + s[2]) + (s[1] + s[3]);
    }
  }
  f16v u[8];
  LLAMAY_UNROLL for (int l = 0; l < 8; ++l) u[l] = t[8 + l] + t[l];
  f16v w[4];
  LLAMAY_UNROLL for (int l = 0; l < 4; ++l) w[l] = u[4 + l] + u[l];
  return (w[0] + w[2]) + (w[1] + w[3]);
}

// A batch's (sgemm order) scores of RB rows (q, D apart) against KV 16-key chunks kt[kv]
// [D][16], before kq_scale, into out[r][kv]: as scores16<false>, with the work blocked so
// that each K vector serves RB rows and each q value KV chunks (scores16 loads a K vector
// and a q value for every FMA). Lanes l and l + 8 go together, summed into reduce16's
// first level at once; the other levels after, from u [RB][KV][8].
template <int RB, int KV, bool FUSED>
void scores_block(const float* q, const float* const* kt, int64_t D, f16v (*out)[KV]) {
  f16v u[RB][KV][8];
  for (int l = 0; l < 8; ++l) {
    f16v a[RB][KV], b[RB][KV];
    LLAMAY_UNROLL_ALL for (int r = 0; r < RB; ++r)
      LLAMAY_UNROLL_ALL for (int k = 0; k < KV; ++k) {
        a[r][k] = splat16(q[r * D + l]) * load16(kt[k] + L16 * l);
        b[r][k] = splat16(q[r * D + l + 8]) * load16(kt[k] + L16 * (l + 8));
      }
    for (int64_t c = L16; c < D; c += L16) {
      f16v ka[KV], kb[KV];
      LLAMAY_UNROLL_ALL for (int k = 0; k < KV; ++k) {
        ka[k] = load16(kt[k] + L16 * (c + l));
        kb[k] = load16(kt[k] + L16 * (c + l + 8));
      }
      LLAMAY_UNROLL_ALL for (int r = 0; r < RB; ++r) {
        const f16v qa = splat16(q[r * D + c + l]), qb = splat16(q[r * D + c + l + 8]);
        LLAMAY_UNROLL_ALL for (int k = 0; k < KV; ++k) {
          a[r][k] = madd<FUSED>(a[r][k], qa, ka[k]);
          b[r][k] = madd<FUSED>(b[r][k], qb, kb[k]);
        }
      }
    }
    LLAMAY_UNROLL_ALL for (int r = 0; r < RB; ++r)
      LLAMAY_UNROLL_ALL for (int k = 0; k < KV; ++k) u[r][k][l] = b[r][k] + a[r][k];
  }
  for (int r = 0; r < RB; ++r)
    for (int k = 0; k < KV; ++k) {
      f16v w[4];
      for (int l = 0; l < 4; ++l) w[l] = u[r][k][4 + l] + u[r][k][l];
      out[r][k] = (w[0] + w[2]) + (w[1] + w[3]);
    }
}

#if defined(__AVX512F__)
constexpr int SCORE_ROWS = 4;  // 2 x 4 x 2 accumulators, 4 K and 2 q registers
#else
constexpr int SCORE_ROWS = 1;
#endif

// scores_block over rows r0..r0+rb (rb <= SCORE_ROWS) and KV chunks.
template <int KV, bool FUSED, int RB = SCORE_ROWS>
void scores_rows(int64_t rb, const float* q, const float* const* kt, int64_t D, f16v (*out)[KV]) {
  if constexpr (RB > 1)
    if (rb < RB) return scores_rows<KV, FUSED, RB - 1>(rb, q, kt, D, out);
  scores_block<RB, KV, FUSED>(q, kt, D, out);
}

// P.V for a batch's RG rows (tinyBLAS's order: each lane's keys chunk after chunk) over
// the key chunks c0..c1 (vr[k * 16 + lane]: the V row of chunk c0 + k's key `lane`),
// outputs dlo..dhi 16 at a time, walking each lane's keys with every row's sum in a
// register: acc[r][lane][D]. The probabilities laid out lane by lane, pt[lane][k][r] (rows
// PV_ROWS apart), so that a step reads one line of them: P [R][W] read in this order
// missed L1 for every row at every step.
template <int RG, bool FUSED>
void pv_rows(const float* pt, int64_t n, const uint16_t* const* vr, int64_t D, int64_t dlo,
             int64_t dhi, bool vbf16, float* acc) {
  for (int64_t lane = 0; lane < L16; ++lane)
    for (int64_t d0 = dlo; d0 < dhi; d0 += L16) {
      const float* pl = pt + lane * n * PV_ROWS;
      f16v a[RG];
      LLAMAY_UNROLL_ALL for (int r = 0; r < RG; ++r) a[r] = splat16(0.0f);
      for (int64_t k = 0; k < n; ++k) {
        // this lane's keys are 16 rows apart (further in pages): the prefetchers miss them
        if (k + PV_AHEAD < n) __builtin_prefetch(vr[(k + PV_AHEAD) * L16 + lane] + d0);
        const f16v v = load_half16(vr[k * L16 + lane] + d0, vbf16);
        LLAMAY_UNROLL_ALL for (int r = 0; r < RG; ++r)
          a[r] = madd<FUSED>(a[r], splat16(pl[k * PV_ROWS + r]), v);
      }
      for (int r = 0; r < RG; ++r) store16(acc + (r * L16 + lane) * D + d0, a[r]);
    }
}

// pt[lane][k][r] = p[r * stride + k * 16 + lane] for rows r < rg (<= PV_ROWS; the rest
// of each PV_ROWS padding) and chunks k < n: pv_rows's layout.
inline void lanes_major(const float* p, int64_t stride, int64_t rg, int64_t n, float* pt) {
#if defined(__AVX512F__) && !defined(LLAMAY_SCALAR)
  static_assert(PV_ROWS == L16, "a chunk's rows x lanes are one 16 x 16 transpose");
  for (int64_t k = 0; k < n; ++k) {
    __m512 m[16];
    for (int64_t r = 0; r < L16; ++r)
      m[r] = r < rg ? _mm512_loadu_ps(p + r * stride + k * L16) : _mm512_setzero_ps();
    transpose16(m);
    for (int64_t lane = 0; lane < L16; ++lane) _mm512_storeu_ps(pt + (lane * n + k) * L16, m[lane]);
  }
#elif defined(LLAMAY_GA_AVX2)
  static_assert(PV_ROWS == 4, "a chunk's rows x 4 lanes are one 4 x 4 transpose");
  for (int64_t k = 0; k < n; ++k)
    for (int64_t l0 = 0; l0 < L16; l0 += 4) {
      __m128 m[4];
      for (int64_t r = 0; r < 4; ++r)
        m[r] = r < rg ? _mm_loadu_ps(p + r * stride + k * L16 + l0) : _mm_setzero_ps();
      _MM_TRANSPOSE4_PS(m[0], m[1], m[2], m[3]);  // m[i]: lane l0 + i of the 4 rows
      for (int64_t i = 0; i < 4; ++i) _mm_storeu_ps(pt + ((l0 + i) * n + k) * PV_ROWS, m[i]);
    }
#else
  for (int64_t r = 0; r < rg; ++r)
    for (int64_t k = 0; k < n; ++k)
      for (int64_t lane = 0; lane < L16; ++lane)
        pt[(lane * n + k) * PV_ROWS + r] = p[r * stride + k * L16 + lane];
#endif
}

template <bool FUSED, int RG = (int)PV_ROWS>
void pv_group(int64_t rg, const float* pt, int64_t n, const uint16_t* const* vr, int64_t D,
              int64_t dlo, int64_t dhi, bool vbf16, float* acc) {
  if constexpr (RG > 1)
    if (rg < RG) return pv_group<FUSED, RG - 1>(rg, pt, n, vr, D, dlo, dhi, vbf16, acc);
  pv_rows<RG, FUSED>(pt, n, vr, D, dlo, dhi, vbf16, acc);
}

// P.V for one token's RG rows (vec_dot's order: chunk c into accumulator c % 4) with the
// keys in memory order: each V row's 64-byte line of outputs e0..e0+32 read once, every
// row's sums for those outputs in memory (acc[r][c % 4][lane][32], RG x 8 KB), then reduced
// into out[r] (null: a row that sees no key). The register form above walks each lane's
// keys, a new line 16 rows away every step, which a few rows' work per step cannot hide.
template <int RG, bool FUSED>
void pv_stream(const float* p, int64_t stride, int64_t base, int64_t c0, int64_t c1,
               const uint16_t* const* vrows, int64_t dlo, int64_t dhi, bool vbf16,
               float* acc, float* const* out) {
  constexpr int64_t E = 2 * L16;
  for (int64_t e0 = dlo; e0 < dhi; e0 += E) {
    const int64_t e1 = std::min(dhi, e0 + E);
    std::fill(acc, acc + RG * 4 * L16 * E, 0.0f);
    for (int64_t c = c0; c <= c1; ++c)
      for (int64_t lane = 0; lane < L16; ++lane) {
        const int64_t j = c * L16 + lane - base;
        if (c < c1) __builtin_prefetch(vrows[j + L16] + e0);
        f16v pb[RG];
        LLAMAY_UNROLL_ALL for (int r = 0; r < RG; ++r) pb[r] = splat16(p[r * stride + j]);
        float* a0 = acc + (c % 4 * L16 + lane) * E;
        for (int64_t d0 = e0; d0 < e1; d0 += L16) {
          const f16v v = load_half16(vrows[j] + d0, vbf16);
          LLAMAY_UNROLL_ALL for (int r = 0; r < RG; ++r) {
            float* a = a0 + r * 4 * L16 * E + (d0 - e0);
            store16(a, madd<FUSED>(load16(a), pb[r], v));
          }
        }
      }
    for (int r = 0; r < RG; ++r)
      if (out[r]) reduce_lanes(acc + r * 4 * L16 * E, 4, E, out[r] + e0, 0, e1 - e0);
  }
}

template <bool FUSED, int RG = (int)STREAM_ROWS>
void pv_stream_group(int64_t rg, const float* p, int64_t stride, int64_t base, int64_t c0,
                     int64_t c1, const uint16_t* const* vrows, int64_t dlo, int64_t dhi,
                     bool vbf16, float* acc, float* const* out) {
  if constexpr (RG > 1)
    if (rg < RG)
      return pv_stream_group<FUSED, RG - 1>(rg, p, stride, base, c0, c1, vrows, dlo, dhi, vbf16, acc, out);
  pv_stream<RG, FUSED>(p, stride, base, c0, c1, vrows, dlo, dhi, vbf16, acc, out);
}

// One tile: tokens t0..t1-1 of row b, kv head kh; rows r = (t - t0) * G + g. Its keys:
// the 16-chunks C0..C1 covering the rows' visible keys (base = C0 * 16, W keys).
struct Tile {
  int64_t b, kh, t0, t1, R, C0, C1, base, W;
  std::vector<int64_t> j0, j1;  // each row's visible keys (j1 < j0: none)
  std::vector<float> q, s;      // q [R][D] rounded to f16; scores, then p [R][W]
  std::vector<const uint16_t*> vrows;  // [W]: key base + j's V row
  bool seen(int64_t r) const { return j1[r] >= j0[r]; }
};

inline float* tile_out(const Problem& p, const Tile& tl, int64_t r) {
  return p.out + ((tl.b * p.T + tl.t0 + r / p.G) * p.H + tl.kh * p.G + r % p.G) * p.D;
}

// The tile's rows and keys, q rounded to f16 (scaled first if prescaled); rows without a
// visible key get their zero output here. False: no row sees a key.
bool tile_setup(const Problem& p, int64_t b, int64_t t0, int64_t t1, int64_t kh, Tile& tl) {
  const int64_t D = p.D, G = p.G, R = (t1 - t0) * G;
  tl.b = b, tl.kh = kh, tl.t0 = t0, tl.t1 = t1, tl.R = R;
  tl.j0.resize(R);
  tl.j1.resize(R);
  int64_t J0 = p.S, J1 = -1;
  for (int64_t t = t0; t < t1; ++t) {
    int64_t j0, j1;
    visible(p, b, t, j0, j1);
    for (int64_t g = 0; g < G; ++g) tl.j0[(t - t0) * G + g] = j0, tl.j1[(t - t0) * G + g] = j1;
    if (j1 >= j0) J0 = std::min(J0, j0), J1 = std::max(J1, j1);
  }
  for (int64_t r = 0; r < R; ++r)  // p = 0 everywhere: a zero output
    if (!tl.seen(r)) std::fill(tile_out(p, tl, r), tile_out(p, tl, r) + D, 0.0f);
  if (J1 < J0) return false;
  tl.C0 = J0 / L16, tl.C1 = J1 / L16, tl.base = tl.C0 * L16, tl.W = (tl.C1 - tl.C0 + 1) * L16;
  tl.q.resize(R * D);
  for (int64_t t = t0; t < t1; ++t) {
    const float* qsrc = p.q + ((b * p.T + t) * p.H + kh * G) * D;
    float* qd = tl.q.data() + (t - t0) * G * D;
    for (int64_t x = 0; x < G * D; ++x) qd[x] = round_f16(p.prescaled ? qsrc[x] * p.kq_scale : qsrc[x]);
  }
  tl.s.resize(R * tl.W);
  tl.vrows.resize(tl.W);
  return true;
}

struct TileScratch {
  std::vector<float> kt, acc, sums, h, l, pt;
  std::vector<const uint16_t*> kr;
};

// Scores s[r][j - base] over the chunks c0..c1 (K's 16 rows of a chunk converted and
// transposed once for every row), and those chunks' V rows.
template <bool VEC>
void tile_scores(const Problem& p, Tile& tl, int64_t c0, int64_t c1, TileScratch& sc) {
  ScopedFtz ftz;
  const int64_t D = p.D;
  constexpr int64_t KV = VEC ? 1 : 2;  // chunks a step (a batch: scores_block's)
  sc.kt.resize(KV * D * L16);
  sc.kr.resize(2 * KV * L16);
  const f16v scale = splat16(p.prescaled ? 1.0f : p.kq_scale);
  const auto rows = [&](int64_t c, const uint16_t** kr) {
    for (int64_t i = 0; i < KV * L16 && c + i / L16 <= c1; ++i)  // chunks past c1 not read
      kr[i] = row_of(p, p.k, tl.b, c * L16 + i, tl.kh);
  };
  const auto sees = [&](int64_t r, int64_t c) {
    return tl.seen(r) && c >= tl.j0[r] / L16 && c <= tl.j1[r] / L16;
  };
  rows(c0, sc.kr.data());
  for (int64_t c = c0; c <= c1; c += KV) {
    const int64_t kv = std::min(KV, c1 - c + 1);
    const uint16_t** kr = sc.kr.data() + (c - c0) / KV % 2 * KV * L16;
    if (c + KV <= c1) {
      const uint16_t** next = sc.kr.data() + ((c - c0) / KV + 1) % 2 * KV * L16;
      rows(c + KV, next);
      // one token: the next chunk's K rows requested now (a step's few rows hide no
      // latency; a batch's work between chunks does, and a burst of prefetches stalls it)
      if (VEC)
        for (int64_t i = 0; i < L16; ++i)
          for (int64_t d = 0; d < D; d += 32) __builtin_prefetch(next[i] + d);
    }
    for (int64_t i = 0; i < kv * L16; ++i)
      tl.vrows[(c - tl.C0) * L16 + i] = row_of(p, p.v, tl.b, c * L16 + i, tl.kh);
    const float* kt[KV];
    for (int64_t k = 0; k < kv; ++k) {
      kt[k] = sc.kt.data() + k * D * L16;
      transpose_keys(kr + k * L16, D, p.kbf16, sc.kt.data() + k * D * L16);
    }
    const auto put = [&](int64_t r, int64_t k, f16v dot) {
      if (sees(r, c + k)) store16(tl.s.data() + r * tl.W + (c + k - tl.C0) * L16, dot * scale);
    };
    if constexpr (VEC) {
      for (int64_t r = 0; r < tl.R; ++r)
        if (sees(r, c))
          put(r, 0, p.kbf16 ? scores16<true, false>(tl.q.data() + r * D, kt[0], D)
                            : scores16<true, true>(tl.q.data() + r * D, kt[0], D));
      continue;
    }
    for (int64_t r0 = 0; r0 < tl.R; r0 += SCORE_ROWS) {
      const int64_t rb = std::min<int64_t>(SCORE_ROWS, tl.R - r0);
      bool any = false;
      for (int64_t r = r0; r < r0 + rb; ++r)
        for (int64_t k = 0; k < kv; ++k) any |= sees(r, c + k);
      if (!any) continue;
      const float* q = tl.q.data() + r0 * D;
      if (kv == 2) {
        f16v out[SCORE_ROWS][2];
        if (p.kbf16) scores_rows<2, false>(rb, q, kt, D, out);
        else scores_rows<2, true>(rb, q, kt, D, out);
        for (int64_t r = 0; r < rb; ++r) put(r0 + r, 0, out[r][0]), put(r0 + r, 1, out[r][1]);
      } else {
        f16v out[SCORE_ROWS][1];
        if (p.kbf16) scores_rows<1, false>(rb, q, kt, D, out);
        else scores_rows<1, true>(rb, q, kt, D, out);
        for (int64_t r = 0; r < rb; ++r) put(r0 + r, 0, out[r][0]);
      }
    }
  }
}

// Row r's probabilities, zero for the keys it does not see.
void tile_softmax(const Problem& p, Tile& tl, int64_t r, TileScratch& sc) {
  ScopedFtz ftz;
  float* x = tl.s.data() + r * tl.W;
  if (!tl.seen(r)) {
    std::fill(x, x + tl.W, 0.0f);
    return;
  }
  softmax_row(x, tl.base, tl.j0[r], tl.j1[r], p.S / L16, sc.sums, sc.h, sc.l);
  std::fill(x, x + (tl.j0[r] / L16 - tl.C0) * L16, 0.0f);
  std::fill(x + (tl.j1[r] / L16 + 1 - tl.C0) * L16, x + tl.W, 0.0f);
}

// P.V for outputs dlo..dhi of every row, in groups of rows, each over its rows' chunks.
template <bool VEC>
void tile_pv(const Problem& p, const Tile& tl, int64_t dlo, int64_t dhi, TileScratch& sc) {
  ScopedFtz ftz;
  constexpr int64_t NA = VEC ? 4 : 1, RG = VEC ? STREAM_ROWS : PV_ROWS;
  const int64_t D = p.D;
  sc.acc.resize(RG * NA * L16 * D);
  for (int64_t r0 = 0; r0 < tl.R; r0 += RG) {
    const int64_t rg = std::min(RG, tl.R - r0);
    int64_t g0 = tl.C1, g1 = tl.C0 - 1;
    for (int64_t r = r0; r < r0 + rg; ++r)
      if (tl.seen(r)) g0 = std::min(g0, tl.j0[r] / L16), g1 = std::max(g1, tl.j1[r] / L16);
    if (g1 < g0) continue;
    const float* pr = tl.s.data() + r0 * tl.W;
    const auto vr = tl.vrows.data();
    float* acc = sc.acc.data();
    if (VEC) {
      float* out[STREAM_ROWS];
      for (int64_t r = r0; r < r0 + rg; ++r) out[r - r0] = tl.seen(r) ? tile_out(p, tl, r) : nullptr;
      if (p.vbf16) pv_stream_group<false>(rg, pr, tl.W, tl.base, g0, g1, vr, dlo, dhi, true, acc, out);
      else pv_stream_group<true>(rg, pr, tl.W, tl.base, g0, g1, vr, dlo, dhi, false, acc, out);
      continue;
    }
    const int64_t n = g1 - g0 + 1, off = g0 * L16 - tl.base;
    sc.pt.resize(L16 * n * PV_ROWS);
    lanes_major(pr + off, tl.W, rg, n, sc.pt.data());
    if (p.vbf16) pv_group<false>(rg, sc.pt.data(), n, vr + off, D, dlo, dhi, true, acc);
    else pv_group<true>(rg, sc.pt.data(), n, vr + off, D, dlo, dhi, false, acc);
    for (int64_t r = r0; r < r0 + rg; ++r)
      if (tl.seen(r))
        reduce_lanes(sc.acc.data() + (r - r0) * NA * L16 * D, NA, D, tile_out(p, tl, r), dlo, dhi);
  }
}

// The tiles: a kv head's blocks of TB tokens (TB x G ~ TILE_ROWS rows), adjacent in the
// order so that the threads share that head's keys. Many tiles: one task each. Fewer than
// twice the threads (decoding a row or few): each stage split over the threads -- the
// scores by key ranges, the softmax by rows, P.V by 16 outputs (every lane's sums and
// their reduction are elementwise in d) -- in three passes.
template <bool VEC>
void run_tiles(xla::ffi::ThreadPool& pool, const Problem& p) {
  const int64_t TB = std::max<int64_t>(1, TILE_ROWS / p.G), nb = (p.T + TB - 1) / TB;
  const int64_t n = p.B * p.K * nb, threads = std::max<int64_t>(1, pool.num_threads());
  const auto bounds = [&](int64_t i, int64_t& b, int64_t& kh, int64_t& t0, int64_t& t1) {
    b = i / (p.K * nb), kh = i / nb % p.K, t0 = i % nb * TB, t1 = std::min(p.T, t0 + TB);
  };
  if (n >= 2 * threads) {
    parallel_for(pool, n, [&](int64_t i) {
      thread_local Tile tl;
      thread_local TileScratch sc;
      int64_t b, kh, t0, t1;
      bounds(i, b, kh, t0, t1);
      if (!tile_setup(p, b, t0, t1, kh, tl)) return;
      tile_scores<VEC>(p, tl, tl.C0, tl.C1, sc);
      for (int64_t r = 0; r < tl.R; ++r) tile_softmax(p, tl, r, sc);
      tile_pv<VEC>(p, tl, 0, p.D, sc);
    });
    return;
  }
  // the calling thread's tiles, kept between calls: a decode step's scores (R x W floats
  // a tile) are not allocated and zeroed anew every layer of every step. (Named through
  // references: in the tasks below a thread_local's name would be the helper thread's.)
  thread_local std::vector<Tile> kept_tiles;
  thread_local std::vector<int64_t> kept_live;
  std::vector<Tile>& tiles = kept_tiles;
  std::vector<int64_t>& live = kept_live;
  if ((int64_t)tiles.size() < n) tiles.resize(n);
  live.clear();
  for (int64_t i = 0; i < n; ++i) {
    int64_t b, kh, t0, t1;
    bounds(i, b, kh, t0, t1);
    if (tile_setup(p, b, t0, t1, kh, tiles[i])) live.push_back(i);
  }
  const int64_t nl = live.size();
  if (nl == 0) return;
  const int64_t parts = (4 * threads + nl - 1) / nl;  // key ranges a tile
  parallel_for(pool, nl * parts, [&](int64_t i) {
    thread_local TileScratch sc;
    Tile& tl = tiles[live[i / parts]];
    const int64_t nc = tl.C1 - tl.C0 + 1, part = i % parts;
    const int64_t c0 = tl.C0 + nc * part / parts, c1 = tl.C0 + nc * (part + 1) / parts - 1;
    if (c1 >= c0) tile_scores<VEC>(p, tl, c0, c1, sc);
  });
  int64_t R = 0;  // rows a tile, at most (the last block of tokens may have fewer)
  for (int64_t i : live) R = std::max(R, tiles[i].R);
  parallel_for(pool, nl * R, [&](int64_t i) {
    thread_local TileScratch sc;
    Tile& tl = tiles[live[i / R]];
    if (i % R < tl.R) tile_softmax(p, tl, i % R, sc);
  });
  const int64_t dstep = VEC ? 2 * L16 : L16, nd = p.D / dstep;  // one token: whole lines
  parallel_for(pool, nl * nd, [&](int64_t i) {
    thread_local TileScratch sc;
    const int64_t d0 = i % nd * dstep;
    tile_pv<VEC>(p, tiles[live[i / nd]], d0, d0 + dstep, sc);
  });
}

ffi::Error GgmlAttention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::AnyBuffer k,
                         ffi::AnyBuffer v, ffi::BufferR0<ffi::S32> layer,
                         ffi::Buffer<ffi::S32> table, ffi::Buffer<ffi::S32> qpos,
                         ffi::BufferR0<ffi::S32> window, ffi::ResultBuffer<ffi::F32> out,
                         float kq_scale, int32_t prescaled, int32_t causal, int32_t paged) {
  Problem p;
  if (ffi::Error e = read_problem("LlamayGgmlAttention", q, k, v, layer, table, qpos, window,
                                  out, kq_scale, prescaled, causal, paged, p);
      e.failure())
    return e;
  const int64_t n = p.B * p.T * p.K;
  if (n == 0 || p.D == 0) return ffi::Error::Success();
  const bool vec = p.T == 1;  // one token: ggml_vec_dot_f16's order; more: tinyBLAS's
  if (p.D % (vec ? 64 : L16) == 0) {
    if (vec) run_tiles<true>(pool, p);
    else run_tiles<false>(pool, p);
    return ffi::Error::Success();
  }
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
