// F16 / BF16 weights in llama.cpp's numerics (XLA FFI handler LlamayQmmGgmlFloat):
// y[M, N] = x[M, K] · W[N, K]ᵀ with x rounded to the weight's type (f16 / bf16, round to
// nearest even) and ggml's float dots, the f32 operations in their order, as
// `llamay.quant.ggml_float` emulates them (the tests' oracle, bit for bit):
// - F16, batched (llamafile's tinyBLAS<16>): one 16-lane accumulator, acc + a·b chunk
//   by chunk (products of f16 values are exact in f32), then reduce16;
// - F16, one row (ggml_vec_dot_f16): chunk i of 16 into accumulator i % 4 over the
//   multiples of 64, reduce16((s0 + s2) + (s1 + s3)), the leftover products added to it
//   in double (gf::dsum, rounded once);
// - BF16 (_mm512_dpbf16_ps): lane j of a 32-chunk gains a[2j+1]·b[2j+1], then
//   a[2j]·b[2j]; batched: one accumulator over all chunks, reduce16; one row: two, over
//   the halves of each 64, each reduced, both with the leftovers in double.
// Products are formed lane-wise in vectors of 16 (the adds are lane-wise too, so the
// order per output is the emulation's); each weight row is widened to f32 once per call
// and reused for every activation row (even/odd lanes split apart for BF16).

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ggml_float.h"
#include "operands.h"
#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace llamay {
namespace {

constexpr int32_t F16_T = 1, BF16_T = 30;  // GGML type ids

typedef float v16f __attribute__((vector_size(64)));

inline v16f ld16(const float* p) {
  v16f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline float f16_bits_to_f32(uint16_t h) {  // exact (the f16 value widened)
#if defined(__F16C__) && !defined(LLAMAY_SCALAR)
  return _cvtsh_ss(h);
#else
  const uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1F, m = h & 0x3FF;
  if (e == 0x1F) return gf::float_of(sign | 0x7F800000u | (m << 13));
  if (e) return gf::float_of(sign | ((e + 112) << 23) | (m << 13));
  return gf::float_of(sign | gf::bits_of((float)m * (1.0f / 16777216.0f)));
#endif
}
inline float round_bf16(float x) {  // RN-even to bf16 (NaNs kept NaN), as XLA converts
  const uint32_t u = gf::bits_of(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return gf::float_of((u | 0x00400000u) & 0xFFFF0000u);
  return gf::float_of((u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u);
}

// A row of K values as the dots read it: f32, and for BF16 each 32-chunk below `split`
// its even lanes then its odd ones (the products added in double stay in order).
void widen_row(const uint8_t* p, int64_t k, bool bf16, int64_t split, float* out) {
  const uint16_t* h = (const uint16_t*)p;
  if (!bf16) {
    for (int64_t i = 0; i < k; ++i) out[i] = f16_bits_to_f32(h[i]);
    return;
  }
  const int64_t main = split;
  for (int64_t c = 0; c < main; c += 32)
    for (int j = 0; j < 16; ++j) {
      out[c + j] = gf::float_of((uint32_t)h[c + 2 * j] << 16);
      out[c + 16 + j] = gf::float_of((uint32_t)h[c + 2 * j + 1] << 16);
    }
  for (int64_t i = main; i < k; ++i) out[i] = gf::float_of((uint32_t)h[i] << 16);
}

void round_row(const float* x, int64_t k, bool bf16, int64_t split, float* out) {
  if (!bf16) {
    for (int64_t i = 0; i < k; ++i) out[i] = gf::round_f16(x[i]);
    return;
  }
  const int64_t main = split;
  for (int64_t c = 0; c < main; c += 32)
    for (int j = 0; j < 16; ++j) {
      out[c + j] = round_bf16(x[c + 2 * j]);
      out[c + 16 + j] = round_bf16(x[c + 2 * j + 1]);
    }
  for (int64_t i = main; i < k; ++i) out[i] = round_bf16(x[i]);
}

struct Scratch {
  std::vector<float> parts, h, l;
};

// The leftover products [from, k) added in double to the reduced lanes red[0..nred).
float with_leftovers(const float* red, int nred, const float* a, const float* b, int64_t from, int64_t k,
                     Scratch& s) {
  s.parts.assign(red, red + nred);
  for (int64_t i = from; i < k; ++i) s.parts.push_back(a[i] * b[i]);
  float hi, lo;
  gf::dsum(s.parts.data(), (int64_t)s.parts.size(), s.h, s.l, hi, lo);
  return hi + lo;
}

float dot_f16(const float* a, const float* b, int64_t k, bool batched, Scratch& s) {
  float lanes[16];
  if (batched) {
    v16f acc = ld16(a) * ld16(b);
    for (int64_t c = 16; c < k; c += 16) acc = acc + ld16(a + c) * ld16(b + c);
    std::memcpy(lanes, &acc, 64);
    return gf::reduce16(lanes);
  }
  const int64_t main = k - k % 64;
  if (!main) return with_leftovers(nullptr, 0, a, b, 0, k, s);
  v16f acc[4];
  for (int j = 0; j < 4; ++j) acc[j] = ld16(a + 16 * j) * ld16(b + 16 * j);
  for (int64_t c = 64; c < main; c += 64)
    for (int j = 0; j < 4; ++j) acc[j] = acc[j] + ld16(a + c + 16 * j) * ld16(b + c + 16 * j);
  const v16f t = (acc[0] + acc[2]) + (acc[1] + acc[3]);
  std::memcpy(lanes, &t, 64);
  const float red = gf::reduce16(lanes);
  return k == main ? red : with_leftovers(&red, 1, a, b, main, k, s);
}

// One dpbf16 step over the 32-chunk at c (even lanes at c, odd at c + 16).
inline v16f dpbf16(v16f acc, const float* a, const float* b) {
  return (acc + ld16(a + 16) * ld16(b + 16)) + ld16(a) * ld16(b);
}
inline v16f dpbf16_first(const float* a, const float* b) {
  return ld16(a) * ld16(b) + ld16(a + 16) * ld16(b + 16);
}

float dot_bf16(const float* a, const float* b, int64_t k, bool batched, Scratch& s) {
  float lanes[16];
  if (batched) {
    v16f acc = dpbf16_first(a, b);
    for (int64_t c = 32; c < k; c += 32) acc = dpbf16(acc, a + c, b + c);
    std::memcpy(lanes, &acc, 64);
    return gf::reduce16(lanes);
  }
  const int64_t main = k - k % 64;
  if (!main) return with_leftovers(nullptr, 0, a, b, 0, k, s);
  v16f c1 = dpbf16_first(a, b), c2 = dpbf16_first(a + 32, b + 32);
  for (int64_t c = 64; c < main; c += 64) c1 = dpbf16(c1, a + c, b + c), c2 = dpbf16(c2, a + c + 32, b + c + 32);
  float red[2];
  std::memcpy(lanes, &c1, 64);
  red[0] = gf::reduce16(lanes);
  std::memcpy(lanes, &c2, 64);
  red[1] = gf::reduce16(lanes);
  return with_leftovers(red, 2, a, b, main, k, s);
}

ffi::Error QmmGgmlFloat(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::U8> w,
                        ffi::BufferR0<ffi::S32> layer, ffi::ResultBuffer<ffi::F32> y, int32_t type,
                        int32_t batched) {
  Weight wt;
  if (auto err = weight_of(w, layer, &wt); err.failure()) return err;
  if (type != F16_T && type != BF16_T) return ffi::Error::InvalidArgument("LlamayQmmGgmlFloat: F16 or BF16 weights");
  auto xd = x.dimensions();
  const int64_t k = xd.size() == 0 ? 1 : xd.back();
  const int64_t m = k ? (int64_t)x.element_count() / k : 0, n = wt.n;
  if (2 * k != wt.row_bytes) return ffi::Error::InvalidArgument("LlamayQmmGgmlFloat: x's last dim does not match the weight rows");
  const int step = type == BF16_T ? 32 : 16;
  if (batched && k % step) return ffi::Error::InvalidArgument("LlamayQmmGgmlFloat: the batched dot needs K % 16 (BF16: 32)");
  const bool bf16 = type == BF16_T;
  const int64_t split = batched ? k : k - k % 64;  // dpbf16 chunks (the rest in order)
  gf::ScopedFtz ftz;
  std::vector<float> xr(m * k);
  for (int64_t r = 0; r < m; ++r) round_row(x.typed_data() + r * k, k, bf16, split, xr.data() + r * k);
  float* out = y->typed_data();
  // tasks of whole weight rows, a few per thread; one task for a few microseconds of work
  const int64_t threads = pool.num_threads();
  int64_t per = n * k * m < ((int64_t)1 << 17) ? n : std::max<int64_t>(16, (n + 4 * threads - 1) / (4 * threads));
  per = std::max<int64_t>(per, 1);
  parallel_for(pool, (n + per - 1) / per, [&](int64_t task) {
    gf::ScopedFtz ftz_here;  // pool threads: XLA's settings are not theirs to assume
    std::vector<float> row(k);
    Scratch s;
    for (int64_t c = task * per; c < std::min(n, (task + 1) * per); ++c) {
      widen_row(wt.data + c * wt.row_bytes, k, bf16, split, row.data());
      for (int64_t r = 0; r < m; ++r)
        out[r * n + c] = bf16 ? dot_bf16(xr.data() + r * k, row.data(), k, batched, s)
                              : dot_f16(xr.data() + r * k, row.data(), k, batched, s);
    }
  });
  return ffi::Error::Success();
}

}  // namespace
}  // namespace llamay

XLA_FFI_DEFINE_HANDLER_SYMBOL(LlamayQmmGgmlFloat, llamay::QmmGgmlFloat,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Arg<ffi::BufferR0<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int32_t>("ggml_type")
                                  .Attr<int32_t>("batched"));
