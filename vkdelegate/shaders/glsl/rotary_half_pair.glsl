#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"

// vkdelegate.rotary_half_pair (vkdelegate/ops/families/rotary.py): rotary_half.glsl
// for two tensors (a layer's q and k) rotated by one cos/sin, in one dispatch:
// invocations 0 .. numel(q) - 1 compute q's elements, the next numel(k) k's, each with
// rotary_half.h's expression (fp32 math, one rounding), so every element has the
// bits the unpaired op gives it.
// Defines: OUT_T, IN_T, F_T (storage types), OUT_STORE(v).

TENSOR_OUT(out_data, OUT_T)
TENSOR_OUT(out2_data, OUT_T)
TENSOR_IN(in_data, IN_T)
TENSOR_IN(in2_data, IN_T)
TENSOR_IN(cos_data, F_T)
TENSOR_IN(sin_data, F_T)
PARAMS(rotary_half_pair_block) {
  ivec4 info;       // x: numel(q), y: D / 2, z: numel(k)
  ivec4 sizes;      // q's sizes, outermost first, padded with leading 1s to rank 4
  ivec4 fstrides;   // element strides of cos/sin along q's 4 dims (0: broadcast)
  ivec4 sizes2;     // k's sizes
  ivec4 fstrides2;  // element strides of cos/sin along k's 4 dims
};
#include "rotary_half.h"

void main() {
  const uint g = linear_id();
  const uint nq = uint(info.x);
  const uint half_d = uint(info.y);
  if (g < nq) {
    out_data[g] = OUT_STORE(ROTARY_HALF(in_data, g, sizes, fstrides, half_d));
  } else if (g - nq < uint(info.z)) {
    const uint i = g - nq;
    out2_data[i] = OUT_STORE(ROTARY_HALF(in2_data, i, sizes2, fstrides2, half_d));
  }
}
