#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"

// Tiled out[M, N] = a[M, K] @ b[K, N]: a TILE x TILE workgroup computes a TILE x TILE
// block of the output, staging TILE x TILE blocks of a and b in shared memory so that
// each element read from global memory is used TILE times. fp32 accumulation.
// Defines: OUT_T, A_T, B_T, OUT_STORE(v), ACC_T, TILE (the workgroup must be
// TILE x TILE: local_size (TILE, TILE, 1)); B_TRANSPOSED when b is prepacked [N, K].
// Grid: x over N (columns), y over M (rows), sized for the upper bounds; every
// invocation takes part in the barriers and only the in-range ones store.

TENSOR_OUT(0, out_data, OUT_T)
TENSOR_IN(1, a_data, A_T)
TENSOR_IN(2, b_data, B_T)
TENSOR_META(3, out_meta)
TENSOR_META(4, a_meta)

shared ACC_T a_tile[TILE][TILE];
shared ACC_T b_tile[TILE][TILE];

void main() {
  const int N = size_at(out_meta, 0);
  const int M = size_at(out_meta, 1);
  const int K = size_at(a_meta, 0);
  const int col = int(gl_GlobalInvocationID.x);
  const int row = int(gl_GlobalInvocationID.y);
  const int tx = int(gl_LocalInvocationID.x);
  const int ty = int(gl_LocalInvocationID.y);
  ACC_T acc = ACC_T(0);
  for (int k0 = 0; k0 < K; k0 += TILE) {
    const int ka = k0 + tx;  // column of a this invocation loads
    const int kb = k0 + ty;  // row of b this invocation loads
    a_tile[ty][tx] = (row < M && ka < K) ? ACC_T(a_data[row * K + ka]) : ACC_T(0);
#ifdef B_TRANSPOSED
    b_tile[ty][tx] = (col < N && kb < K) ? ACC_T(b_data[col * K + kb]) : ACC_T(0);
#else
    b_tile[ty][tx] = (col < N && kb < K) ? ACC_T(b_data[kb * N + col]) : ACC_T(0);
#endif
    barrier();
    [[unroll]] for (int k = 0; k < TILE; ++k) {
      acc += a_tile[ty][k] * b_tile[k][tx];
    }
    barrier();
  }
  if (row < M && col < N) {
    out_data[row * N + col] = OUT_STORE(acc);
  }
}
