#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"

// Inference batch norm over dim 1 of an (N, C, ...) tensor:
//   out = (x - mean[c]) * inversesqrt(var[c] + eps) * weight[c] + bias[c]
// Defines: OUT_T, OUT_STORE(v), IN_T, P_T (the per-channel tensors' storage type);
// PLANE_LOOP when the grid could not cover a channel plane (see below).
// PREPACKED: binding 2 holds scale and binding 3 shift (fp32, folded at load from
// constant statistics) and out = x * scale[c] + shift[c]; otherwise bindings 2..5 are
// weight, bias, running mean, running var as stored. Sizes come from the metadata.

TENSOR_OUT(out_data, OUT_T)
TENSOR_IN(in_data, IN_T)
#ifdef PREPACKED
TENSOR_IN(scale_data, P_T)
TENSOR_IN(shift_data, P_T)
#else
TENSOR_IN(w_data, P_T)
TENSOR_IN(b_data, P_T)
TENSOR_IN(mean_data, P_T)
TENSOR_IN(var_data, P_T)
#endif
TENSOR_META(out_meta)
PARAMS(bn_block) { vec4 eps; };

void main() {
  // Grid: (element within a channel plane, channel, batch): no integer division
  // (llvmpipe runs it lane by lane).
  // Sizes read with constant indices only: indexing the metadata block with a
  // run-time value makes llvmpipe copy it to scratch memory on every access.
  const int nd = ndim_of(out_meta);
  int inner = 1;  // elements per channel plane: the product of the dims after dim 1
  int C = 1;
  int N = 1;
  [[unroll]] for (int d = 0; d < 8; ++d) {
    const int size = size_at(out_meta, d);
    if (d < nd - 2) {
      inner *= size;
    } else if (d == nd - 2) {
      C = size;
    } else if (d == nd - 1) {
      N = size;
    }
  }
  const int c = int(gl_GlobalInvocationID.y);
  const int n = int(gl_GlobalInvocationID.z);
  if (c >= C || n >= N) {
    return;
  }
#ifdef PREPACKED
  const float scale = float(scale_data[c]);
  const float shift = float(shift_data[c]);
#else
  const float scale = float(w_data[c]) / sqrt(float(var_data[c]) + eps.x);
  const float shift = float(b_data[c]) - float(mean_data[c]) * scale;
#endif
  const int base = (n * C + c) * inner;
#ifdef PLANE_LOOP
  // The grid's x was capped at the device's workgroup-count limit (planes of millions
  // of elements): each invocation strides over the plane. A separate variant because
  // the loop costs llvmpipe about 10% on ordinary planes.
  const int step = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
  for (int x = int(gl_GlobalInvocationID.x); x < inner; x += step) {
    out_data[base + x] = OUT_STORE(float(in_data[base + x]) * scale + shift);
  }
#else
  const int x = int(gl_GlobalInvocationID.x);
  if (x < inner) {
    out_data[base + x] = OUT_STORE(float(in_data[base + x]) * scale + shift);
  }
#endif
}
