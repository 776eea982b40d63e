// Quantised matmul y[M, N] = x[M, K] · W[N, K]ᵀ in llama.cpp's numerics for the i-quants
// (IQ1_S … IQ4_XS), the ternary types (TQ1_0, TQ2_0) and MXFP4, as an XLA FFI handler:
// LlamayQmmIQ, the native twin of llamay/quant/ggml_iq_dot.py (bit-identical; its module
// docstring says which of ggml-cpu's kernels each `kernel` is and in what order it adds).
//
// The activations come already quantised (Q8_K, or Q8_0 for IQ4_NL/MXFP4) by the jnp code
// the XLA path uses; each weight row is decoded once per call into int16 "dot weights"
// (sub-block scale × value, as ggml's integer dots read them: `iq_dot_block`), the integer
// sums are exact, and every f32 operation after them is ggml's, in ggml's order, with
// explicit fmaf and no other contraction (built with -ffp-contract=off).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "blocks.h"
#include "operands.h"
#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace llamay {
namespace {

enum IqKernel : int32_t { IQK_VEC = 0, IQK_TILED = 1, IQK_REPACK = 2, IQK_TINYBLAS = 3 };

bool iq_dot_type(int32_t t) { return is_iq(t); }
bool q8_0_type(int32_t t) { return t == IQ4_NL || t == MXFP4; }
bool ternary(int32_t t) { return t == TQ1_0 || t == TQ2_0; }
bool iq1(int32_t t) { return t == IQ1_S || t == IQ1_M; }

// ggml's factor on the vec_dot's hsum (and the tiled kernel's on d).
float post_of(int32_t t) {
  switch (t) {
    case IQ2_XXS: case IQ2_XS: case IQ2_S: case IQ1_S: case IQ1_M: return 0.125f;
    case IQ3_XXS: return 0.25f;
    default: return 1.0f;
  }
}

// One block of type t as ggml's integer dots read it: w[e] = sub-block scale · value
// (IQ1: · grid value; TQ: the digit 0..2; IQ4_NL/MXFP4: the codebook value), w2[e] (IQ1
// only) = sub-block scale · delta (±1), *d = the block's d (f16, IQ1_M's assembled one,
// MXFP4's e8m0 / 2). The values come from blocks.h's iq_parts (bit-exact with iquants.py).
void iq_dot_block(int32_t t, const uint8_t* b, int16_t* w, int16_t* w2, float* d) {
  int8_t q[256];
  float unused[16];
  const int subs = iq_parts(t, b, q, unused), be = block_elems(t);
  int isc[16];
  int n_sc = 0;
  switch (t) {
    case IQ2_XXS:
      n_sc = 8;
      for (int ib = 0; ib < 8; ++ib) isc[ib] = 2 * (int)(rd32(b + 6 + 8 * ib) >> 28) + 1;
      *d = rdf16(b);
      break;
    case IQ2_XS: case IQ2_S: {
      const uint8_t* s = b + (t == IQ2_XS ? 66 : 74);
      n_sc = 16;
      for (int i = 0; i < 8; ++i) {
        isc[2 * i] = 2 * (s[i] & 0xF) + 1;
        isc[2 * i + 1] = 2 * (s[i] >> 4) + 1;
      }
      *d = rdf16(b);
      break;
    }
    case IQ3_XXS:
      n_sc = 8;
      for (int ib = 0; ib < 8; ++ib) isc[ib] = 2 * (int)(rd32(b + 66 + 4 * ib) >> 28) + 1;
      *d = rdf16(b);
      break;
    case IQ3_S:
      n_sc = 8;
      for (int ib = 0; ib < 8; ++ib) isc[ib] = 1 + 2 * ((b[106 + ib / 2] >> (4 * (ib % 2))) & 0xF);
      *d = rdf16(b);
      break;
    case IQ4_XS: {
      n_sc = 8;
      const uint16_t sh = rd16(b + 2);
      for (int ib = 0; ib < 8; ++ib)
        isc[ib] = (((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (((sh >> (2 * ib)) & 3) << 4)) - 32;
      *d = rdf16(b);
      break;
    }
    case IQ1_S:
      n_sc = 8;
      for (int ib = 0; ib < 8; ++ib) isc[ib] = 2 * ((rd16(b + 34 + 2 * ib) >> 12) & 7) + 1;
      *d = rdf16(b);
      break;
    case IQ1_M: {
      uint16_t s4[4];
      for (int i = 0; i < 4; ++i) s4[i] = rd16(b + 48 + 2 * i);
      n_sc = 16;
      for (int s = 0; s < 16; ++s) isc[s] = 2 * ((s4[s / 4] >> (3 * (s % 4))) & 7) + 1;
      *d = f16_to_f32((uint16_t)((s4[0] >> 12) | ((s4[1] >> 12) << 4) | ((s4[2] >> 12) << 8) | ((s4[3] >> 12) << 12)));
      break;
    }
    case IQ4_NL: *d = rdf16(b); break;
    case MXFP4: *d = e8m0_half(b[0]); break;
    case TQ1_0: *d = rdf16(b + 52); break;
    case TQ2_0: *d = rdf16(b + 64); break;
  }
  (void)subs;
  if (n_sc == 0) {
    const int off = ternary(t) ? 1 : 0;
    for (int e = 0; e < be; ++e) w[e] = (int16_t)(q[e] + off);
    return;
  }
  const int per = be / n_sc;
  if (iq1(t)) {  // q = 8·grid + delta, grid in {-1, 0, 1}, delta ±1
    for (int s = 0; s < n_sc; ++s)
      for (int i = 0; i < per; ++i) {
        const int e = s * per + i, v = q[e], g = (v > 4) - (v < -4);
        w[e] = (int16_t)(isc[s] * g);
        w2[e] = (int16_t)(isc[s] * (v - 8 * g));
      }
    return;
  }
  for (int s = 0; s < n_sc; ++s)
    for (int i = 0; i < per; ++i) w[s * per + i] = (int16_t)(isc[s] * q[s * per + i]);
}

inline float hsum8f(const float* v) {
  const float t0 = v[4] + v[0], t1 = v[5] + v[1], t2 = v[6] + v[2], t3 = v[7] + v[3];
  return (t0 + t2) + (t1 + t3);
}

// ggml's AVX2 int32 lanes over `n` elements (a multiple of 32): lane l = Σ of the products
// at elements 4l..4l+3 of every 32 (exact).
inline void lanes8(const int16_t* w, const int8_t* a, int n, int32_t* out) {
  int32_t p[32];
  for (int j = 0; j < 32; ++j) p[j] = 0;
  for (int c = 0; c < n; c += 32)
    for (int j = 0; j < 32; ++j) p[j] += (int32_t)w[c + j] * a[c + j];
  for (int l = 0; l < 8; ++l) out[l] = (p[4 * l] + p[4 * l + 1]) + (p[4 * l + 2] + p[4 * l + 3]);
}

inline int32_t isum(const int16_t* w, const int8_t* a, int n) {
  int32_t s = 0;
  for (int e = 0; e < n; ++e) s += (int32_t)w[e] * a[e];
  return s;
}

struct IqJob {
  const int8_t* qa;
  const float* da;
  const int16_t* bsums;
  const uint8_t* w;
  float* y;
  int64_t m, k, n, row_bytes;
  int32_t type, kernel;
};

// x row (qa, da, bsums) · one decoded weight row, for the 256-element types (Q8_K).
float dot_q8k(const IqJob& j, const int16_t* w, const int16_t* w2, const float* dw, const int8_t* a,
              const float* da, const int16_t* bs) {
  const int64_t nsb = j.k / 256;
  const int32_t t = j.type;
  const float post = post_of(t);
  if (j.kernel == IQK_TILED) {
    float acc = 0.0f;
    for (int64_t sb = 0; sb < nsb; ++sb) {
      int32_t s = 0;
      const int16_t *wb = w + 256 * sb, *w2b = w2 + 256 * sb;
      const int8_t* ab = a + 256 * sb;
      if (iq1(t)) {
        for (int e = 0; e < 256; ++e) s += (int32_t)(8 * wb[e] + w2b[e]) * ab[e];
      } else {
        s = isum(wb, ab, 256);
      }
      const float r = (float)s * (dw[sb] * post);  // d · 1/8 etc.: exact
      acc = std::fma(r, da[sb], acc);
    }
    return acc;
  }
  float acc[8] = {0}, acc2[8] = {0}, acc1 = 0.0f;
  for (int64_t sb = 0; sb < nsb; ++sb) {
    int32_t l[8];
    lanes8(w + 256 * sb, a + 256 * sb, 256, l);
    if (ternary(t))
      for (int q = 0; q < 8; ++q) l[q] -= (int32_t)bs[16 * sb + 2 * q] + (int32_t)bs[16 * sb + 2 * q + 1];
    const float dd = dw[sb] * da[sb];
    for (int q = 0; q < 8; ++q) acc[q] = std::fma(dd, (float)l[q], acc[q]);
    if (t == IQ1_S) {
      acc1 = std::fma(dd, (float)isum(w2 + 256 * sb, a + 256 * sb, 256), acc1);
    } else if (t == IQ1_M) {
      int32_t l2[8];
      lanes8(w2 + 256 * sb, a + 256 * sb, 256, l2);
      for (int q = 0; q < 8; ++q) acc2[q] = std::fma(dd, (float)l2[q], acc2[q]);
    }
  }
  const float y = hsum8f(acc);
  if (t == IQ1_S) return y + 0.125f * acc1;
  if (t == IQ1_M) return y + 0.125f * hsum8f(acc2);
  return post != 1.0f ? y * post : y;
}

// The same for IQ4_NL / MXFP4 (Q8_0 activations, blocks of 32).
float dot_q8_0(const IqJob& j, const int16_t* w, const float* dw, const int8_t* a, const float* da) {
  const int64_t nb = j.k / 32;
  if (j.kernel == IQK_REPACK) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; ++b) acc = std::fma((float)isum(w + 32 * b, a + 32 * b, 32), dw[b] * da[b], acc);
    return acc;
  }
  float acc1[8] = {0}, acc2[8] = {0};
  auto block = [&](int64_t b, float* acc) {
    int32_t l[8];
    lanes8(w + 32 * b, a + 32 * b, 32, l);
    const float dd = dw[b] * da[b];
    for (int q = 0; q < 8; ++q) acc[q] = std::fma(dd, (float)l[q], acc[q]);
  };
  if (j.kernel == IQK_TINYBLAS) {
    for (int64_t b = 0; b < nb; ++b) block(b, acc1);
    return hsum8f(acc1);
  }
  const int64_t pairs = nb / 2 * 2;
  for (int64_t b = 0; b < pairs; b += 2) {
    block(b, acc1);
    block(b + 1, acc2);
  }
  float sum[8];
  for (int q = 0; q < 8; ++q) sum[q] = acc1[q] + acc2[q];
  float y = hsum8f(sum);
  if (nb % 2) {
    const int64_t b = nb - 1;
    y = std::fma(dw[b] * da[b], (float)isum(w + 32 * b, a + 32 * b, 32), y);
  }
  return y;
}

void iq_rows(const IqJob& j, int64_t n0, int64_t n1) {
  const int be = block_elems(j.type), bb = block_bytes(j.type);
  const int64_t nb = j.k / be;
  std::vector<int16_t> w(j.k), w2(iq1(j.type) ? j.k : 0);
  std::vector<float> dw(nb);
  const bool k_acts = !q8_0_type(j.type);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = j.w + n * j.row_bytes;
    if (!k_acts) {  // IQ4_NL / MXFP4: the codebook values straight from the nibbles
      const bool nl = j.type == IQ4_NL;
      const int8_t* table = nl ? IQ4NL_VALUES : MXFP4_VALUES;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = row + b * bb;
        const uint8_t* qs = blk + (nl ? 2 : 1);
        dw[b] = nl ? rdf16(blk) : e8m0_half(blk[0]);
        int16_t* wb = w.data() + 32 * b;
        for (int i = 0; i < 16; ++i) {
          wb[i] = table[qs[i] & 0xF];
          wb[i + 16] = table[qs[i] >> 4];
        }
      }
    } else {
      for (int64_t b = 0; b < nb; ++b)
        iq_dot_block(j.type, row + b * bb, w.data() + b * be, w2.empty() ? nullptr : w2.data() + b * be, &dw[b]);
    }
    for (int64_t m = 0; m < j.m; ++m) {
      const int8_t* a = j.qa + m * j.k;
      j.y[m * j.n + n] = k_acts ? dot_q8k(j, w.data(), w2.data(), dw.data(), a, j.da + m * nb, j.bsums + m * (j.k / 16))
                                : dot_q8_0(j, w.data(), dw.data(), a, j.da + m * nb);
    }
  }
}

