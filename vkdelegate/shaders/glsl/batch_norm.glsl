#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"

// Inference batch norm over dim 1 of an (N, C, ...) tensor:
//   out = (x - mean[c]) * inversesqrt(var[c] + eps) * weight[c] + bias[c]
// Defines: OUT_T, OUT_STORE(v), IN_T, P_T (the per-channel tensors' storage type).
// PREPACKED: binding 2 holds scale and binding 3 shift (fp32, folded at load from
// constant statistics) and out = x * scale[c] + shift[c]; otherwise bindings 2..5 are
// weight, bias, running mean, running var as stored. Sizes come from the metadata.

TENSOR_OUT(0, out_data, OUT_T)
TENSOR_IN(1, in_data, IN_T)
#ifdef PREPACKED
TENSOR_IN(2, scale_data, P_T)
TENSOR_IN(3, shift_data, P_T)
#define PARAM0 4
#else
TENSOR_IN(2, w_data, P_T)
TENSOR_IN(3, b_data, P_T)
TENSOR_IN(4, mean_data, P_T)
TENSOR_IN(5, var_data, P_T)
#define PARAM0 6
#endif
TENSOR_META(PARAM0, out_meta)
layout(set = 0, binding = PARAM0 + 1) uniform bn_block { vec4 eps; };

void main() {
  const uint i = linear_id();
  if (i >= uint(numel_of(out_meta))) {
    return;
  }
  const int nd = ndim_of(out_meta);
  // Elements per channel plane: the product of the dims after dim 1.
  int inner = 1;
  for (int d = 0; d < 6; ++d) {
    if (d < nd - 2) {
      inner *= size_at(out_meta, d);
    }
  }
  const int c = (int(i) / inner) % size_at(out_meta, nd - 2);
  const float x = float(in_data[i]);
#ifdef PREPACKED
  const float v = x * float(scale_data[c]) + float(shift_data[c]);
#else
  const float s = float(w_data[c]) / sqrt(float(var_data[c]) + eps.x);
  const float v = (x - float(mean_data[c])) * s + float(b_data[c]);
#endif
  out_data[i] = OUT_STORE(v);
}
