#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"

// Sum over any set of dims. One invocation per output element; it walks the reduced
// dims sequentially, accumulating in ACC_T (fp32 for fp16 data).
// Defines: OUT_T, IN_T, OUT_STORE(v), ACC_T. The reduced dims are a bitmask in
// `mask.x`, bit d for metadata dim d (innermost first). The output is contiguous
// over the kept dims in their order, whether keepdim is set or not, so the output
// index maps to kept-dim coordinates of the input directly. Sizes come from in_meta,
// so a resize needs no change here.

TENSOR_OUT(0, out_data, OUT_T)
TENSOR_IN(1, in_data, IN_T)
TENSOR_META(2, out_meta)
TENSOR_META(3, in_meta)
layout(set = 0, binding = 4) uniform reduce_block { ivec4 mask; };

void main() {
  const uint o = linear_id();
  if (o >= uint(numel_of(out_meta))) {
    return;
  }
  uint rem = o;
  int base = 0;
  uint count = 1u;
  [[unroll]] for (int d = 0; d < 8; ++d) {
    const int size = size_at(in_meta, d);
    if ((mask.x & (1 << d)) != 0) {
      count *= uint(size);
    } else {
      base += int(rem % uint(size)) * stride_at(in_meta, d);
      rem /= uint(size);
    }
  }
  ACC_T acc = ACC_T(0);
  for (uint r = 0u; r < count; ++r) {
    uint rr = r;
    int offset = base;
    [[unroll]] for (int d = 0; d < 8; ++d) {
      if ((mask.x & (1 << d)) != 0) {
        const int size = size_at(in_meta, d);
        offset += int(rr % uint(size)) * stride_at(in_meta, d);
        rr /= uint(size);
      }
    }
    acc += ACC_T(in_data[offset]);
  }
  out_data[o] = OUT_STORE(acc);
}
