// Paged attention over the KV pool, read in place through the page tables (exact
// numerics): the reference is `kernels_pallas.paged_attention.paged_attention_reference`
// (gather each row's pages into a dense view, then `attention_reference`); this kernel
// computes the same thing without the gathered copy.
//
// Operands: q f32 [B, T, H, D]; the K and V pools, each f32, f16 or bf16 [..., D] or a
// quantised KV type (uint8 [..., D/32 * block bytes]: rows of Q8_0, Q5_1, Q5_0, Q4_1 or
// Q4_0 blocks, told apart by their bytes a block; read through `Pool` below), K and V
// of independent types, one layer's pages [P, ps, K, row] or the pool [L, P, ps, K, row]
// with `layer` (an s32 scalar: the layer scan hands the whole pool, not a copied-out
// slice); the page tables s32 [B, M] (entry m: the page holding positions
// m*ps .. m*ps+ps-1); q_pos s32 [B, T]; the window (s32
// scalar, <= 0: global). Attributes: scale, softcap (0: none). Result f32 [B, T, H, D].
//
// Tasks: a block of query tokens of one row (a decode step: its one token; a prefill or
// verify chunk: blocks of at most QUERY_HEADS_PER_BLOCK query heads) times a page-aligned
// chunk of the keys the block can see (key j visible from position i iff j <= i and,
// with a window w > 0, i - j < w), so that one row decoding still spreads over XLA's
// threads (parallel.h). A task reads its pages' rows in memory order, every kv head
// (GQA: the G query heads of a kv head share its rows), computes the scores (scaled,
// then softcapped, as the reference), and keeps per query head the chunk's max m, the
// sum l of exp(score - m) and the sum of exp(score - m) * value; the chunks of a block
// are then merged (flash-decoding's split-K). Only the order of the f32 roundings
// differs from the reference (1e-5 relative), and the two cases whose outputs are
// unused: a query that sees no key gives 0, where the reference gives NaN, and a query
// at a position outside [0, M*ps) -- padding -- gives 0.
//
// Blocks of TILED_MIN_TOKENS tokens or more (prefill chunks, longer verify chunks; D a
// multiple of 16) take the tiles further down instead: flash attention per row, kv head
// and block of tokens, the query rows innermost (see "Long query blocks").
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "blocks.h"
#include "parallel.h"
#include "vec16.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace llamay {
namespace {

constexpr int64_t LANES = 16;
constexpr int64_t QUERY_HEADS_PER_BLOCK = 64;  // query heads (tokens x heads) per block
constexpr int64_t GEMM_QUERIES = 8;  // query heads per kv head from which keys go transposed
constexpr int64_t KEYS = 16;         // keys per transposed tile

#if defined(__AVX512F__) && !defined(LLAMAY_SCALAR)
inline float dot(const float* a, const float* b, int64_t d) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= d; i += 32) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), acc1);
  }
  for (; i + 16 <= d; i += 16)
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
  float s = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
  for (; i < d; ++i) s += a[i] * b[i];
  return s;
}
#elif defined(__AVX2__) && defined(__FMA__) && !defined(LLAMAY_SCALAR)
inline float dot(const float* a, const float* b, int64_t d) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= d; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= d; i += 8)
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  __m256 v = _mm256_add_ps(acc0, acc1);
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  float s = _mm_cvtss_f32(h);
  for (; i < d; ++i) s += a[i] * b[i];
  return s;
}
#else
inline float dot(const float* a, const float* b, int64_t d) {
  float acc[LANES] = {0};
  int64_t i = 0;
  for (; i + LANES <= d; i += LANES)
    for (int64_t l = 0; l < LANES; ++l) acc[l] += a[i + l] * b[i + l];
  float s = 0.0f;
  for (; i < d; ++i) s += a[i] * b[i];
  for (int64_t w = LANES / 2; w >= 1; w /= 2)
    for (int64_t l = 0; l < w; ++l) acc[l] += acc[l + w];
  return s + acc[0];
}
#endif

// out[c] = exp(x[c] - mx), 0 where x[c] is -inf; returns the sum of out. AVX-512 / AVX2:
// Cephes' expf (range reduction by ln 2 in two parts, degree-5 polynomial: within 2 ulp
// of std::exp), 16 / 8 lanes at a time.
inline float exp_shifted(const float* x, float mx, float* out, int64_t n) {
  const float NEG = -std::numeric_limits<float>::infinity();
  int64_t c = 0;
  float sum = 0.0f;
#if defined(__AVX512F__) && !defined(LLAMAY_SCALAR)
  const __m512 vmx = _mm512_set1_ps(mx), vneg = _mm512_set1_ps(NEG);
  __m512 vsum = _mm512_setzero_ps();
  for (; c + 16 <= n; c += 16) {
    const __m512 xv = _mm512_loadu_ps(x + c);
    const __mmask16 live = _mm512_cmp_ps_mask(xv, vneg, _CMP_NEQ_OQ);
    __m512 v = _mm512_max_ps(_mm512_sub_ps(xv, vmx), _mm512_set1_ps(-87.0f));
    __m512 fx = _mm512_roundscale_ps(
        _mm512_fmadd_ps(v, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    v = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), v);
    v = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), v);
    __m512 y = _mm512_set1_ps(1.9875691500E-4f);
    y = _mm512_fmadd_ps(y, v, _mm512_set1_ps(1.3981999507E-3f));
    y = _mm512_fmadd_ps(y, v, _mm512_set1_ps(8.3334519073E-3f));
    y = _mm512_fmadd_ps(y, v, _mm512_set1_ps(4.1665795894E-2f));
    y = _mm512_fmadd_ps(y, v, _mm512_set1_ps(1.6666665459E-1f));
    y = _mm512_fmadd_ps(y, v, _mm512_set1_ps(5.0000001201E-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(v, v), _mm512_add_ps(v, _mm512_set1_ps(1.0f)));
    const __m512i e = _mm512_slli_epi32(
        _mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127)), 23);
    y = _mm512_maskz_mul_ps(live, y, _mm512_castsi512_ps(e));
    _mm512_storeu_ps(out + c, y);
    vsum = _mm512_add_ps(vsum, y);
  }
  sum = _mm512_reduce_add_ps(vsum);
