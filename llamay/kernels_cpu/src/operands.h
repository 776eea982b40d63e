// Operands shared by the matmul handlers: the weight, [N, row_bytes] or a stack of
// layers [L, N, row_bytes] with the one to use (an s32 scalar operand, so that a layer
// scan hands XLA's buffer of the whole stack to the kernel instead of copying out each
// layer's slice first, which XLA does for a custom call's operand).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace llamay {

// Software prefetch of weight bytes ahead of their use. The decode GEMVs stream each
// weight once, from L3 or memory, and the loads of each block's scale stalled there
// (perf, a Sapphire Rapids host; the hardware prefetchers follow interleaved rows
// poorly). PREFETCH_AHEAD bytes ahead in each row stream, tg128 batch 1 there, none ->
// 1 KiB -> 2 -> 4 -> 8: SmolLM2 exact 117 -> 145 -> 155 -> 156 -> 156 tok/s, Gemma 3
// exact 38 -> 57 -> 65 -> 69 -> 69 (llamacpp numerics alike). An AMD Zen 3 host showed no
// change from prefetching (session 8).
constexpr int64_t PREFETCH_AHEAD = 4096;
inline void prefetch(const void* p) { __builtin_prefetch(p, 0, 3); }

struct Weight {
  const uint8_t* data;
  int64_t n, row_bytes;
};

inline xla::ffi::Error weight_of(const xla::ffi::Buffer<xla::ffi::DataType::U8>& w,
                                 const xla::ffi::BufferR0<xla::ffi::DataType::S32>& layer,
                                 Weight* out) {
  auto wd = w.dimensions();
  if (wd.size() != 2 && wd.size() != 3)
    return xla::ffi::Error::InvalidArgument("llamay kernels: the weight must be [N, bytes] or [L, N, bytes]");
  const int64_t n = wd[wd.size() - 2], rb = wd.back();
  int64_t index = 0;
  if (wd.size() == 3) {
    index = *layer.typed_data();
    if (index < 0 || index >= wd[0]) return xla::ffi::Error::InvalidArgument("llamay kernels: layer index out of range");
  }
  *out = Weight{w.typed_data() + index * n * rb, n, rb};
  return xla::ffi::Error::Success();
}

// The stacks of a grouped call (LlamayQmmExactMulti, LlamayQmmGgmlMulti): operands
// (w, layer) per stack, results[i] the result stack i computes. A weight whose type
// differs per layer (Gemma's Q4_K/Q6_K roles) is several stacks with one result, each
// stack's layer its entry for this layer or -1 where another stack holds it. Calls
// take(i, w, layer, y) for each stack taking part; exactly one stack of each result must.
template <typename Take>
xla::ffi::Error for_each_stack(const char* name, xla::ffi::RemainingArgs args, xla::ffi::RemainingRets rets,
                               xla::ffi::Span<const int32_t> results, Take take) {
  using xla::ffi::Error;
  const int64_t count = (int64_t)results.size(), nres = (int64_t)rets.size();
  const auto fail = [name](const char* what) { return Error::InvalidArgument(std::string(name) + ": " + what); };
  if ((int64_t)args.size() != 2 * count) return fail("one (weight, layer) and one result index per stack");
  std::vector<int> taken(nres, 0);
  for (int64_t i = 0; i < count; ++i) {
    if (results[i] < 0 || results[i] >= nres) return fail("result index out of range");
    auto w = args.get<xla::ffi::Buffer<xla::ffi::DataType::U8>>(2 * i);
    auto layer = args.get<xla::ffi::BufferR0<xla::ffi::DataType::S32>>(2 * i + 1);
    auto y = rets.get<xla::ffi::Buffer<xla::ffi::DataType::F32>>(results[i]);
    if (w.has_error()) return w.error();
    if (layer.has_error()) return layer.error();
    if (y.has_error()) return y.error();
    if (w->dimensions().size() == 3 && *layer->typed_data() < 0) continue;  // another stack's layer
    ++taken[results[i]];
    if (auto err = take(i, *w, *layer, (*y)->typed_data()); err.failure()) return err;
  }
  for (int t : taken)
    if (t != 1) return fail("each result needs exactly one stack at this layer");
  return Error::Success();
}

}  // namespace llamay
