#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"
#include "elementwise_math.h"
#include "broadcast_plan.h"

// Elementwise op of three broadcast operands: out = OP_EXPR(c, a, b) (where.self:
// c ? a : b; clamp.Tensor: a clamped to [b, c]). One invocation per output element
// (per CHUNK of them on CPU drivers, broadcast_plan.h).
// Defines: OUT_T, C_T, A_T, B_T (storage types), OUT_STORE(v), ACC_T (a and b's
// computation type; ACC_FLOAT for float), C_TYPE (c's computation type), C_LOAD(v),
// A_LOAD(v), B_LOAD(v) (storage -> computation type), OP_EXPR. Operands broadcast on
// any axis against the output (size-1 or missing dims repeat), through the host's
// broadcast plan (broadcast_plan.h).

TENSOR_OUT(out_data, OUT_T)
TENSOR_IN(c_data, C_T)
TENSOR_IN(a_data, A_T)
TENSOR_IN(b_data, B_T)

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
      const C_TYPE c = C_LOAD(c_data[o.x]);
      const ACC_T a = A_LOAD(a_data[o.y]);
      const ACC_T b = B_LOAD(b_data[o.z]);
      out_data[i + j] = OUT_STORE(OP_EXPR);
    }
  }
}
