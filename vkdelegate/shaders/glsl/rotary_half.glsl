#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"

// vkdelegate.rotary_half (vkdelegate/ops/families/rotary.py): HF transformers' rotary
// embedding (rotary_half.h documents the expression), one invocation per element, fp32
// math, one rounding to the output dtype.
// Defines: OUT_T, IN_T, F_T (storage types), OUT_STORE(v).

TENSOR_OUT(out_data, OUT_T)
TENSOR_IN(in_data, IN_T)
TENSOR_IN(cos_data, F_T)
TENSOR_IN(sin_data, F_T)
PARAMS(rotary_half_block) {
  ivec4 info;      // x: numel, y: D / 2
  ivec4 sizes;     // x's sizes, outermost first, padded with leading 1s to rank 4
  ivec4 fstrides;  // element strides of cos/sin along x's 4 dims (0: broadcast)
};
#include "rotary_half.h"

void main() {
  const uint i = linear_id();
  if (i >= uint(info.x)) {
    return;
  }
  out_data[i] = OUT_STORE(ROTARY_HALF(in_data, i, sizes, fstrides, uint(info.y)));
}
