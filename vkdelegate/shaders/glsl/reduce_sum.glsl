#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"

// Sum over any set of dims, accumulating in ACC_T (fp32 for fp16 data).
// Defines: OUT_T, IN_T, OUT_STORE(v), ACC_T; WG_REDUCE=<n> for the cooperative form.
// The reduced dims are a bitmask in `mask.x` (index arithmetic: reduced_dims.h).
// Sizes come from in_meta, so a resize needs no change here.
// Two forms:
// - default: one invocation per output walks its reduced elements (many outputs,
//   short reductions);
// - WG_REDUCE=n: one workgroup of n invocations (a power of two, equal to the local
//   size) per output; each sums a strided share, then a tree in shared memory adds
//   the n partial sums (few outputs, long reductions: a sum to one value would
//   otherwise run on one invocation).

TENSOR_OUT(out_data, OUT_T)
TENSOR_IN(in_data, IN_T)
TENSOR_META(out_meta)
TENSOR_META(in_meta)
PARAMS(reduce_block) { ivec4 mask; };

#include "reduced_dims.h"

#ifdef WG_REDUCE
shared ACC_T partial[WG_REDUCE];

void main() {
  const uint o = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  if (o >= uint(numel_of(out_meta))) {
    return;  // the whole workgroup leaves together: no barrier is split
  }
  uint count;
  const int base = kept_base(o, count);
  const uint lid = gl_LocalInvocationID.x;
  ACC_T acc = ACC_T(0);
  // 16 loads per loop iteration (see LOOP_LIMIT in common.h), consecutive lanes
  // reading consecutive reduced elements; each block of 16 is summed apart first,
  // which keeps the rounding error of long sums down.
  for (uint r0 = 0u; r0 < count; r0 += 16u * WG_REDUCE) {
    ACC_T block = ACC_T(0);
    [[unroll]] for (uint j = 0u; j < 16u; ++j) {
      const uint r = r0 + j * WG_REDUCE + lid;
      if (r < count) {
        block += ACC_T(in_data[reduced_offset(base, r)]);
      }
    }
    acc += block;
  }
  partial[lid] = acc;
  barrier();
  for (uint s = WG_REDUCE / 2; s > 0u; s >>= 1) {
    if (lid < s) {
      partial[lid] += partial[lid + s];
    }
    barrier();
  }
  if (lid == 0u) {
    out_data[o] = OUT_STORE(partial[0]);
  }
}
#else
void main() {
  const uint o = linear_id();
  if (o >= uint(numel_of(out_meta))) {
    return;
  }
  uint count;
  const int base = kept_base(o, count);
  ACC_T acc = ACC_T(0);
  // 16 loads per loop iteration (see LOOP_LIMIT in common.h), then the remainder;
  // each block of 16 is summed apart first, which keeps the rounding error down.
  const uint full = count & ~15u;
  for (uint r0 = 0u; r0 < full; r0 += 16u) {
    ACC_T block = ACC_T(0);
    [[unroll]] for (uint j = 0u; j < 16u; ++j) {
      block += ACC_T(in_data[reduced_offset(base, r0 + j)]);
    }
    acc += block;
  }
  for (uint r = full; r < count; ++r) {
    acc += ACC_T(in_data[reduced_offset(base, r)]);
  }
  out_data[o] = OUT_STORE(acc);
}
#endif
