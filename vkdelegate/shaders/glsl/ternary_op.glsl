#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"
#include "elementwise_math.h"

// Elementwise op of three broadcast operands: out = OP_EXPR(c, a, b) (where.self:
// c ? a : b; clamp.Tensor: a clamped to [b, c]). One invocation per output element.
// Defines: OUT_T, C_T, A_T, B_T (storage types), OUT_STORE(v), ACC_T (a and b's
// computation type; ACC_FLOAT for float), C_TYPE (c's computation type), C_LOAD(v),
// A_LOAD(v), B_LOAD(v) (storage -> computation type), OP_EXPR. Operands broadcast on
// any axis against the output (size-1 or missing dims repeat).

TENSOR_OUT(0, out_data, OUT_T)
TENSOR_IN(1, c_data, C_T)
TENSOR_IN(2, a_data, A_T)
TENSOR_IN(3, b_data, B_T)
TENSOR_META(4, out_meta)
TENSOR_META(5, c_meta)
TENSOR_META(6, a_meta)
TENSOR_META(7, b_meta)

void main() {
  const uint i = linear_id();
  if (i >= uint(numel_of(out_meta))) {
    return;
  }
  uint rem = i;
  int ic = 0;
  int ia = 0;
  int ib = 0;
  [[unroll]] for (int d = 0; d < 8; ++d) {
    const int size = size_at(out_meta, d);
    const int k = int(rem % uint(size));
    rem /= uint(size);
    ic += (size_at(c_meta, d) == 1 ? 0 : k) * stride_at(c_meta, d);
    ia += (size_at(a_meta, d) == 1 ? 0 : k) * stride_at(a_meta, d);
    ib += (size_at(b_meta, d) == 1 ? 0 : k) * stride_at(b_meta, d);
  }
  const C_TYPE c = C_LOAD(c_data[ic]);
  const ACC_T a = A_LOAD(a_data[ia]);
  const ACC_T b = B_LOAD(b_data[ib]);
  out_data[i] = OUT_STORE(OP_EXPR);
}
