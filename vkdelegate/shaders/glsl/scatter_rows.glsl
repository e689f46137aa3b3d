#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"
#include "index_check.h"

// Rows of `out` along one dim overwritten by the rows of `src`
// (vkdelegate/ops/families/cache_update.py): index_copy, index_put with one index
// tensor, and slice_scatter_at (a KV-cache write at a position read from a tensor).
// `out` (already holding a copy of the destination tensor) is viewed as
// [outer, size, inner] around the dim, the update region as [outer, count, inner]:
//   out[o, row(j), k] = src[o, j, k]      (src[0] when SRC_SCALAR: a broadcast value)
// row(j) = index[j] (POS_FROM_TENSOR unset: wrapped from the end when check.y != 0, as
// ATen's index_put; an index ATen rejects sets the node's error flag and the element is
// not written), or pos[0] + j (POS_FROM_TENSOR: the position read on the device; a
// position with pos[0] < 0 or pos[0] + count > size sets the error flag and nothing
// of the region is written, as ExecuTorch's update_cache refuses it).
// Defines: OUT_T, SRC_T, IDX_T (storage types), OUT_STORE(v), SRC_ACC (float or int),
// POS_FROM_TENSOR, SRC_SCALAR.

TENSOR_OUT(out_data, OUT_T)
TENSOR_IN(src_data, SRC_T)
TENSOR_IN(index_data, IDX_T)
PARAMS(scatter_block) {
  ivec4 info;   // x: region numel, y: inner, z: count, w: size of the dim
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
#ifdef POS_FROM_TENSOR
  const int start = int(index_data[0]);
  if (start < 0 || start > size - int(count)) {
    atomicOr(error_flags[check.x], 1u);
    return;
  }
  const int row = start + int(j);
#else
  const int raw = int(index_data[j]);
  const int wrapped = (check.y != 0 && raw < 0) ? raw + size : raw;
  if (wrapped < 0 || wrapped >= size) {
    atomicOr(error_flags[check.x], 1u);
    return;
  }
  const int row = wrapped;
#endif
#ifdef SRC_SCALAR
  const uint s = 0u;
#else
  const uint s = i;
#endif
  out_data[(o * uint(size) + uint(row)) * inner + k] = OUT_STORE(SRC_ACC(src_data[s]));
}
