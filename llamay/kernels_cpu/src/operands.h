// Operands shared by the matmul handlers: the weight, [N, row_bytes] or a stack of
// layers [L, N, row_bytes] with the one to use (an s32 scalar operand, so that a layer
// scan hands XLA's buffer of the whole stack to the kernel instead of copying out each
// layer's slice first, which XLA does for a custom call's operand).
#pragma once

#include <cstdint>

#include "xla/ffi/api/ffi.h"

namespace llamay {

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

}  // namespace llamay
