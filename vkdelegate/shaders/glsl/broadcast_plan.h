// Broadcast plan of an elementwise op: output index -> operand offsets.
// Declared by PLAN_PARAMS in vkdelegate/kernels/broadcast.py, which folds the
// shapes into NDIM plan dims (output dims of size 1 dropped, dims no operand separates
// merged) and rewrites the block after every resize; no per-element metadata walk.
#ifndef VKDELEGATE_BROADCAST_PLAN_H
#define VKDELEGATE_BROADCAST_PLAN_H

// The plan's rank, fixed per node (resizes never add plan dims). Integer division has
// no SIMD form on CPUs (llvmpipe scalarizes it): the outermost plan dim needs none,
// so operands of one shape (NDIM 1) cost no division at all.
layout(constant_id = 3) const int NDIM = 8;

PARAMS(broadcast_plan_block) {
  ivec4 bp_size[2];    // plan dim sizes, innermost first, padded with 1
  ivec4 bp_stride[6];  // operand k's strides at rows 2k, 2k + 1 (0: broadcast)
  ivec4 bp_info;       // x: output numel
};

int plan_numel() { return bp_info.x; }

// Offsets of operands 0..2 for output element i. d is a constant in the unrolled loop:
// a dynamic index into the ivec4 arrays is slow on llvmpipe.
ivec3 plan_offsets(uint i) {
  uint rem = i;
  ivec3 o = ivec3(0);
  [[unroll]] for (int d = 0; d < NDIM; ++d) {
    uint c;
    if (d == NDIM - 1) {
      c = rem;
    } else {
      const uint size = uint(bp_size[d >> 2][d & 3]);
      const uint q = rem / size;
      c = rem - q * size;
      rem = q;
    }
    o += int(c) * ivec3(bp_stride[d >> 2][d & 3], bp_stride[2 + (d >> 2)][d & 3],
                        bp_stride[4 + (d >> 2)][d & 3]);
  }
  return o;
}

#endif
