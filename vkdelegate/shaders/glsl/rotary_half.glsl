#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"

// vkdelegate.rotary_half (vkdelegate/ops/families/rotary.py): HF transformers' rotary
// embedding, out = x * cos + rotate_half(x) * sin with rotate_half(x) = cat(-x2, x1)
// (x1, x2 the halves of the last dim), cos/sin broadcast to x. One invocation per
// element, fp32 math, one rounding to the output dtype.
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

void main() {
  const uint i = linear_id();
  if (i >= uint(info.x)) {
    return;
  }
  const uint half_d = uint(info.y);
  const uint d = i % uint(sizes.w);
  const uint r = i / uint(sizes.w);
  const uint c2 = r % uint(sizes.z);
  const uint c1 = (r / uint(sizes.z)) % uint(sizes.y);
  const uint c0 = r / uint(sizes.z * sizes.y);
  const uint f = c0 * uint(fstrides.x) + c1 * uint(fstrides.y) + c2 * uint(fstrides.z)
      + d * uint(fstrides.w);
  const float x = float(in_data[i]);
  const float partner = d < half_d ? -float(in_data[i + half_d]) : float(in_data[i - half_d]);
  out_data[i] = OUT_STORE(x * float(cos_data[f]) + partner * float(sin_data[f]));
}
