#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"

// The second pass of the GEMM core's split-K form (gemm.glsl SPLIT_K): out[z, m, n] =
// epilogue(sum over s of partial[((z * SPLITS + s) * M + m) * N + n]), the epilogue
// being gemm.h's (alpha, bias, beta). One invocation per output element (linear_id
// over out's current numel), fp32 sums.
// Defines: OUT_T, OUT_STORE(v), C_T with HAS_BIAS. Specialization constant 3: SPLITS.
// Bindings as gemm.glsl's, with partial_data (fp32) in place of a_data and b_data;
// a_meta and b_meta are bound for gemm.h's batch offsets (only the bias's is used).

TENSOR_OUT(out_data, OUT_T)
TENSOR_IN(partial_data, float)
#ifdef HAS_BIAS
TENSOR_IN(c_data, C_T)
#endif
TENSOR_META(out_meta)
TENSOR_META(a_meta)
TENSOR_META(b_meta)
#ifdef HAS_BIAS
TENSOR_META(c_meta)
#endif
#include "gemm.h"

layout(constant_id = 3) const int SPLITS = 1;

void main() {
  const int idx = int(linear_id());
  if (idx >= numel_of(out_meta)) {
    return;
  }
  const int N = size_at(out_meta, 0);
  const int M = size_at(out_meta, 1);
  const int n = idx % N;
  const int m = (idx / N) % M;
  const int z = idx / (M * N);
  int a_off, b_off, c_off;
  batch_offsets(z, a_off, b_off, c_off);
  float sum = 0.0;
  for (int s = 0; s < SPLITS; ++s) {
    sum += partial_data[((z * SPLITS + s) * M + m) * N + n];
  }
  out_data[idx] = OUT_STORE(epilogue(sum, c_off, m, n));
}