#elif defined(__AVX2__) && defined(__FMA__) && !defined(LLAMAY_SCALAR)
  // the same steps, 8 lanes at a time
  const __m256 vmx = _mm256_set1_ps(mx), vneg = _mm256_set1_ps(NEG);
  __m256 vsum = _mm256_setzero_ps();
  for (; c + 8 <= n; c += 8) {
    const __m256 xv = _mm256_loadu_ps(x + c);
    const __m256 live = _mm256_cmp_ps(xv, vneg, _CMP_NEQ_OQ);
    __m256 v = _mm256_max_ps(_mm256_sub_ps(xv, vmx), _mm256_set1_ps(-87.0f));
    __m256 fx = _mm256_floor_ps(
        _mm256_fmadd_ps(v, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    v = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), v);
    v = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), v);
    __m256 y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, v, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, v, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, v, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, v, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, v, _mm256_set1_ps(5.0000001201E-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(v, v), _mm256_add_ps(v, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    y = _mm256_and_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(e)), live);
    _mm256_storeu_ps(out + c, y);
    vsum = _mm256_add_ps(vsum, y);
  }
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(vsum), _mm256_extractf128_ps(vsum, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  sum = _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
#endif
  for (; c < n; ++c) {
    out[c] = x[c] == NEG ? 0.0f : std::exp(x[c] - mx);
    sum += out[c];
  }
  return sum;
}

#if defined(__AVX2__) && defined(__FMA__) && !defined(LLAMAY_SCALAR)
#define LLAMAY_PA_DECODE8 1
// Decoding (a few query heads per kv head): the scores of one query against 8 keys at a
// time, and the weighted sum of value rows with the output in registers -- rather than
// one horizontal sum per (query, key) and an accumulator in memory per (query, key).
// AVX2 (on AVX-512 hosts too); d a multiple of 8.

// (a · rows[c] for c < 8), a and each row d floats
inline __m256 dot8(const float* a, const float* const* rows, int64_t d) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0, s7 = s0;
  for (int64_t i = 0; i < d; i += 8) {
    const __m256 x = _mm256_loadu_ps(a + i);
    s0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(rows[0] + i), s0);
    s1 = _mm256_fmadd_ps(x, _mm256_loadu_ps(rows[1] + i), s1);
    s2 = _mm256_fmadd_ps(x, _mm256_loadu_ps(rows[2] + i), s2);
    s3 = _mm256_fmadd_ps(x, _mm256_loadu_ps(rows[3] + i), s3);
    s4 = _mm256_fmadd_ps(x, _mm256_loadu_ps(rows[4] + i), s4);
    s5 = _mm256_fmadd_ps(x, _mm256_loadu_ps(rows[5] + i), s5);
    s6 = _mm256_fmadd_ps(x, _mm256_loadu_ps(rows[6] + i), s6);
    s7 = _mm256_fmadd_ps(x, _mm256_loadu_ps(rows[7] + i), s7);
  }
  // pairwise: u0 = (lanes 0-3 of s0..s3 | lanes 4-7 of s0..s3), u1 the same of s4..s7
  const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(s0, s1), _mm256_hadd_ps(s2, s3));
  const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(s4, s5), _mm256_hadd_ps(s6, s7));
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// Every cache line of a row of d floats, ahead of its use (the pools stream from memory)
inline void prefetch_row(const float* row, int64_t d) {
  for (int64_t i = 0; i < d; i += 16) __builtin_prefetch(row + i, 0, 3);
}

// out[off .. off + 8R) += sum over j < n of w[j] * rows[j][off ..], skipping w[j] == 0
template <int R>
inline void weighted_rows_r(const float* w, const float* const* rows, int64_t n, int64_t off, float* out) {
  __m256 a[R];
  for (int i = 0; i < R; ++i) a[i] = _mm256_loadu_ps(out + off + 8 * i);
  for (int64_t j = 0; j < n; ++j) {
    if (w[j] == 0.0f) continue;
    if (off == 0 && j + 8 < n) prefetch_row(rows[j + 8], 8 * R);
    const __m256 wj = _mm256_set1_ps(w[j]);
    const float* v = rows[j] + off;
    for (int i = 0; i < R; ++i) a[i] = _mm256_fmadd_ps(wj, _mm256_loadu_ps(v + 8 * i), a[i]);
  }
  for (int i = 0; i < R; ++i) _mm256_storeu_ps(out + off + 8 * i, a[i]);
}

inline void weighted_rows(const float* w, const float* const* rows, int64_t n, int64_t d, float* out) {
  int64_t off = 0;
  for (; off + 64 <= d; off += 64) weighted_rows_r<8>(w, rows, n, off, out);
  for (; off + 32 <= d; off += 32) weighted_rows_r<4>(w, rows, n, off, out);
  for (; off < d; off += 8) weighted_rows_r<1>(w, rows, n, off, out);
}
#endif

// One key or value row of a pool as f32. A pool is f32 (the row itself), f16 or bf16
// (converted into `buf`), or rows of GGUF blocks of a 32-element type (Q8_0, Q5_1, Q5_0,
// Q4_1, Q4_0: llamay.kv.types), each block decoded in registers (its quants widened to
// f32, times the f16 scale d, plus the _1 types' m) into `buf`: the values of
// llamay.quant's dequantisation bit for bit (d·q is exact in f32, the one rounding is
// the + m, which an FMA rounds the same way).
struct Pool {
  const uint8_t* base;  // this layer's rows
  int32_t type;         // GGML type (blocks.h)
  int64_t row_bytes;
};

#if !defined(LLAMAY_SCALAR) && (defined(__AVX512F__) || defined(__AVX2__))
#define LLAMAY_PA_VECTOR 1

