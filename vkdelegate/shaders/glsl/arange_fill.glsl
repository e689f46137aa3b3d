#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"

// out[i] = start + i * step: arange, and full / full_like with step 0
// (vkdelegate/ops/families/creation.py). Float outputs compute in fp32 from the
// float row, integer outputs in int32 from the int row (the host has already converted
// the values to the output dtype, so int8/uint8/bool fills need no wrapping here).
// Defines: OUT_T, OUT_STORE(v) (storage), ACC_FLOAT for float outputs.

TENSOR_OUT(out_data, OUT_T)
PARAMS(range_block) {
  ivec4 iinfo;  // x: numel, y: int start, z: int step
  vec4 finfo;   // x: float start, y: float step
};

void main() {
  const uint i = linear_id();
  if (i >= uint(iinfo.x)) {
    return;
  }
#ifdef ACC_FLOAT
  out_data[i] = OUT_STORE(finfo.x + float(i) * finfo.y);
#else
  out_data[i] = OUT_STORE(iinfo.y + int(i) * iinfo.z);
#endif
}
