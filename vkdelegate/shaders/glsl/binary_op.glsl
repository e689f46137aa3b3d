#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"
#include "elementwise_math.h"
#include "broadcast_plan.h"

// Elementwise binary op with full broadcasting: out = OP_EXPR(a, b).
// Defines: OUT_T, A_T, B_T (storage types), OUT_STORE(v) (store conversion), ACC_T
// (float or int: the computation type), ACC_FLOAT (set for float math), A_LOAD(v) and
// B_LOAD(v) (storage value -> ACC_T; integer storage reaches float math through int,
// as 8-bit storage only converts to 32-bit ints), OP_EXPR (expression in a, b and
// ALPHA, e.g. "a + ALPHA * b"; one entry per op in vkdelegate/ops/families/binary.py).
// Inputs broadcast on any axis: a dim of size 1 (or missing) repeats; the host's
// broadcast plan (broadcast_plan.h) maps the output index to input offsets. One
// invocation per output element, or per CHUNK consecutive ones on CPU drivers
// (broadcast_plan.h); the grid is sized for the upper bound, the current numel comes
// from the plan.
// CHECK_INT32 (int64 add / sub / mul / division, and every integer division,
// remainder and fmod: kernels/binary_dispatch.py): OP_EXPR uses int_checked.h's
// add_checked / mul_checked / div_guard / zero_guard, and a result past the int32 range
// (bit 1) or a zero divisor (bit 2) sets error_flags[iscalars.y].

TENSOR_OUT(out_data, OUT_T)
TENSOR_IN(a_data, A_T)
TENSOR_IN(b_data, B_T)
PARAMS(scalars_block) { vec4 fscalars; ivec4 iscalars; };
#ifdef CHECK_INT32
#include "int_checked.h"
#endif

#ifdef ACC_FLOAT
#define ALPHA fscalars.x
#else
#define ALPHA iscalars.x
#endif

void main() {
  uint i;
  ivec3 o0;
  int count;
  if (!plan_chunk(linear_id(), i, o0, count)) {
    return;
  }
  const ivec3 step = dim_strides(0);
  [[unroll]] for (int j = 0; j < CHUNK; ++j) {
    if (j < count) {
      const ivec3 o = o0 + j * step;
      const ACC_T a = A_LOAD(a_data[o.x]);
      const ACC_T b = B_LOAD(b_data[o.y]);
      out_data[i + j] = OUT_STORE(OP_EXPR);
    }
  }
#ifdef CHECK_INT32
  report_overflow(iscalars.y);
#endif
}
