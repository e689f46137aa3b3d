#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"
#include "index_check.h"

// Rows picked by an index tensor along one dim: index_select, embedding and
// index.Tensor with one index tensor (vkdelegate/ops/families/indexing.py).
// The input is viewed as [outer, size, inner] around the indexed dim, the output as
// [outer, count, inner] with count = numel of the index tensor:
//   out[o, j, k] = in[o, index[j], k]
// Negative indices count from the end where ATen allows them (index.Tensor only);
// indices that ATen would reject set this node's error flag (index_check.h) and are
// clamped so that no read leaves the buffer.
// Defines: OUT_T, IN_T, IDX_T (storage types), OUT_STORE(v), IN_ACC (float or int).

TENSOR_OUT(out_data, OUT_T)
TENSOR_IN(in_data, IN_T)
TENSOR_IN(index_data, IDX_T)
PARAMS(rows_block) {
  ivec4 info;   // x: out numel, y: inner, z: count, w: size of the indexed dim
  ivec4 check;  // x: error-flag word of this node, y: 1 if negative indices wrap
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
    atomicOr(error_flags[check.x], 1u);
    out_data[i] = OUT_STORE(IN_ACC(0));
    return;
  }
  const int idx = checked_index(int(index_data[j]), size, check.y != 0, check.x);
  const uint src = (o * uint(size) + uint(idx)) * inner + k;
  out_data[i] = OUT_STORE(IN_ACC(in_data[src]));
}
