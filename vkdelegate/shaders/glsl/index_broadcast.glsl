#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"
#include "index_check.h"

// index.Tensor with K = 2..4 index tensors on consecutive dims d..d+K-1, broadcast
// together to the shape B (vkdelegate/ops/families/indexing.py). With x viewed as
// [outer, size_0, ..., size_{K-1}, inner] and the output as [outer, numel(B), inner]:
//   out[o, j, k] = x[o, index_0[j], ..., index_{K-1}[j], k]
// where index_t[j] reads index tensor t at B-coordinate j through its broadcast
// strides (0 along a broadcast dim). Negative indices count from the end (-size..
// size-1, as ATen's index.Tensor); an index ATen rejects sets the node's error flag
// (index_check.h) and is clamped, so no read leaves the buffer.
// Defines: OUT_T, IN_T, IDX_T (storage types), OUT_STORE(v), IN_ACC (float or int).

TENSOR_OUT(out_data, OUT_T)
TENSOR_IN(in_data, IN_T)
TENSOR_IN(index0, IDX_T)
TENSOR_IN(index1, IDX_T)
TENSOR_IN(index2, IDX_T)
TENSOR_IN(index3, IDX_T)
PARAMS(index_broadcast_block) {
  ivec4 info;      // x: out numel, y: inner, z: K, w: error-flag word of this node
  ivec4 bshape;    // B's sizes, outermost first, padded with leading 1s to rank 4
  ivec4 sizes;     // sizes of x's indexed dims d..d+K-1 (unused entries 1)
  ivec4 strides0;  // element strides of index tensor t along B's 4 dims (0: broadcast)
  ivec4 strides1;
  ivec4 strides2;
  ivec4 strides3;
};

int index_at(int t, int offset) {
  if (t == 0) return int(index0[offset]);
  if (t == 1) return int(index1[offset]);
  if (t == 2) return int(index2[offset]);
  return int(index3[offset]);
}

ivec4 strides_of(int t) {
  if (t == 0) return strides0;
  if (t == 1) return strides1;
  if (t == 2) return strides2;
  return strides3;
}

void main() {
  const uint i = linear_id();
  if (i >= uint(info.x)) {
    return;
  }
  const uint inner = uint(info.y);
  const uint nb = uint(bshape.x * bshape.y * bshape.z * bshape.w);
  const uint k = i % inner;
  const uint j = (i / inner) % nb;
  const uint o = i / (inner * nb);
  // B-coordinates of j, innermost (w) first.
  ivec4 c;
  c.w = int(j % uint(bshape.w));
  c.z = int((j / uint(bshape.w)) % uint(bshape.z));
  c.y = int((j / uint(bshape.w * bshape.z)) % uint(bshape.y));
  c.x = int(j / uint(bshape.w * bshape.z * bshape.y));
  uint src = o;
  for (int t = 0; t < 4; ++t) {
    if (t >= info.z) {
      break;
    }
    const int size = sizes[t];
    if (size <= 0) {  // ATen raises (nothing to pick from); write zeros instead
      atomicOr(error_flags[info.w], 1u);
      out_data[i] = OUT_STORE(IN_ACC(0));
      return;
    }
    const ivec4 s = strides_of(t);
    const int offset = c.x * s.x + c.y * s.y + c.z * s.z + c.w * s.w;
    const int idx = checked_index(index_at(t, offset), size, true, info.w);
    src = src * uint(size) + uint(idx);
  }
  out_data[i] = OUT_STORE(IN_ACC(in_data[src * inner + k]));
}
