#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"

// Elementwise unary op: out = OP_EXPR(x). Defines: OUT_T, IN_T (storage types),
// OUT_STORE(v), ACC_T (float or int), OP_EXPR (an expression in x of type ACC_T, one
// line per op in vkdelegate/backend/ops/unary.py). In and out have the same sizes.

TENSOR_OUT(0, out_data, OUT_T)
TENSOR_IN(1, in_data, IN_T)
TENSOR_META(2, out_meta)

void main() {
  const uint i = linear_id();
  if (i >= uint(numel_of(out_meta))) {
    return;
  }
  const ACC_T x = ACC_T(in_data[i]);
  out_data[i] = OUT_STORE(OP_EXPR);
}
