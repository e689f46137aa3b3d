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
  ivec4 bp_info;       // x: output numel; CHUNK > 1: y invocations, z per row
};

int plan_numel() { return bp_info.x; }

// Operand 0..2 strides of plan dim d (a constant in the unrolled loops: a dynamic
// index into the ivec4 arrays is slow on llvmpipe).
ivec3 dim_strides(int d) {
  return ivec3(bp_stride[d >> 2][d & 3], bp_stride[2 + (d >> 2)][d & 3],
               bp_stride[4 + (d >> 2)][d & 3]);
}

// Adds to `o` the operand offsets of plan dims D0 .. NDIM - 1 whose coordinates,
// row-major, are `rem` (a uint variable, consumed); D0 a literal, so the loop unrolls.
#define WALK_PLAN_DIMS(D0, rem, o)                               \
  [[unroll]] for (int d = D0; d < NDIM; ++d) {                   \
    uint c;                                                      \
    if (d == NDIM - 1) {                                         \
      c = rem;                                                   \
    } else {                                                     \
      const uint size = uint(bp_size[d >> 2][d & 3]);            \
      const uint q = rem / size;                                 \
      c = rem - q * size;                                        \
      rem = q;                                                   \
    }                                                            \
    o += int(c) * dim_strides(d);                                \
  }

// Offsets of operands 0..2 for output element i.
ivec3 plan_offsets(uint i) {
  uint rem = i;
  ivec3 o = ivec3(0);
  WALK_PLAN_DIMS(0, rem, o)
  return o;
}

// CHUNK (kernels/broadcast.py chunk_for): output elements per invocation along the
// innermost plan dim: 1, or on CPU drivers up to 8, where walking the plan (a
// division and parameter loads per dim, lane by lane on llvmpipe) then serves CHUNK
// elements at once. The shader loops j over CHUNK; element j is first + j, at
// operand offsets o + j * dim_strides(0), and exists for j < count.
layout(constant_id = 4) const int CHUNK = 1;

// Invocation t's first output element, its operand offsets and how many of its CHUNK
// elements exist; false past the plan (bp_info.y invocations, bp_info.z per row of
// the innermost plan dim, when CHUNK > 1).
bool plan_chunk(uint t, out uint first, out ivec3 o, out int count) {
  first = t;
  o = ivec3(0);
  count = 1;
  if (CHUNK == 1) {
    if (t >= uint(bp_info.x)) {
      return false;
    }
    o = plan_offsets(t);
    return true;
  }
  if (t >= uint(bp_info.y)) {
    return false;
  }
  const uint per_row = uint(bp_info.z);
  uint rem = t / per_row;
  const int c0 = int(t - rem * per_row) * CHUNK;
  const int size0 = bp_size[0].x;
  first = rem * uint(size0) + uint(c0);
  count = min(CHUNK, size0 - c0);
  o = c0 * dim_strides(0);
  WALK_PLAN_DIMS(1, rem, o)
  return true;
}

#endif
