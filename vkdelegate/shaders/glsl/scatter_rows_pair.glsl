#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"
#include "index_check.h"

// vkdelegate.index_put_pair (vkdelegate/ops/families/cache_update.py): two index_puts
// with one index tensor (a layer's K and V cache writes) in one dispatch. scatter_rows.glsl
// without POS_FROM_TENSOR and SRC_SCALAR, for two destinations of one size: invocations
// 0 .. numel - 1 write src's rows into out, the next numel src2's into out2, each as
// scatter_rows.glsl writes them (negative indices wrapped, an index ATen rejects sets
// the node's error flag and the element is not written).
// Defines: OUT_T, SRC_T, IDX_T (storage types), OUT_STORE(v), SRC_ACC (float or int).

TENSOR_OUT(out_data, OUT_T)
TENSOR_OUT(out2_data, OUT_T)
TENSOR_IN(src_data, SRC_T)
TENSOR_IN(src2_data, SRC_T)
TENSOR_IN(index_data, IDX_T)
PARAMS(scatter_block) {
  ivec4 info;   // x: region numel (of each), y: inner, z: count, w: size of the dim
  ivec4 check;  // x: error-flag word of this node
};
#include "scatter_pair.h"

void main() {
  const uint g = linear_id();
  const uint numel = uint(info.x);
  if (g >= 2u * numel) {
    return;
  }
  const bool second = g >= numel;
  const uint i = second ? g - numel : g;
  uint at;
  if (!scatter_target(i, info, check.x, at)) {
    return;
  }
  if (second) {
    out2_data[at] = OUT_STORE(SRC_ACC(src2_data[i]));
  } else {
    out_data[at] = OUT_STORE(SRC_ACC(src_data[i]));
  }
}