// The 32 values of one block of type T (a 32-element type) into out[0..31].
template <int32_t T>
inline void block32(const uint8_t* b, float* out) {
  const float d = rdf16(b);
  i16v lo, hi;
  float m = 0.0f;
  if constexpr (T == Q8_0) {
    lo = wide_s8(b + 2);
    hi = wide_s8(b + 18);
  } else if constexpr (T == Q4_0 || T == Q4_1) {
    const int off = T == Q4_1 ? 4 : 2;
    if constexpr (T == Q4_1) m = rdf16(b + 2);
    const i16v v = wide_u8(b + off);
    lo = v & 0xF;
    hi = v >> 4;
    if constexpr (T == Q4_0) lo -= 8, hi -= 8;
  } else {  // Q5_0, Q5_1
    const int off = T == Q5_1 ? 4 : 2;
    if constexpr (T == Q5_1) m = rdf16(b + 2);
    uint32_t qh;
    std::memcpy(&qh, b + off, 4);
    const i16v v = wide_u8(b + off + 4), h = (i16v){} + (int32_t)qh;
    lo = (v & 0xF) | (((h >> LANE16) & 1) << 4);
    hi = (v >> 4) | (((h >> (LANE16 + 16)) & 1) << 4);
    if constexpr (T == Q5_0) lo -= 16, hi -= 16;
  }
  if constexpr (T == Q4_1 || T == Q5_1) {
    store16(out, d * to_f(lo) + m);
    store16(out + 16, d * to_f(hi) + m);
  } else {
    store16(out, d * to_f(lo));
    store16(out + 16, d * to_f(hi));
  }
}

template <int32_t T>
inline void blocks_row(const uint8_t* row, int64_t d, float* buf) {
  constexpr int64_t BB = T == Q8_0 ? 34 : T == Q5_1 ? 24 : T == Q5_0 ? 22 : T == Q4_1 ? 20 : 18;
  for (int64_t i = 0; i < d / 32; ++i) block32<T>(row + i * BB, buf + 32 * i);
}
#endif

inline const float* row_f32(const Pool& pool, int64_t index, int64_t d, float* buf) {
  const uint8_t* row = pool.base + index * pool.row_bytes;
  switch (pool.type) {
    case F32: return reinterpret_cast<const float*>(row);
    case F16: case BF16: break;
#if defined(LLAMAY_PA_VECTOR)
    case Q8_0: blocks_row<Q8_0>(row, d, buf); return buf;
    case Q4_0: blocks_row<Q4_0>(row, d, buf); return buf;
    case Q4_1: blocks_row<Q4_1>(row, d, buf); return buf;
    case Q5_0: blocks_row<Q5_0>(row, d, buf); return buf;
    case Q5_1: blocks_row<Q5_1>(row, d, buf); return buf;
#endif
    default: dequant_row(pool.type, row, buf, d); return buf;  // blocks.h, scalar
  }
  const uint16_t* h = reinterpret_cast<const uint16_t*>(row);
  int64_t i = 0;
#if defined(__AVX512F__) && !defined(LLAMAY_SCALAR)
  if (pool.type == F16) {
    for (; i + 16 <= d; i += 16)
      _mm512_storeu_ps(buf + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + i))));
  } else {
    for (; i + 16 <= d; i += 16) {
      const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + i)));
      _mm512_storeu_ps(buf + i, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
    }
  }
#endif
  if (pool.type == F16)
    for (; i < d; ++i) buf[i] = f16_to_f32(h[i]);
  else
    for (; i < d; ++i) buf[i] = bf16_to_f32(h[i]);
  return buf;
}

inline bool pool_f32(const Pool& pool) { return pool.type == F32; }

struct Problem {
  const float* q;
  Pool k, v;  // this layer's pages [P, ps, K, row]
  const int32_t* table;
  const int32_t* qpos;
  float* out;
  int64_t B, T, H, D, K, G, P, ps, M;
  int32_t window;
  float scale, softcap;
};

// Keys per chunk granule: chunks of a block's keys start at multiples of min(ps, this).
constexpr int64_t CHUNK_GRANULE = 16;

// A block of query tokens t0..t1-1 of row b: the keys any of them sees, j0..hi (hi < 0:
// none), split into `n_chunks` page-aligned chunks, one task each.
struct Block {
  int64_t b, t0, t1, j0, hi;
};

Block block_of(const Problem& p, int64_t b, int64_t t0, int64_t t1) {
  const int64_t S = p.M * p.ps;
  int64_t lo = S, hi = -1;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t i = p.qpos[b * p.T + t];
    if (i < 0 || i >= S) continue;
    lo = std::min(lo, i);
    hi = std::max(hi, i);
  }
  const int64_t j0 = hi < 0 ? 0 : p.window > 0 ? std::max<int64_t>(lo - p.window + 1, 0) : 0;
  return Block{b, t0, t1, j0, hi};
}

