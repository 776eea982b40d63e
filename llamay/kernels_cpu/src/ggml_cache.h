// What the ggml attention kernels share (ggml_attention.cc: flash attention off;
// ggml_flash_attention.cc: on): the operands, read in place (a dense cache or the page pool
// through the page table, a layer of a stack), the keys a query sees, and ggml_vec_dot_f16.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "ggml_float.h"
#include "xla/ffi/api/ffi.h"

namespace llamay {
namespace gc {

namespace ffi = xla::ffi;
using namespace gf;

constexpr int64_t L16 = 16;

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

// The keys query token t of row b sees: [j0, j1] (as ggml_attention._visible; empty when
// j1 < j0).
inline void visible(const Problem& p, int64_t b, int64_t t, int64_t& j0, int64_t& j1) {
  const int64_t i = p.qpos[b * p.T + t];
  if (p.causal) {
    j1 = i;
  } else {
    j1 = -1;
    for (int64_t u = 0; u < p.T; ++u) {
      const int64_t qp = p.qpos[b * p.T + u];
      j1 = std::max(j1, qp < p.S ? qp : -1);
    }
  }
  j1 = std::min(j1, p.S - 1);
  j0 = p.window > 0 ? std::max<int64_t>(0, i - p.window + 1) : 0;
}

// The operands of a ggml attention handler (`name` for its errors) into p.
inline ffi::Error read_problem(const char* name, ffi::Buffer<ffi::F32>& q, ffi::AnyBuffer& k,
                               ffi::AnyBuffer& v, ffi::BufferR0<ffi::S32>& layer,
                               ffi::Buffer<ffi::S32>& table, ffi::Buffer<ffi::S32>& qpos,
                               ffi::BufferR0<ffi::S32>& window, ffi::ResultBuffer<ffi::F32>& out,
                               float kq_scale, int32_t prescaled, int32_t causal, int32_t paged,
                               Problem& p) {
  auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions(), td = table.dimensions();
  const int64_t r = kd.size();
  if (qd.size() != 4 || td.size() != 2 || vd.size() != kd.size() || (r != 4 && r != 5))
    return ffi::Error::InvalidArgument(
        std::string(name) + ": " + "q must be [B, T, H, D]; K, V a cache [B, S, K, D] or pages "
        "[P, ps, K, D] / [L, P, ps, K, D]; the page table [B, M]");
  for (int64_t a = 0; a < r; ++a)
    if (vd[a] != kd[a]) return ffi::Error::InvalidArgument(std::string(name) + ": " + "K and V differ");
  auto half = [](ffi::DataType t, bool* bf) {
    *bf = t == ffi::DataType::BF16;
    return t == ffi::DataType::F16 || t == ffi::DataType::BF16;
  };
  if (!half(k.element_type(), &p.kbf16) || !half(v.element_type(), &p.vbf16))
    return ffi::Error::InvalidArgument(std::string(name) + ": " + "K and V must be f16 or bf16");
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
    if (td[0] != p.B) return ffi::Error::InvalidArgument(std::string(name) + ": " + "page table rows");
  } else {
    p.P = p.ps = p.M = 0;
    p.S = kd[r - 3];
    if (kd[r - 4] != p.B) return ffi::Error::InvalidArgument(std::string(name) + ": " + "cache rows");
  }
  if (kd[r - 1] != p.D || p.K == 0 || p.H % p.K || p.S % L16 ||
      qpos.element_count() != (size_t)(p.B * p.T))
    return ffi::Error::InvalidArgument(std::string(name) + ": " + "shapes do not fit");
  if (p.paged && p.P == 0 && p.B * p.T > 0)
    return ffi::Error::InvalidArgument(std::string(name) + ": " + "no pages");
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
  return ffi::Error::Success();
}

// ggml_float.dot_f16_vec over exact products (a, b: f16 values as f32).
inline float dot_vec(const float* a, const float* b, int64_t D, std::vector<float>& parts,
                     std::vector<float>& h, std::vector<float>& l) {
  const int64_t main = D - D % 64;
  parts.clear();
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
    parts.push_back(red);
  }
  for (int64_t i = main; i < D; ++i) parts.push_back(a[i] * b[i]);
  float hi, lo;
  dsum(parts.data(), (int64_t)parts.size(), h, l, hi, lo);
  return hi + lo;
}

}  // namespace gc
}  // namespace llamay
