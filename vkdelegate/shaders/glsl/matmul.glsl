#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"

// out[M, N] = a[M, K] @ b[K, N], one invocation per output element, fp32 accumulation.
// Defines: OUT_T, A_T, B_T, OUT_STORE(v), ACC_T; B_TRANSPOSED when b was prepacked as
// [N, K] (a constant weight), so that the inner loop reads both operands contiguously.
// M, K, N come from the metadata (innermost dim first: size_at(m, 0) is the last dim).

TENSOR_OUT(out_data, OUT_T)
TENSOR_IN(a_data, A_T)
TENSOR_IN(b_data, B_T)
TENSOR_META(out_meta)
TENSOR_META(a_meta)

void main() {
  const uint i = linear_id();
  if (i >= uint(numel_of(out_meta))) {
    return;
  }
  const int N = size_at(out_meta, 0);
  const int K = size_at(a_meta, 0);
  const int row = int(i) / N;
  const int col = int(i) % N;
  ACC_T acc = ACC_T(0);
  for (int k = 0; k < K; ++k) {
#ifdef B_TRANSPOSED
    const ACC_T bv = ACC_T(b_data[col * K + k]);
#else
    const ACC_T bv = ACC_T(b_data[k * N + col]);
#endif
    acc += ACC_T(a_data[row * K + k]) * bv;
  }
  out_data[i] = OUT_STORE(acc);
}