// Keys k0..k1 of a block (every kv head: the pool's rows are read in memory order):
// per query head r of the block, the running max m[r] of its visible scores, l[r] the
// sum of exp(score - m[r]) and acc[r] [D] the sum of exp(score - m[r]) * value.
void chunk(const Problem& p, const Block& blk, int64_t k0, int64_t k1, float* m, float* l,
           float* acc) {
  const int64_t D = p.D, G = p.G, H = p.H, S = p.M * p.ps;
  const int64_t nt = blk.t1 - blk.t0, nq = nt * H, n = k1 - k0 + 1;
  const float NEG = -std::numeric_limits<float>::infinity();
  std::fill(m, m + nq, NEG);
  std::fill(l, l + nq, 0.0f);
  std::fill(acc, acc + nq * D, 0.0f);
  if (n <= 0) return;
  std::vector<float> scores(nq * n, NEG), kbuf(D), vbuf(D);
  std::vector<int64_t> pos(nt);
  for (int64_t t = 0; t < nt; ++t) pos[t] = p.qpos[blk.b * p.T + blk.t0 + t];
  const float* q = p.q + (blk.b * p.T + blk.t0) * H * D;  // [nt, H, D]: query head r at r*D
  const int32_t* table = p.table + blk.b * p.M;
  // f(j, row): every key k0..k1 and its first row (kv head 0) in the pool, page by page
  auto walk = [&](auto&& f) {
    for (int64_t pg = k0 / p.ps; pg <= k1 / p.ps; ++pg) {
      int64_t page = table[pg];
      page = std::min<int64_t>(std::max<int64_t>(page, 0), p.P - 1);  // as a jnp gather clamps
      const int64_t first = std::max(k0, pg * p.ps), last = std::min(k1, pg * p.ps + p.ps - 1);
      for (int64_t j = first; j <= last; ++j) f(j, (page * p.ps + j - pg * p.ps) * p.K);
    }
  };
  auto sees = [&](int64_t t, int64_t j) {
    const int64_t i = pos[t];
    return i >= 0 && i < S && j <= i && (p.window <= 0 || i - j < p.window);
  };
  auto score = [&](float sc) {
    sc *= p.scale;
    return p.softcap != 0.0f ? p.softcap * std::tanh(sc / p.softcap) : sc;
  };
  const bool decode = nt * G < GEMM_QUERIES;
#if defined(LLAMAY_PA_DECODE8)
  const bool decode8 = decode && D % 8 == 0;
  // decode8: the chunk's rows of a pool, every kv head's (in place for f32, else decoded
  // into conv), kv head kh's at kh * (n + 8), 8 pointers of padding past each head's end
  // (their dots are computed, unused). The keys are then taken 8 (scores) or 64 (values)
  // at a time across all kv heads, so the pool streams in memory order (a key's rows of
  // every head are adjacent) rather than once per head with the others' rows skipped.
  const int64_t stride = n + 8;
  std::vector<const float*> rows(decode8 ? p.K * stride : 0);
  std::vector<float> conv;
  auto rows_of = [&](const Pool& pool) {
    if (pool.type != F32) conv.resize(p.K * n * D);
    walk([&](int64_t j, int64_t row) {
      for (int64_t kh = 0; kh < p.K; ++kh)
        rows[kh * stride + j - k0] = row_f32(
            pool, row + kh, D, pool.type == F32 ? nullptr : conv.data() + ((j - k0) * p.K + kh) * D);
    });
    for (int64_t kh = 0; kh < p.K; ++kh)
      std::fill(rows.begin() + kh * stride + n, rows.begin() + (kh + 1) * stride, rows[kh * stride]);
  };
#else
  constexpr bool decode8 = false;
#endif
  if (decode8) {
#if defined(LLAMAY_PA_DECODE8)
    rows_of(p.k);
    for (int64_t c0 = 0; c0 < n; c0 += 8)
      for (int64_t kh = 0; kh < p.K; ++kh) {
        const float* const* kr = rows.data() + kh * stride;
        if (pool_f32(p.k)) for (int64_t c = c0 + 8; c < std::min(n, c0 + 16); ++c) prefetch_row(kr[c], D);
        for (int64_t t = 0; t < nt; ++t) {
          const int64_t i = pos[t];  // it sees keys max(i - w + 1, 0)..i (valid i)
          if (i < 0 || i >= S || i < k0 + c0 || (p.window > 0 && i - p.window + 1 > k0 + c0 + 7)) continue;
          for (int64_t g = 0; g < G; ++g) {
            const int64_t r = t * H + kh * G + g;
            alignas(32) float s8[8];
            _mm256_store_ps(s8, dot8(q + r * D, kr + c0, D));
            for (int64_t c = c0; c < std::min(n, c0 + 8); ++c)
              if (sees(t, k0 + c)) scores[r * n + c] = score(s8[c - c0]);
          }
        }
      }
#endif
  } else if (decode) {  // one dot per visible (query, key)
    walk([&](int64_t j, int64_t row) {
      for (int64_t kh = 0; kh < p.K; ++kh) {
        const float* kr = nullptr;
        for (int64_t t = 0; t < nt; ++t) {
          if (!sees(t, j)) continue;
          if (!kr) kr = row_f32(p.k, row + kh, D, kbuf.data());
          for (int64_t g = 0; g < G; ++g) {
            const int64_t r = t * H + kh * G + g;
            scores[r * n + (j - k0)] = score(dot(q + r * D, kr, D));
          }
        }
      }
    });
  } else {  // a chunk of tokens: KEYS keys at a time, transposed, against every query
    std::vector<float> kt(D * KEYS);
    for (int64_t pg = k0 / p.ps; pg <= k1 / p.ps; ++pg) {
      int64_t page = table[pg];
      page = std::min<int64_t>(std::max<int64_t>(page, 0), p.P - 1);
      const int64_t first = std::max(k0, pg * p.ps), last = std::min(k1, pg * p.ps + p.ps - 1);
      for (int64_t j1 = first; j1 <= last; j1 += KEYS) {
        const int64_t c = std::min<int64_t>(KEYS, last - j1 + 1);
        for (int64_t kh = 0; kh < p.K; ++kh) {
          std::fill(kt.begin(), kt.end(), 0.0f);
          for (int64_t kk = 0; kk < c; ++kk) {
            const int64_t row = (page * p.ps + j1 + kk - pg * p.ps) * p.K + kh;
            const float* kr = row_f32(p.k, row, D, kbuf.data());
            for (int64_t d = 0; d < D; ++d) kt[d * KEYS + kk] = kr[d];
          }
          for (int64_t t = 0; t < nt; ++t) {
            const int64_t i = pos[t];  // it sees keys max(i - w + 1, 0)..i (valid i)
            if (i < 0 || i >= S || i < j1 || (p.window > 0 && i - p.window + 1 > j1 + c - 1))
              continue;
            for (int64_t g = 0; g < G; ++g) {
              const int64_t r = t * H + kh * G + g;
              const float* qr = q + r * D;
              alignas(64) float acc[KEYS] = {0};
#if defined(__AVX512F__) && !defined(LLAMAY_SCALAR)
              static_assert(KEYS == 16, "one zmm of keys");
              __m512 a16 = _mm512_setzero_ps();
              for (int64_t d = 0; d < D; ++d)
                a16 = _mm512_fmadd_ps(_mm512_set1_ps(qr[d]), _mm512_loadu_ps(&kt[d * KEYS]), a16);
              _mm512_store_ps(acc, a16);
#else
              for (int64_t d = 0; d < D; ++d)
                for (int64_t kk = 0; kk < KEYS; ++kk) acc[kk] += qr[d] * kt[d * KEYS + kk];
#endif
              for (int64_t kk = 0; kk < c; ++kk)
                if (sees(t, j1 + kk)) scores[r * n + (j1 + kk - k0)] = score(acc[kk]);
            }
          }
        }
      }
    }
  }
  for (int64_t r = 0; r < nq; ++r) {
    float* sr = scores.data() + r * n;
    const float mx = max_of(sr, n);
    m[r] = mx;
    if (mx == NEG) continue;
    l[r] = exp_shifted(sr, mx, sr, n);
  }
#if defined(LLAMAY_PA_DECODE8)
  if (decode8) {
    rows_of(p.v);
    constexpr int64_t VALUE_KEYS = 64;  // keys per pass over every head's outputs
    for (int64_t c0 = 0; c0 < n; c0 += VALUE_KEYS) {
      const int64_t nc = std::min(VALUE_KEYS, n - c0);
      for (int64_t kh = 0; kh < p.K; ++kh)
        for (int64_t t = 0; t < nt; ++t)
          for (int64_t g = 0; g < G; ++g) {
            const int64_t r = t * H + kh * G + g;
            if (m[r] != NEG)
              weighted_rows(scores.data() + r * n + c0, rows.data() + kh * stride + c0, nc, D, acc + r * D);
          }
    }
    return;
  }
#endif
  walk([&](int64_t j, int64_t row) {
    for (int64_t kh = 0; kh < p.K; ++kh) {
      const float* vr = nullptr;
      for (int64_t t = 0; t < nt; ++t)
        for (int64_t g = 0; g < G; ++g) {
          const int64_t r = t * H + kh * G + g;
          if (m[r] == NEG) continue;
          const float w = scores[r * n + (j - k0)];
          if (w == 0.0f) continue;
          if (!vr) vr = row_f32(p.v, row + kh, D, vbuf.data());
          float* __restrict a = acc + r * D;
          for (int64_t d = 0; d < D; ++d) a[d] += w * vr[d];
        }
    }
  });
}

