#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"
#include "elementwise_math.h"

// Elementwise binary op with full broadcasting: out = OP_EXPR(a, b).
// Defines: OUT_T, A_T, B_T (storage types), OUT_STORE(v) (store conversion), ACC_T
// (float or int: the computation type), ACC_FLOAT (set for float math), A_LOAD(v) and
// B_LOAD(v) (storage value -> ACC_T; integer storage reaches float math through int,
// as 8-bit storage only converts to 32-bit ints), OP_EXPR (expression in a, b and
// ALPHA, e.g. "a + ALPHA * b"; one entry per op in vkdelegate/backend/ops/binary.py).
// Inputs broadcast on any axis: a dim of size 1 (or missing, the metadata pads with 1)
// repeats. One invocation per output element; the grid is sized for the upper bound,
// the current numel comes from out_meta.

TENSOR_OUT(0, out_data, OUT_T)
TENSOR_IN(1, a_data, A_T)
TENSOR_IN(2, b_data, B_T)
TENSOR_META(3, out_meta)
TENSOR_META(4, a_meta)
TENSOR_META(5, b_meta)
layout(set = 0, binding = 6) uniform scalars_block { vec4 fscalars; ivec4 iscalars; };

#ifdef ACC_FLOAT
#define ALPHA fscalars.x
#else
#define ALPHA iscalars.x
#endif

void main() {
  const uint i = linear_id();
  if (i >= uint(numel_of(out_meta))) {
    return;
  }
  uint rem = i;
  int ia = 0;
  int ib = 0;
  [[unroll]] for (int d = 0; d < 8; ++d) {
    const int size = size_at(out_meta, d);
    const int c = int(rem % uint(size));
    rem /= uint(size);
    ia += (size_at(a_meta, d) == 1 ? 0 : c) * stride_at(a_meta, d);
    ib += (size_at(b_meta, d) == 1 ? 0 : c) * stride_at(b_meta, d);
  }
  const ACC_T a = A_LOAD(a_data[ia]);
  const ACC_T b = B_LOAD(b_data[ib]);
  out_data[i] = OUT_STORE(OP_EXPR);
}
