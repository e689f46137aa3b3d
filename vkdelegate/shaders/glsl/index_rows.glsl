#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"

// Rows picked by an index tensor along one dim: index_select, embedding and
// index.Tensor with one index tensor (vkdelegate/backend/ops/indexing.py).
// The input is viewed as [outer, size, inner] around the indexed dim, the output as
// [outer, count, inner] with count = numel of the index tensor:
//   out[o, j, k] = in[o, index[j], k]
// Negative indices count from the end, as in ATen; indices that ATen would reject
// (out of range) are clamped so that no read leaves the buffer.
// Defines: OUT_T, IN_T, IDX_T (storage types), OUT_STORE(v), IN_ACC (float or int).

TENSOR_OUT(0, out_data, OUT_T)
TENSOR_IN(1, in_data, IN_T)
TENSOR_IN(2, index_data, IDX_T)
layout(set = 0, binding = 3) uniform rows_block {
  ivec4 info;  // x: out numel, y: inner, z: count, w: size of the indexed dim
};

void main() {
  const uint i = linear_id();
  if (i >= uint(info.x)) {
    return;
  }
  const uint inner = uint(info.y);
  const uint count = uint(info.z);
  const int size = info.w;
  const uint k = i % inner;
  const uint j = (i / inner) % count;
  const uint o = i / (inner * count);
  if (size <= 0) {  // ATen raises here (nothing to pick from); write zeros instead
    out_data[i] = OUT_STORE(IN_ACC(0));
    return;
  }
  int idx = int(index_data[j]);
  idx = idx < 0 ? idx + size : idx;
  idx = clamp(idx, 0, size - 1);
  const uint src = (o * uint(size) + uint(idx)) * inner + k;
  out_data[i] = OUT_STORE(IN_ACC(in_data[src]));
}
