// Paged attention over the KV pool, read in place through the page tables (exact
// numerics): the reference is `kernels_pallas.paged_attention.paged_attention_reference`
// (gather each row's pages into a dense view, then `attention_reference`); this kernel
// computes the same thing without the gathered copy.
//
// Operands: q f32 [B, T, H, D]; the K and V pools, f32, f16 or bf16, one layer's pages
// [P, ps, K, D] or the pool [L, P, ps, K, D] with `layer` (an s32 scalar: the layer
// scan hands the whole pool, not a copied-out slice); the page tables s32 [B, M] (entry
// m: the page holding positions m*ps .. m*ps+ps-1); q_pos s32 [B, T]; the window (s32
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

// out[c] = exp(x[c] - mx), 0 where x[c] is -inf; returns the sum of out. AVX-512: Cephes'
// expf (range reduction by ln 2 in two parts, degree-5 polynomial: within 2 ulp of
// std::exp), 16 lanes at a time.
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
#endif
  for (; c < n; ++c) {
    out[c] = x[c] == NEG ? 0.0f : std::exp(x[c] - mx);
    sum += out[c];
  }
  return sum;
}

// One key or value row of the pool as f32: the row itself (f32 pool) or converted into
// `buf` (f16 or bf16 pool).
enum Pool : int { POOL_F32 = 0, POOL_F16 = 1, POOL_BF16 = 2 };

inline const float* row_f32(const uint8_t* base, int pool, int64_t index, int64_t d, float* buf) {
  if (pool == POOL_F32) return reinterpret_cast<const float*>(base) + index * d;
  const uint16_t* h = reinterpret_cast<const uint16_t*>(base) + index * d;
  int64_t i = 0;
#if defined(__AVX512F__) && !defined(LLAMAY_SCALAR)
  if (pool == POOL_F16) {
    for (; i + 16 <= d; i += 16)
      _mm512_storeu_ps(buf + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + i))));
  } else {
    for (; i + 16 <= d; i += 16) {
      const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + i)));
      _mm512_storeu_ps(buf + i, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
    }
  }
#endif
  if (pool == POOL_F16)
    for (; i < d; ++i) buf[i] = f16_to_f32(h[i]);
  else
    for (; i < d; ++i) buf[i] = bf16_to_f32(h[i]);
  return buf;
}

struct Problem {
  const float* q;
  const uint8_t* k;  // this layer's pages [P, ps, K, D]
  const uint8_t* v;
  int pool;  // Pool
  const int32_t* table;
  const int32_t* qpos;
  float* out;
  int64_t B, T, H, D, K, G, P, ps, M;
  int32_t window;
  float scale, softcap;
};

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
  if (nt * G < GEMM_QUERIES) {  // decoding: one dot per visible (query, key)
    walk([&](int64_t j, int64_t row) {
      for (int64_t kh = 0; kh < p.K; ++kh) {
        const float* kr = nullptr;
        for (int64_t t = 0; t < nt; ++t) {
          if (!sees(t, j)) continue;
          if (!kr) kr = row_f32(p.k, p.pool, row + kh, D, kbuf.data());
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
            const float* kr = row_f32(p.k, p.pool, row, D, kbuf.data());
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
    float mx = NEG;
    for (int64_t c = 0; c < n; ++c) mx = std::max(mx, sr[c]);
    m[r] = mx;
    if (mx == NEG) continue;
    l[r] = exp_shifted(sr, mx, sr, n);
  }
  walk([&](int64_t j, int64_t row) {
    for (int64_t kh = 0; kh < p.K; ++kh) {
      const float* vr = nullptr;
      for (int64_t t = 0; t < nt; ++t)
        for (int64_t g = 0; g < G; ++g) {
          const int64_t r = t * H + kh * G + g;
          if (m[r] == NEG) continue;
          const float w = scores[r * n + (j - k0)];
          if (w == 0.0f) continue;
          if (!vr) vr = row_f32(p.v, p.pool, row + kh, D, vbuf.data());
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
  if (k.element_type() != v.element_type() || k.size_bytes() != v.size_bytes())
    return ffi::Error::InvalidArgument("LlamayPagedAttention: K and V pools differ");
  const auto et = k.element_type();
  const int pool_type = et == ffi::DataType::F32    ? POOL_F32
                        : et == ffi::DataType::F16  ? POOL_F16
                        : et == ffi::DataType::BF16 ? POOL_BF16
                                                    : -1;
  if (pool_type < 0)
    return ffi::Error::InvalidArgument("LlamayPagedAttention: the pool must be f32, f16 or bf16");
  const int64_t r = kd.size();
  Problem p;
  p.B = qd[0], p.T = qd[1], p.H = qd[2], p.D = qd[3];
  p.P = kd[r - 4], p.ps = kd[r - 3], p.K = kd[r - 2];
  p.M = td[1];
  if (kd[r - 1] != p.D || p.K == 0 || p.H % p.K || td[0] != p.B ||
      qpos.element_count() != (size_t)(p.B * p.T))
    return ffi::Error::InvalidArgument("LlamayPagedAttention: shapes do not fit");
  p.G = p.H / p.K;
  int64_t l = 0;
  if (r == 5) {
    l = *layer.typed_data();
    if (l < 0 || l >= kd[0])
      return ffi::Error::InvalidArgument("LlamayPagedAttention: layer index out of range");
  }
  const int64_t elem = pool_type == POOL_F32 ? 4 : 2, layer_bytes = p.P * p.ps * p.K * p.D * elem;
  p.k = static_cast<const uint8_t*>(k.untyped_data()) + l * layer_bytes;
  p.v = static_cast<const uint8_t*>(v.untyped_data()) + l * layer_bytes;
  p.pool = pool_type;
  p.q = q.typed_data();
  p.table = table.typed_data();
  p.qpos = qpos.typed_data();
  p.out = out->typed_data();
  p.window = *window.typed_data();
  p.scale = scale;
  p.softcap = softcap;
  if (p.B * p.T * p.H * p.D == 0) return ffi::Error::Success();
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
    // page-aligned chunk c of keys j0..hi
    const int64_t pg0 = blk.j0 / p.ps, pages = blk.hi < 0 ? 0 : blk.hi / p.ps - pg0 + 1;
    const int64_t per = (pages + n_chunks - 1) / n_chunks;
    const int64_t k0 = std::max(blk.j0, (pg0 + c * per) * p.ps);
    const int64_t k1 = std::min(blk.hi, (pg0 + (c + 1) * per) * p.ps - 1);
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