// The output of a block from its chunks' states (m, l, acc of chunk c at c*nq, c*nq*D):
// sum over chunks of exp(m_c - M) * acc_c over the same of l_c; 0 where no key is seen.
void merge(const Problem& p, const Block& blk, int64_t n_chunks, const float* m, const float* l,
           const float* acc) {
  const int64_t D = p.D, H = p.H, nq = (blk.t1 - blk.t0) * H;
  const float NEG = -std::numeric_limits<float>::infinity();
  float* out = p.out + (blk.b * p.T + blk.t0) * H * D;
  std::vector<float> o(D);
  for (int64_t r = 0; r < nq; ++r) {
    float mx = NEG;
    for (int64_t c = 0; c < n_chunks; ++c) mx = std::max(mx, m[c * nq + r]);
    if (mx == NEG) {
      std::memset(out + r * D, 0, D * sizeof(float));
      continue;
    }
    float sum = 0.0f;
    std::fill(o.begin(), o.end(), 0.0f);
    for (int64_t c = 0; c < n_chunks; ++c) {
      if (m[c * nq + r] == NEG) continue;
      const float f = std::exp(m[c * nq + r] - mx);
      sum += f * l[c * nq + r];
      const float* a = acc + (c * nq + r) * D;
      for (int64_t d = 0; d < D; ++d) o[d] += f * a[d];
    }
    for (int64_t d = 0; d < D; ++d) out[r * D + d] = o[d] / sum;
  }
}

// ---- Long query blocks (prefill chunks): flash attention in tiles ----------------------
//
// A task is one row's block of query tokens for one kv head: its R = tokens x G query
// heads (GQA: the G heads of a kv head share its keys) against the keys they see, TILE_KEYS
// at a time, with the softmax kept online (running max m, sum l, and the output O
// rescaled as the max grows). Everything is laid out with the query rows innermost, so
// every step is a vector over rows: q transposed once per task (Qt [D][R]), the scores of a
// key tile S [keys][R] as keys broadcast against Qt, the max/exp/sum over keys as vector
// ops, and O [D][R] += values broadcast against the tile's weights. No key tile is
// transposed or gathered, and a block's keys are read once for all its rows (the decode
// path above reads them once per block of tokens and keeps per-key scores of the whole
// range). Tiles wholly visible to every row skip the mask.
constexpr int64_t TILE_KEYS = 64;
constexpr int64_t TILE_ROWS = 64;  // query rows (tokens x G) per task, at most
// Query blocks of at least this many tokens take the tiles (fewer: the path above, whose
// split of one block's keys over the threads suits decoding and verify chunks).
constexpr int64_t TILED_MIN_TOKENS = 4;
#if defined(__AVX512F__)
constexpr int TILE_VECS = 4;  // row vectors of 16 per microkernel call: 16 zmm accumulators
#else
constexpr int TILE_VECS = 1;  // AVX2 (a vector is two ymm) and the rest: 8 accumulators
#endif

// s[c][r] = sum_d k[c][d] * qt[d][r] for 4 keys c and NV vectors of 16 rows r.
template <int NV>
inline void scores_4xnv(const float* const* k, const float* qt, int64_t R, int64_t D, float* s) {
  f16v acc[4][NV];
  LLAMAY_UNROLL for (int c = 0; c < 4; ++c)
    LLAMAY_UNROLL for (int v = 0; v < NV; ++v) acc[c][v] = splat16(0.0f);
  for (int64_t d = 0; d < D; ++d) {
    f16v qv[NV];
    LLAMAY_UNROLL for (int v = 0; v < NV; ++v) qv[v] = load16(qt + d * R + 16 * v);
    LLAMAY_UNROLL for (int c = 0; c < 4; ++c) {
      const f16v b = splat16(k[c][d]);
      LLAMAY_UNROLL for (int v = 0; v < NV; ++v) acc[c][v] += b * qv[v];
    }
  }
  LLAMAY_UNROLL for (int c = 0; c < 4; ++c)
    LLAMAY_UNROLL for (int v = 0; v < NV; ++v) store16(s + c * R + 16 * v, acc[c][v]);
}

// o[d][r] = o[d][r] * alpha[r] + sum_{c < n} v[c][d] * p[c][r], for 4 d's and NV vectors of r.
template <int NV>
inline void weighted_4xnv(const float* const* v, int64_t d0, const float* p, int64_t n,
                          const float* alpha, int64_t R, float* o) {
  f16v acc[4][NV];
  LLAMAY_UNROLL for (int v_ = 0; v_ < NV; ++v_) {
    const f16v a = load16(alpha + 16 * v_);
    LLAMAY_UNROLL for (int i = 0; i < 4; ++i) acc[i][v_] = load16(o + (d0 + i) * R + 16 * v_) * a;
  }
  for (int64_t c = 0; c < n; ++c) {
    f16v pv[NV];
    LLAMAY_UNROLL for (int v_ = 0; v_ < NV; ++v_) pv[v_] = load16(p + c * R + 16 * v_);
    LLAMAY_UNROLL for (int i = 0; i < 4; ++i) {
      const f16v b = splat16(v[c][d0 + i]);
      LLAMAY_UNROLL for (int v_ = 0; v_ < NV; ++v_) acc[i][v_] += b * pv[v_];
    }
  }
  LLAMAY_UNROLL for (int i = 0; i < 4; ++i)
    LLAMAY_UNROLL for (int v_ = 0; v_ < NV; ++v_) store16(o + (d0 + i) * R + 16 * v_, acc[i][v_]);
}