ffi::Error QmmIQ(ffi::ThreadPool pool, ffi::Buffer<ffi::S8> qa, ffi::Buffer<ffi::F32> da,
                 ffi::Buffer<ffi::S16> bsums, ffi::Buffer<ffi::U8> w, ffi::BufferR0<ffi::S32> layer,
                 ffi::ResultBuffer<ffi::F32> y, int32_t type, int32_t kernel) {
  Weight wt;
  if (auto err = weight_of(w, layer, &wt); err.failure()) return err;
  if (!iq_dot_type(type)) return ffi::Error::InvalidArgument("LlamayQmmIQ: not an i-quant, TQ or MXFP4 weight");
  auto xd = qa.dimensions();
  const int64_t k = xd.size() == 0 ? 1 : xd.back();
  const int64_t m = k ? (int64_t)qa.element_count() / k : 0;
  const int be = block_elems(type);
  if (k % be || k / be * block_bytes(type) != wt.row_bytes)
    return ffi::Error::InvalidArgument("LlamayQmmIQ: x's last dim does not match the weight rows");
  const bool known = kernel == IQK_VEC || (q8_0_type(type) ? kernel == IQK_REPACK || kernel == IQK_TINYBLAS
                                                             : kernel == IQK_TILED && !ternary(type));
  if (!known)
    return ffi::Error::InvalidArgument("LlamayQmmIQ: that kernel does not exist for this type");
  if ((int64_t)da.element_count() != m * (k / be) || (int64_t)bsums.element_count() != m * (k / 16))
    return ffi::Error::InvalidArgument("LlamayQmmIQ: activation scales or sums of the wrong size");
  const IqJob job{qa.typed_data(), da.typed_data(), bsums.typed_data(), wt.data, y->typed_data(),
                  m, k, wt.n, wt.row_bytes, type, kernel};
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t per = std::max<int64_t>(8, (wt.n + 4 * threads - 1) / (4 * threads));
  parallel_for(pool, (wt.n + per - 1) / per, [&](int64_t task) {
    iq_rows(job, task * per, std::min(wt.n, (task + 1) * per));
  });
  return ffi::Error::Success();
}

}  // namespace
}  // namespace llamay

XLA_FFI_DEFINE_HANDLER_SYMBOL(LlamayQmmIQ, llamay::QmmIQ,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S16>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Arg<ffi::BufferR0<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int32_t>("ggml_type")
                                  .Attr<int32_t>("kernel"));
