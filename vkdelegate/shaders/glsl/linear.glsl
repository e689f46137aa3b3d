#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"

// Batched matrix multiply with broadcasting batch dims and an optional bias:
//   out[..., m, n] = alpha * sum_k a[..., m, k] * b[..., k, n] + beta * bias[...]
// Each invocation computes 4 adjacent columns of one row (a[m, k] is loaded once for
// 4 products), accumulating in fp32.
// Defines: OUT_T, OUT_STORE(v), A_T, B_T (C_T with HAS_BIAS).
// B_NK: b is a weight stored [N, K] (nn.Linear's layout), read in place as its
//   transpose; otherwise b is [..., K, N].
// HAS_BIAS: bias broadcast against out (any rank <= out's, sizes 1 broadcast).
// Batch dims (every dim before the last two) broadcast where a or b has size 1.
// Sizes come from the metadata; K is a's innermost size.

TENSOR_OUT(0, out_data, OUT_T)
TENSOR_IN(1, a_data, A_T)
TENSOR_IN(2, b_data, B_T)
#ifdef HAS_BIAS
TENSOR_IN(3, c_data, C_T)
#define PARAM0 4
#else
#define PARAM0 3
#endif
TENSOR_META(PARAM0, out_meta)
TENSOR_META(PARAM0 + 1, a_meta)
TENSOR_META(PARAM0 + 2, b_meta)
#ifdef HAS_BIAS
TENSOR_META(PARAM0 + 3, c_meta)
#define SCALARS_BINDING (PARAM0 + 4)
#else
#define SCALARS_BINDING (PARAM0 + 3)
#endif
layout(set = 0, binding = SCALARS_BINDING) uniform scalars_block { vec4 scalars; };  // alpha, beta

void main() {
  const int N = size_at(out_meta, 0);
  const int M = size_at(out_meta, 1);
  const int K = size_at(a_meta, 0);
  const int nd = ndim_of(out_meta);
  const int tiles = (N + 3) / 4;
  const uint i = linear_id();
  if (N == 0 || i >= uint((numel_of(out_meta) / N) * tiles)) {
    return;
  }
  const int tile = int(i) % tiles;
  const int row = int(i) / tiles;  // index over [..., M]
  const int m = row % M;
  int a_off = m * K;
  int b_off = 0;
  // Batch coordinates, innermost batch dim (metadata index 2) first.
  int rest = row / M;
  for (int d = 2; d < 8; ++d) {
    if (d < nd) {
      const int size = size_at(out_meta, d);
      const int coord = rest % size;
      rest /= size;
      if (size_at(a_meta, d) != 1) {
        a_off += coord * stride_at(a_meta, d);
      }
      if (size_at(b_meta, d) != 1) {
        b_off += coord * stride_at(b_meta, d);
      }
    }
  }
  const int n0 = tile * 4;
  int cols[4];
  for (int j = 0; j < 4; ++j) {
    cols[j] = min(n0 + j, N - 1);  // the tail tile re-reads the last column
  }
  vec4 acc = vec4(0.0);
  for (int k = 0; k < K; ++k) {
    const float av = float(a_data[a_off + k]);
    vec4 bv;
    for (int j = 0; j < 4; ++j) {
#ifdef B_NK
      bv[j] = float(b_data[b_off + cols[j] * K + k]);
#else
      bv[j] = float(b_data[b_off + k * N + cols[j]]);
#endif
    }
    acc += av * bv;
  }
  acc *= scalars.x;
  const int out_row = row * N;
  for (int j = 0; j < 4; ++j) {
    const int n = n0 + j;
    if (n >= N) {
      break;
    }
    float v = acc[j];
#ifdef HAS_BIAS
    // ATen ignores the bias (NaN included) when beta is 0.
    if (scalars.y != 0.0) {
      int c_off = 0;
      int idx = out_row + n;
      for (int d = 0; d < 8; ++d) {
        if (d < nd) {
          const int size = size_at(out_meta, d);
          if (size_at(c_meta, d) != 1) {
            c_off += (idx % size) * stride_at(c_meta, d);
          }
          idx /= size;
        }
      }
      v += scalars.y * float(c_data[c_off]);
    }
#endif
    out_data[out_row + n] = OUT_STORE(v);
  }
}
