#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"

// The second pass of the pointwise convolution's split-K form (conv2d_pw.glsl
// SPLIT_OUT): out[n, oc, p] = [residual +] clamp(sum over s of
// partial[((n * SPLITS + s) * OC + oc) * P + p] + bias[oc]), the splits added in order
// from s = 0 (one fixed order: the same result every run), then conv2d_pw.glsl's
// epilogue exactly: the bias, conv_epilogue.h (CLAMP keeping NaN as ATen does,
// RESIDUAL's add after the clamp), one rounding to OUT_T. One invocation
// per output element (linear_id over out's current numel), fp32 sums; sizes from
// out_meta (resizable in batch and spatial sizes, the scratch sized for the upper
// bounds).
// Defines: OUT_T, OUT_STORE(v), B_T (fp32 bias, zeros when there is none), CLAMP,
// RESIDUAL (R_T). Specialization constants 3: SPLITS, 4: SPATIAL (1 or 2).

layout(constant_id = 3) const int SPLITS = 1;
layout(constant_id = 4) const int SPATIAL = 2;

TENSOR_OUT(out_data, OUT_T)
TENSOR_IN(partial_data, float)
TENSOR_IN(b_data, B_T)
#ifdef RESIDUAL
TENSOR_IN(r_data, R_T)
#endif
TENSOR_META(out_meta)
PARAMS(conv_block) {
  ivec4 channels;  // IC, OC (groups 1)
  vec4 clamp;      // output min, output max (CLAMP only)
} conv;
#include "conv_epilogue.h"

void main() {
  const int P = size_at(out_meta, 0) * (SPATIAL == 2 ? size_at(out_meta, 1) : 1);
  const int OC = size_at(out_meta, SPATIAL);
  const int N = size_at(out_meta, SPATIAL + 1);
  const int idx = int(linear_id());
  if (idx >= N * OC * P) {
    return;
  }
  const int p = idx % P;
  const int oc = (idx / P) % OC;
  const int n = idx / (P * OC);
  const int plane = OC * P;
  const int first = n * SPLITS * plane + oc * P + p;
  float sum = 0.0;
  for (int s = 0; s < SPLITS; ++s) {
    sum += partial_data[first + s * plane];
  }
  out_data[idx] = OUT_STORE(conv_epilogue(sum + float(b_data[oc]), idx));
}
