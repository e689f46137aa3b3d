#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"
#include "elementwise_math.h"

// Elementwise unary op: out = OP_EXPR(x). Defines: OUT_T, IN_T (storage types),
// OUT_STORE(v), ACC_T (float or int; ACC_FLOAT set for float), OP_EXPR (an expression
// in x of type ACC_T and the scalar parameters P0..P3, one line per op in
// vkdelegate/ops/families/unary.py), HAS_PARAMS when the op has scalar parameters.
// In and out have the same sizes. CHECK_INT32 (int64 neg / abs): OP_EXPR uses
// int_checked.h's neg_checked / abs_checked, and -(-2^31) sets error_flags[iparams.w].

TENSOR_OUT(out_data, OUT_T)
TENSOR_IN(in_data, IN_T)
TENSOR_META(out_meta)
#if defined(HAS_PARAMS) || defined(CHECK_INT32)
PARAMS(params_block) { vec4 fparams; ivec4 iparams; };
#endif
#ifdef CHECK_INT32
#include "int_checked.h"
#endif
#ifdef HAS_PARAMS
#ifdef ACC_FLOAT
#define P0 fparams.x
#define P1 fparams.y
#define P2 fparams.z
#define P3 fparams.w
#else
#define P0 iparams.x
#define P1 iparams.y
#define P2 iparams.z
#define P3 iparams.w
#endif
#endif

void main() {
  const uint i = linear_id();
  if (i >= uint(numel_of(out_meta))) {
    return;
  }
  const ACC_T x = ACC_T(in_data[i]);
  out_data[i] = OUT_STORE(OP_EXPR);
#ifdef CHECK_INT32
  report_overflow(iparams.w);
#endif
}