// Calls f(nv, offset) over the R / 16 row vectors in groups of at most TILE_VECS.
template <class F>
inline void row_groups(int64_t R, F&& f) {
  for (int64_t v0 = 0; v0 < R / 16; v0 += TILE_VECS) f(std::min<int64_t>(TILE_VECS, R / 16 - v0), 16 * v0);
}

void scores_tile(const float* const* k, int64_t n4, const float* qt, int64_t R, int64_t D, float* s) {
  for (int64_t c = 0; c < n4; c += 4)
    row_groups(R, [&](int64_t nv, int64_t off) {
      float* out = s + c * R + off;
      if (nv == 4) scores_4xnv<TILE_VECS < 4 ? 1 : 4>(k + c, qt + off, R, D, out);
      else if (nv == 3) scores_4xnv<TILE_VECS < 3 ? 1 : 3>(k + c, qt + off, R, D, out);
      else if (nv == 2) scores_4xnv<TILE_VECS < 2 ? 1 : 2>(k + c, qt + off, R, D, out);
      else scores_4xnv<1>(k + c, qt + off, R, D, out);
    });
}

void weighted_tile(const float* const* v, int64_t n, const float* p, const float* alpha,
                   int64_t R, int64_t D, float* o) {
  for (int64_t d0 = 0; d0 < D; d0 += 4)
    row_groups(R, [&](int64_t nv, int64_t off) {
      if (nv == 4) weighted_4xnv<TILE_VECS < 4 ? 1 : 4>(v, d0, p + off, n, alpha + off, R, o + off);
      else if (nv == 3) weighted_4xnv<TILE_VECS < 3 ? 1 : 3>(v, d0, p + off, n, alpha + off, R, o + off);
      else if (nv == 2) weighted_4xnv<TILE_VECS < 2 ? 1 : 2>(v, d0, p + off, n, alpha + off, R, o + off);
      else weighted_4xnv<1>(v, d0, p + off, n, alpha + off, R, o + off);
    });
}

// Whether the tiles apply: D a multiple of 16 (the row vectors' d steps of 4 and the
// f16/bf16 conversion) and a block long enough.
bool tiled(const Problem& p) { return p.T >= TILED_MIN_TOKENS && p.D % 16 == 0; }

// Tokens per task: TILE_ROWS / G (at least 1).
int64_t tile_tokens(const Problem& p) { return std::max<int64_t>(1, TILE_ROWS / p.G); }

// A task: row b, kv head kh, query tokens t0..t1-1, over part `part` of `parts` of the
// keys they see (split in whole key tiles).
struct Tile {
  int64_t b, kh, t0, t1;
  int64_t lo, hi;  // the lowest and highest position of its rows (hi < 0: none)
  int64_t live, R;  // its query rows (tokens x G), and that rounded up to a vector
  std::vector<int64_t> pos;  // each row's position, -1: none (padding, or past `live`)
};

Tile tile_of(const Problem& p, int64_t b, int64_t kh, int64_t t0, int64_t t1) {
  const int64_t S = p.M * p.ps, G = p.G;
  Tile tl{b, kh, t0, t1, S, -1, (t1 - t0) * G, 0, {}};
  tl.R = (tl.live + 15) / 16 * 16;
  tl.pos.assign(tl.R, -1);
  for (int64_t t = 0; t < t1 - t0; ++t) {
    const int64_t i = p.qpos[b * p.T + t0 + t];
    if (i < 0 || i >= S) continue;
    for (int64_t g = 0; g < G; ++g) tl.pos[t * G + g] = i;
    tl.lo = std::min(tl.lo, i);
    tl.hi = std::max(tl.hi, i);
  }
  return tl;
}

// The first key any row of the tile sees.
int64_t first_key(const Problem& p, const Tile& tl) {
  return p.window > 0 ? std::max<int64_t>(tl.lo - p.window + 1, 0) : 0;
}

// The tile's rows against keys k0..k1 (whole key tiles from first_key): their running max
// m [R], sum l [R] and unnormalised output o [D][R] (initialised here).
void attend_keys(const Problem& p, const Tile& tl, int64_t k0, int64_t k1, float* o, float* m,
                 float* l) {
  const int64_t D = p.D, G = p.G, H = p.H, R = tl.R;
  const float NEG = -std::numeric_limits<float>::infinity();
  std::fill(o, o + D * R, 0.0f);
  std::fill(m, m + R, NEG);
  std::fill(l, l + R, 0.0f);
  if (tl.hi < 0 || k0 > k1) return;
  std::vector<float> qt(D * R, 0.0f), s(TILE_KEYS * R), alpha(R), shift(R);
  std::vector<float> kbuf(TILE_KEYS * D), vbuf(TILE_KEYS * D), zeros(D, 0.0f);
  std::vector<const float*> krows(TILE_KEYS), vrows(TILE_KEYS);
  for (int64_t r = 0; r < tl.live; ++r) {
    const float* qr = p.q + ((tl.b * p.T + tl.t0 + r / G) * H + tl.kh * G + r % G) * D;
    for (int64_t d = 0; d < D; ++d) qt[d * R + r] = qr[d];
  }
  const int32_t* table = p.table + tl.b * p.M;
  for (int64_t j1 = k0; j1 <= k1; j1 += TILE_KEYS) {
    const int64_t n = std::min(TILE_KEYS, k1 - j1 + 1), n4 = (n + 3) / 4 * 4;
    for (int64_t c = 0; c < n; ++c) {
      const int64_t j = j1 + c;
      int64_t page = table[j / p.ps];
      page = std::min<int64_t>(std::max<int64_t>(page, 0), p.P - 1);  // as a jnp gather clamps
      const int64_t row = (page * p.ps + j % p.ps) * p.K + tl.kh;
      krows[c] = row_f32(p.k, row, D, kbuf.data() + c * D);
      vrows[c] = row_f32(p.v, row, D, vbuf.data() + c * D);
    }
    for (int64_t c = n; c < n4; ++c) krows[c] = zeros.data();
    scores_tile(krows.data(), n4, qt.data(), R, D, s.data());
    for (int64_t i = 0; i < n * R; ++i) s[i] *= p.scale;
    if (p.softcap != 0.0f)
      for (int64_t i = 0; i < n * R; ++i) s[i] = p.softcap * std::tanh(s[i] / p.softcap);
    // keys some row does not see (before its window, after its position); padding rows
    // (position -1) are masked only along with the others: their output is 0 regardless
    const bool whole = j1 + n - 1 <= tl.lo && (p.window <= 0 || tl.hi - j1 < p.window);
    if (!whole)
      for (int64_t c = 0; c < n; ++c) {
        const int64_t j = j1 + c;
        for (int64_t r = 0; r < R; ++r) {
          const int64_t i = tl.pos[r];
          if (i < 0 || j > i || (p.window > 0 && i - j >= p.window)) s[c * R + r] = NEG;
        }
      }
    // online softmax over the tile, per row: the new max, the old sums' factor, the weights
    for (int64_t r = 0; r < R; ++r) shift[r] = m[r];
    for (int64_t c = 0; c < n; ++c)
      for (int64_t r = 0; r < R; ++r) shift[r] = std::max(shift[r], s[c * R + r]);
    for (int64_t r = 0; r < R; ++r) {
      alpha[r] = m[r] == NEG ? NEG : m[r] - shift[r];  // exp: 0 where nothing was seen before
      if (shift[r] == NEG) shift[r] = 0.0f;             // nothing seen yet: every weight is 0
      else m[r] = shift[r];
    }
    exp_shifted(alpha.data(), 0.0f, alpha.data(), R);
    for (int64_t c = 0; c < n; ++c)
      for (int64_t r = 0; r < R; ++r) s[c * R + r] -= shift[r];
    exp_shifted(s.data(), 0.0f, s.data(), n * R);
    for (int64_t r = 0; r < R; ++r) l[r] *= alpha[r];
    for (int64_t c = 0; c < n; ++c)
      for (int64_t r = 0; r < R; ++r) l[r] += s[c * R + r];
    weighted_tile(vrows.data(), n, s.data(), alpha.data(), R, D, o);
  }
}

