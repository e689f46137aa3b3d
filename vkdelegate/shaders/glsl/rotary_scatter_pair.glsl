#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"
#include "index_check.h"

// vkdelegate.rotary_index_put_pair (vkdelegate/ops/families/cache_update.py): a
// decoder layer's rotary embedding and its K and V cache writes in one dispatch.
//   invocations 0 .. numel(q) - 1: q' = rotary_half(q) (rotary_half_pair.glsl's q);
//   the next `region`: k's element i rotated (rotary_half.h) and written to the row
//     index[j] of cache (scatter_rows_pair.glsl's first destination);
//   the next `region`: v's element i written to cache2 alike.
// k and v hold the region's elements in order (the op checks at load). Negative
// indices wrap; an index ATen rejects sets the node's error flag and the element is
// not written. Each element gets the bits rotary_half_pair then index_put_pair give
// it (the rotated key is rounded once, to the cache's dtype, as k' was). q, k and v
// start at elements offsets.x, .y, .z of their buffers (vkdelegate.
// rms_norm_linear_rotary_cache's unfused form binds the merged product's row for all
// three; else 0).
// Defines: OUT_T, IN_T, F_T, IDX_T (storage types), OUT_STORE(v), SRC_ACC.

TENSOR_OUT(out_data, OUT_T)
TENSOR_OUT(cache_data, OUT_T)
TENSOR_OUT(cache2_data, OUT_T)
TENSOR_IN(in_data, IN_T)
TENSOR_IN(in2_data, IN_T)
TENSOR_IN(cos_data, F_T)
TENSOR_IN(sin_data, F_T)
TENSOR_IN(src2_data, IN_T)
TENSOR_IN(index_data, IDX_T)
PARAMS(rotary_scatter_block) {
  ivec4 info;       // x: numel(q), y: D / 2, z: the region's numel (k's, v's)
  ivec4 sizes;      // q's sizes, outermost first, padded with leading 1s to rank 4
  ivec4 fstrides;   // element strides of cos/sin along q's 4 dims (0: broadcast)
  ivec4 sizes2;     // k's sizes
  ivec4 fstrides2;  // element strides of cos/sin along k's 4 dims
  ivec4 scatter;    // x: region numel, y: inner, z: count, w: size of the dim
  ivec4 check;      // x: error-flag word of this node
  ivec4 offsets;    // x, y, z: where q, k, v start in in_data, in2_data, src2_data
};
#include "rotary_half.h"
#include "scatter_pair.h"

void main() {
  const uint g = linear_id();
  const uint nq = uint(info.x);
  const uint half_d = uint(info.y);
  const uint numel = uint(scatter.x);
  if (g < nq) {
    out_data[g] = OUT_STORE(ROTARY_HALF_AT(in_data, uint(offsets.x), g, sizes, fstrides,
                                          half_d));
    return;
  }
  if (g - nq >= 2u * numel) {
    return;
  }
  const bool second = g - nq >= numel;
  const uint i = second ? g - nq - numel : g - nq;
  uint at;
  if (!scatter_target(i, scatter, check.x, at)) {
    return;
  }
  if (second) {
    cache2_data[at] = OUT_STORE(SRC_ACC(src2_data[uint(offsets.z) + i]));
  } else {
    cache_data[at] = OUT_STORE(ROTARY_HALF_AT(in2_data, uint(offsets.y), i, sizes2,
                                              fstrides2, half_d));
  }
}
