#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"

// Tiled out[M, N] = a[M, K] @ b[K, N] with register blocking. A TILE x TILE workgroup
// computes a (TILE*REG) x (TILE*REG) block of the output; each invocation owns REG x REG
// outputs, strided by TILE so that neighbouring invocations touch neighbouring
// addresses. Per step of TILE along K, the workgroup stages a (TILE*REG) x TILE block
// of a and a TILE x (TILE*REG) block of b in shared memory: each element loaded from
// global memory is used TILE*REG times. fp32 accumulation.
// Defines: OUT_T, A_T, B_T, OUT_STORE(v), ACC_T, TILE (the workgroup is TILE x TILE:
// local_size (TILE, TILE, 1)), REG (outputs per invocation per dim; 1 gives the plain
// tiled algorithm); B_TRANSPOSED when b is prepacked [N, K].
// Grid: x over N / REG, y over M / REG, sized for the upper bounds; every invocation
// takes part in the barriers and only in-range outputs are stored.

TENSOR_OUT(out_data, OUT_T)
TENSOR_IN(a_data, A_T)
TENSOR_IN(b_data, B_T)
TENSOR_META(out_meta)
TENSOR_META(a_meta)

#define BLOCK (TILE * REG)

shared ACC_T a_tile[BLOCK][TILE];
shared ACC_T b_tile[TILE][BLOCK];

void main() {
  const int N = size_at(out_meta, 0);
  const int M = size_at(out_meta, 1);
  const int K = size_at(a_meta, 0);
  const int tx = int(gl_LocalInvocationID.x);
  const int ty = int(gl_LocalInvocationID.y);
  const int row0 = int(gl_WorkGroupID.y) * BLOCK;
  const int col0 = int(gl_WorkGroupID.x) * BLOCK;
  ACC_T acc[REG][REG];
  [[unroll]] for (int i = 0; i < REG; ++i) {
    [[unroll]] for (int j = 0; j < REG; ++j) {
      acc[i][j] = ACC_T(0);
    }
  }
  for (int k0 = 0; k0 < K; k0 += TILE) {
    [[unroll]] for (int i = 0; i < REG; ++i) {
      const int row = row0 + ty + i * TILE;  // a: rows of the block, column k0 + tx
      const int ka = k0 + tx;
      a_tile[ty + i * TILE][tx] =
          (row < M && ka < K) ? ACC_T(a_data[row * K + ka]) : ACC_T(0);
      const int col = col0 + tx + i * TILE;  // b: row k0 + ty, columns of the block
      const int kb = k0 + ty;
#ifdef B_TRANSPOSED
      b_tile[ty][tx + i * TILE] =
          (col < N && kb < K) ? ACC_T(b_data[col * K + kb]) : ACC_T(0);
#else
      b_tile[ty][tx + i * TILE] =
          (col < N && kb < K) ? ACC_T(b_data[kb * N + col]) : ACC_T(0);
#endif
    }
    barrier();
    [[unroll]] for (int k = 0; k < TILE; ++k) {
      ACC_T a_reg[REG];
      ACC_T b_reg[REG];
      [[unroll]] for (int i = 0; i < REG; ++i) {
        a_reg[i] = a_tile[ty + i * TILE][k];
        b_reg[i] = b_tile[k][tx + i * TILE];
      }
      [[unroll]] for (int i = 0; i < REG; ++i) {
        [[unroll]] for (int j = 0; j < REG; ++j) {
          acc[i][j] += a_reg[i] * b_reg[j];
        }
      }
    }
    barrier();
  }
  [[unroll]] for (int i = 0; i < REG; ++i) {
    const int row = row0 + ty + i * TILE;
    [[unroll]] for (int j = 0; j < REG; ++j) {
      const int col = col0 + tx + j * TILE;
      if (row < M && col < N) {
        out_data[row * N + col] = OUT_STORE(acc[i][j]);
      }
    }
  }
}