// The tile's output rows from its parts' states (o [D][R], m [R], l [R] of part c at
// c * stride floats): sum over parts of exp(m_c - M) * o_c over the same of l_c; 0 for a
// row that sees no key (padding).
void finish_tile(const Problem& p, const Tile& tl, int64_t parts, const float* state,
                 int64_t stride) {
  const int64_t D = p.D, G = p.G, H = p.H, R = tl.R;
  const float NEG = -std::numeric_limits<float>::infinity();
  float* out = p.out + (tl.b * p.T + tl.t0) * H * D;
  for (int64_t r = 0; r < tl.live; ++r) {
    float* y = out + (r / G) * H * D + (tl.kh * G + r % G) * D;
    float mx = NEG;
    for (int64_t c = 0; c < parts; ++c) mx = std::max(mx, state[c * stride + D * R + r]);
    float sum = 0.0f;
    std::fill(y, y + D, 0.0f);
    if (tl.pos[r] < 0 || mx == NEG) continue;
    for (int64_t c = 0; c < parts; ++c) {
      const float* o = state + c * stride;
      const float mc = o[D * R + r];
      if (mc == NEG) continue;
      const float f = parts == 1 ? 1.0f : std::exp(mc - mx);
      sum += f * o[D * R + R + r];
      for (int64_t d = 0; d < D; ++d) y[d] += f * o[d * R + r];
    }
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    for (int64_t d = 0; d < D; ++d) y[d] *= inv;
  }
}

// Every (row, kv head, block of tokens) tile, the latest blocks (the most keys) first;
// when there are fewer tiles than twice the threads, each tile's keys are split into
// parts (whole key tiles) computed as tasks of their own, then merged.
void attend_tiles(ffi::ThreadPool& pool, const Problem& p) {
  const int64_t tt = tile_tokens(p), nb = (p.T + tt - 1) / tt, n_tiles = p.B * p.K * nb;
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t parts = std::max<int64_t>(1, (2 * threads + n_tiles - 1) / n_tiles);
  std::vector<Tile> tiles(n_tiles);
  parallel_for(pool, n_tiles, [&](int64_t i) {
    const int64_t blk = nb - 1 - i / (p.B * p.K), bk = i % (p.B * p.K), t0 = blk * tt;
    tiles[i] = tile_of(p, bk / p.K, bk % p.K, t0, std::min(p.T, t0 + tt));
  });
  const int64_t Rmax = (tt * p.G + 15) / 16 * 16, stride = p.D * Rmax + 2 * Rmax;
  // each part's state (o, m, l) for the merge; one part per tile: a task's own scratch
  std::vector<float> state(parts > 1 ? n_tiles * parts * stride : 0);
  parallel_for(pool, n_tiles * parts, [&](int64_t task) {
    const Tile& tl = tiles[task / parts];
    const int64_t c = task % parts, j0 = first_key(p, tl);
    const int64_t n_keys = tl.hi - j0 + 1, per = ((n_keys + TILE_KEYS - 1) / TILE_KEYS + parts - 1) / parts * TILE_KEYS;
    const int64_t k0 = j0 + c * per, k1 = std::min(tl.hi, j0 + (c + 1) * per - 1);
    std::vector<float> own(parts > 1 ? 0 : stride);
    float* o = parts > 1 ? state.data() + task * stride : own.data();
    attend_keys(p, tl, k0, k1, o, o + p.D * tl.R, o + p.D * tl.R + tl.R);
    if (parts == 1) finish_tile(p, tl, 1, o, stride);
  });
  if (parts > 1)
    parallel_for(pool, n_tiles, [&](int64_t i) {
      finish_tile(p, tiles[i], parts, state.data() + i * parts * stride, stride);
    });
}

