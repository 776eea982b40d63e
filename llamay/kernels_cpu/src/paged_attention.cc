// Paged attention over the KV pool, read in place through the page tables (exact
// numerics): the reference is `kernels_pallas.paged_attention.paged_attention_reference`
// (gather each row's pages into a dense view, then `attention_reference`); this kernel
// computes the same thing without the gathered copy.
//
// Operands: q f32 [B, T, H, D]; the K and V pools, f32 or f16, one layer's pages
// [P, ps, K, D] or the pool [L, P, ps, K, D] with `layer` (an s32 scalar: the layer
// scan hands the whole pool, not a copied-out slice); the page tables s32 [B, M] (entry
// m: the page holding positions m*ps .. m*ps+ps-1); q_pos s32 [B, T]; the window (s32
// scalar, <= 0: global). Attributes: scale, softcap (0: none). Result f32 [B, T, H, D].
//
// Per (row, kv head, block of query tokens): the scores of the block's G*T query heads
// over the keys the block can see (key j visible from position i iff j <= i and, with a
// window w > 0, i - j < w), scaled then softcapped, as the reference; then per query the
// softmax as jax.nn.softmax (exp(s - max), divided by the sum) and the probabilities
// times V. Only the summation order differs from the reference (and the two cases
// whose outputs are unused: a query that sees no key gives 0, where the reference gives
// NaN, and a query at a position outside [0, M*ps) -- padding -- gives 0).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "blocks.h"
#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace llamay {
namespace {

constexpr int64_t LANES = 16;
constexpr int64_t QUERY_HEADS_PER_BLOCK = 32;  // query heads (tokens x group) per task

inline float dot(const float* a, const float* b, int64_t d) {
  float acc[LANES] = {0};
  int64_t i = 0;
  for (; i + LANES <= d; i += LANES)
    for (int64_t l = 0; l < LANES; ++l) acc[l] += a[i + l] * b[i + l];
  float s = 0.0f;
  for (; i < d; ++i) s += a[i] * b[i];
  for (int64_t l = 0; l < LANES; ++l) s += acc[l];
  return s;
}

// One key or value row of the pool as f32: the row itself (f32 pool) or converted into
// `buf` (f16 pool).
inline const float* row_f32(const uint8_t* base, bool f16, int64_t index, int64_t d, float* buf) {
  if (!f16) return reinterpret_cast<const float*>(base) + index * d;
  const uint16_t* h = reinterpret_cast<const uint16_t*>(base) + index * d;
  for (int64_t i = 0; i < d; ++i) buf[i] = f16_to_f32(h[i]);
  return buf;
}

struct Problem {
  const float* q;
  const uint8_t* k;  // this layer's pages [P, ps, K, D]
  const uint8_t* v;
  bool f16;
  const int32_t* table;
  const int32_t* qpos;
  float* out;
  int64_t B, T, H, D, K, G, P, ps, M;
  int32_t window;
  float scale, softcap;
};

// The queries of row b, kv head kh, tokens t0..t1-1.
void block(const Problem& p, int64_t b, int64_t kh, int64_t t0, int64_t t1) {
  const int64_t D = p.D, G = p.G, S = p.M * p.ps;
  const int64_t nq = (t1 - t0) * G;
  int64_t lo = S, hi = -1;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t i = p.qpos[b * p.T + t];
    if (i < 0 || i >= S) continue;
    lo = std::min(lo, i);
    hi = std::max(hi, i);
  }
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t g = 0; g < G; ++g)
      std::memset(p.out + ((b * p.T + t) * p.H + kh * G + g) * D, 0, D * sizeof(float));
  if (hi < 0) return;
  const int64_t j0 = p.window > 0 ? std::max<int64_t>(lo - p.window + 1, 0) : 0;
  const int64_t n = hi - j0 + 1;  // keys j0..hi
  const float NEG = -std::numeric_limits<float>::infinity();
  std::vector<float> scores(nq * n, NEG), acc(nq * D, 0.0f), buf(D);
  std::vector<const float*> qs(nq);
  std::vector<int64_t> pos(nq);
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t g = 0; g < G; ++g) {
      const int64_t r = (t - t0) * G + g;
      qs[r] = p.q + ((b * p.T + t) * p.H + kh * G + g) * D;
      pos[r] = p.qpos[b * p.T + t];
    }
  const int32_t* table = p.table + b * p.M;
  auto slot_of = [&](int64_t j) {
    int64_t page = table[j / p.ps];
    page = std::min<int64_t>(std::max<int64_t>(page, 0), p.P - 1);  // as a jnp gather clamps
    return (page * p.ps + j % p.ps) * p.K + kh;
  };
  auto visible = [&](int64_t r, int64_t j) {
    const int64_t i = pos[r];
    return i >= 0 && i < S && j <= i && (p.window <= 0 || i - j < p.window);
  };
  for (int64_t j = j0; j <= hi; ++j) {
    const float* kr = row_f32(p.k, p.f16, slot_of(j), D, buf.data());
    for (int64_t r = 0; r < nq; ++r) {
      if (!visible(r, j)) continue;
      float s = dot(qs[r], kr, D) * p.scale;
      if (p.softcap != 0.0f) s = p.softcap * std::tanh(s / p.softcap);
      scores[r * n + (j - j0)] = s;
    }
  }
  for (int64_t r = 0; r < nq; ++r) {  // the softmax, as jax.nn.softmax
    float* s = scores.data() + r * n;
    float mx = NEG;
    for (int64_t c = 0; c < n; ++c) mx = std::max(mx, s[c]);
    if (mx == NEG) continue;  // sees no key (padding): 0
    float sum = 0.0f;
    for (int64_t c = 0; c < n; ++c) {
      s[c] = s[c] == NEG ? 0.0f : std::exp(s[c] - mx);
      sum += s[c];
    }
    for (int64_t c = 0; c < n; ++c) s[c] = s[c] / sum;
  }
  for (int64_t j = j0; j <= hi; ++j) {
    const float* vr = nullptr;
    for (int64_t r = 0; r < nq; ++r) {
      const float w = scores[r * n + (j - j0)];
      if (w == 0.0f || w == NEG) continue;
      if (!vr) vr = row_f32(p.v, p.f16, slot_of(j), D, buf.data());
      float* a = acc.data() + r * D;
      for (int64_t d = 0; d < D; ++d) a[d] += w * vr[d];
    }
  }
  for (int64_t r = 0; r < nq; ++r) {
    const int64_t t = t0 + r / G, g = r % G;
    if (pos[r] < 0 || pos[r] >= S) continue;
    std::memcpy(p.out + ((b * p.T + t) * p.H + kh * G + g) * D, acc.data() + r * D,
                D * sizeof(float));
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
  const bool f16 = k.element_type() == ffi::DataType::F16;
  if (!f16 && k.element_type() != ffi::DataType::F32)
    return ffi::Error::InvalidArgument("LlamayPagedAttention: the pool must be f32 or f16");
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
  const int64_t elem = f16 ? 2 : 4, layer_bytes = p.P * p.ps * p.K * p.D * elem;
  p.k = static_cast<const uint8_t*>(k.untyped_data()) + l * layer_bytes;
  p.v = static_cast<const uint8_t*>(v.untyped_data()) + l * layer_bytes;
  p.f16 = f16;
  p.q = q.typed_data();
  p.table = table.typed_data();
  p.qpos = qpos.typed_data();
  p.out = out->typed_data();
  p.window = *window.typed_data();
  p.scale = scale;
  p.softcap = softcap;
  if (p.B * p.T * p.H * p.D == 0) return ffi::Error::Success();
  const int64_t tb = std::max<int64_t>(1, QUERY_HEADS_PER_BLOCK / p.G);  // tokens per task
  const int64_t nb = (p.T + tb - 1) / tb;
  parallel_for(pool, p.B * p.K * nb, [&](int64_t task) {
    const int64_t b = task / (p.K * nb), kh = task / nb % p.K, t0 = task % nb * tb;
    block(p, b, kh, t0, std::min(p.T, t0 + tb));
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