ffi::Error PagedAttention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::AnyBuffer k,
                          ffi::AnyBuffer v, ffi::BufferR0<ffi::S32> layer,
                          ffi::Buffer<ffi::S32> table, ffi::Buffer<ffi::S32> qpos,
                          ffi::BufferR0<ffi::S32> window, ffi::ResultBuffer<ffi::F32> out,
                          float scale, float softcap) {
  auto qd = q.dimensions(), kd = k.dimensions(), td = table.dimensions();
  if (qd.size() != 4 || td.size() != 2 || (kd.size() != 4 && kd.size() != 5))
    return ffi::Error::InvalidArgument(
        "LlamayPagedAttention: q must be [B, T, H, D], the pool [P, ps, K, D] or "
        "[L, P, ps, K, D], the page table [B, M]");
  const int64_t r = kd.size();
  auto vd = v.dimensions();
  if (vd.size() != kd.size())
    return ffi::Error::InvalidArgument("LlamayPagedAttention: K and V pools differ");
  for (int64_t i = 0; i + 1 < r; ++i)
    if (vd[i] != kd[i])
      return ffi::Error::InvalidArgument("LlamayPagedAttention: K and V pools differ");
  Problem p;
  p.B = qd[0], p.T = qd[1], p.H = qd[2], p.D = qd[3];
  p.P = kd[r - 4], p.ps = kd[r - 3], p.K = kd[r - 2];
  p.M = td[1];
  if (p.K == 0 || p.H % p.K || td[0] != p.B || qpos.element_count() != (size_t)(p.B * p.T))
    return ffi::Error::InvalidArgument("LlamayPagedAttention: shapes do not fit");
  // Each pool's type from its element type and row width: f32/f16/bf16 rows of D, or
  // uint8 rows of D/32 blocks of a 32-element type (its bytes a block tell which).
  auto type_of = [&](ffi::DataType et, int64_t width) -> int32_t {
    if (et == ffi::DataType::F32 || et == ffi::DataType::F16 || et == ffi::DataType::BF16)
      return width == p.D ? (et == ffi::DataType::F32 ? F32 : et == ffi::DataType::F16 ? F16 : BF16)
                          : -1;
    if (et != ffi::DataType::U8 || p.D % 32 || width % (p.D / 32)) return -1;
    for (int32_t t : {Q8_0, Q5_1, Q5_0, Q4_1, Q4_0})
      if (block_bytes(t) == width / (p.D / 32)) return t;
    return -1;
  };
  const int32_t kt = type_of(k.element_type(), kd[r - 1]), vt = type_of(v.element_type(), vd[r - 1]);
  if (kt < 0 || vt < 0)
    return ffi::Error::InvalidArgument(
        "LlamayPagedAttention: a pool must be f32, f16 or bf16 rows of D, or uint8 rows of "
        "D/32 Q8_0, Q5_1, Q5_0, Q4_1 or Q4_0 blocks");
  p.G = p.H / p.K;
  int64_t l = 0;
  if (r == 5) {
    l = *layer.typed_data();
    if (l < 0 || l >= kd[0])
      return ffi::Error::InvalidArgument("LlamayPagedAttention: layer index out of range");
  }
  auto pool_of = [&](ffi::AnyBuffer& buf, int32_t t, int64_t width) {
    const int64_t row_bytes = width * (t == F32 ? 4 : t == F16 || t == BF16 ? 2 : 1);
    const int64_t layer_bytes = p.P * p.ps * p.K * row_bytes;
    return Pool{static_cast<const uint8_t*>(buf.untyped_data()) + l * layer_bytes, t, row_bytes};
  };
  p.k = pool_of(k, kt, kd[r - 1]);
  p.v = pool_of(v, vt, vd[r - 1]);
  p.q = q.typed_data();
  p.table = table.typed_data();
  p.qpos = qpos.typed_data();
  p.out = out->typed_data();
  p.window = *window.typed_data();
  p.scale = scale;
  p.softcap = softcap;
  if (p.B * p.T * p.H * p.D == 0) return ffi::Error::Success();
  if (tiled(p)) {
    attend_tiles(pool, p);
    return ffi::Error::Success();
  }
  // Tasks: blocks of query tokens (at most QUERY_HEADS_PER_BLOCK query heads) of each row,
  // each block's keys split into chunks so that there are about 2 tasks per thread
  // (one row decoding still spreads over the threads).
  const int64_t tb = std::max<int64_t>(1, QUERY_HEADS_PER_BLOCK / p.H);
  const int64_t nb = (p.T + tb - 1) / tb, n_blocks = p.B * nb;
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t n_chunks = std::max<int64_t>(1, (2 * threads + n_blocks - 1) / n_blocks);
  std::vector<Block> blocks(n_blocks);
  for (int64_t i = 0; i < n_blocks; ++i) {
    const int64_t b = i / nb, t0 = i % nb * tb;
    blocks[i] = block_of(p, b, t0, std::min(p.T, t0 + tb));
  }
  const int64_t nq = tb * p.H;  // per block, at most
  std::vector<float> ms(n_blocks * n_chunks * nq), ls(ms.size()), accs(ms.size() * p.D);
  parallel_for(pool, n_blocks * n_chunks, [&](int64_t task) {
    const Block& blk = blocks[task / n_chunks];
    const int64_t c = task % n_chunks, nqb = (blk.t1 - blk.t0) * p.H;
    float* m = ms.data() + (task / n_chunks * n_chunks) * nq + c * nqb;
    float* l = ls.data() + (m - ms.data());
    float* acc = accs.data() + (m - ms.data()) * p.D;
    // chunk c of keys j0..hi, aligned to granules of at most CHUNK_GRANULE keys (pages
    // of paged pools; a dense cache viewed as one page per row is split too)
    const int64_t g = std::min<int64_t>(p.ps, CHUNK_GRANULE);
    const int64_t pg0 = blk.j0 / g, pages = blk.hi < 0 ? 0 : blk.hi / g - pg0 + 1;
    const int64_t per = (pages + n_chunks - 1) / n_chunks;
    const int64_t k0 = std::max(blk.j0, (pg0 + c * per) * g);
    const int64_t k1 = std::min(blk.hi, (pg0 + (c + 1) * per) * g - 1);
    chunk(p, blk, k0, k1, m, l, acc);
  });
  parallel_for(pool, n_blocks, [&](int64_t i) {
    const Block& blk = blocks[i];
    const int64_t off = i * n_chunks * nq;
    merge(p, blk, n_chunks, ms.data() + off, ls.data() + off, accs.data() + off * p.D);
  });
  return ffi::Error::Success();
}

}  // namespace
}  // namespace llamay

XLA_FFI_DEFINE_HANDLER_SYMBOL(LlamayPagedAttention, llamay::PagedAttention,
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
                                  .Attr<float>("scale")
                                  .Attr<float>("softcap"));
