#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"

// Batched matrix multiply with broadcasting batch dims and an optional bias:
//   out[..., m, n] = alpha * sum_k a[..., m, k] * b[..., k, n] + beta * bias[...]
// Each invocation computes an M_TILE x 4 tile (rows m0.., columns n0..n0+3; M_TILE is
// 4, or 1 for fewer than 4 rows): per k, M_TILE values of a and 4 of b feed
// 4 * M_TILE multiply-adds, accumulated in fp32. Tiles at the
// edges re-read the last row/column instead of reading out of bounds, and store only
// their valid part.
// Defines: OUT_T, OUT_STORE(v), A_T, B_T (C_T with HAS_BIAS), M_TILE, LONG_K (K past
// llvmpipe's loop budget); one layout of b:
//   B_PACKED: a constant [N, K] weight prepacked at load as fp32 vec4 [ceil(N/4), K]
//     (the 4 columns of a tile at each k are one load); B_TEXEL: read as a uniform
//     texel buffer (CPU drivers; A_TEXEL likewise a, with A_VEC4);
//   B_NK: b is [N, K] (nn.Linear's layout), read in place as its transpose;
//   neither: b is [..., K, N].
// HAS_BIAS: bias broadcast against out (any rank <= out's; size-1 dims broadcast).
// HAS_RESIDUAL (vkdelegate.linear_add): r_data, of out's shape, added to each output
// in fp32 after the bias, one rounding at the store (gemm.h's WITH_RESIDUAL).
// SWIGLU (vkdelegate.linear_swiglu, kernels/swiglu.py; B_PACKED or B_NK): b is a
// merged gate/up weight [2N, K] for an output of N columns; an invocation's 4 columns
// n0.. accumulate the gate columns n0.. and the up columns N + n0.. (B_PACKED: the two
// halves packed apart, the up half's vec4 rows after the gate half's ceil(N / 4)),
// each exactly as the plain linear accumulates that column, and store CHAIN_BODY (the
// fused elementwise chain's GLSL) over r0 = gate, r1 = up, each rounded to the output
// dtype first (SWIGLU_HALF: round_to_half, the value the linear's fp16 store keeps).
// Grid: (column tile, row tile, batch index over the dims before the last two).
// Sizes come from the metadata (read with constant indices only: a run-time index
// into the metadata block makes llvmpipe copy it to scratch memory).

TENSOR_OUT(out_data, OUT_T)
#ifdef A_TEXEL
// A_TEXEL (CPU drivers, with A_VEC4): a is a uniform texel buffer of vec4s (rgba32f,
// or rgba16f for an fp16 a; common.h TEXEL_IN): on llvmpipe one vectorised gather a
// load instead of a loop over the SIMD lanes. Same values, same order of k.
#ifndef A_VEC4
#error "A_TEXEL needs A_VEC4"
#endif
TEXEL_IN(a_data)
#define LOAD_A4(i) texelFetch(a_data, i)
#else
TENSOR_IN(a_data, A_T)
#ifdef A_VEC4
// A_VEC4 (K a multiple of 4, so every row of a starts on 4 elements): a read 4
// elements of a row per load, A4_T (vec4 or f16vec4), through the same binding. On
// llvmpipe each storage load is a loop over the SIMD lanes whatever its width: a
// 4-row tile then loads 2 times per k instead of 5 (the sums keep the order of k).
layout(set = 0, binding = BINDING_a_data) readonly buffer a4_buffer { A4_T a4_data[]; };
#define LOAD_A4(i) vec4(a4_data[i])
#endif
#endif
#ifdef B_TEXEL
// B_TEXEL (CPU drivers, with B_PACKED): the packed weight is a uniform texel buffer of
// fp32 vec4s (rgba32f), as A_TEXEL.
#ifndef B_PACKED
#error "B_TEXEL needs B_PACKED"
#endif
TEXEL_IN(b_data)
#define LOAD_PACKED(i) texelFetch(b_data, i)
#elif defined(B_PACKED)
TENSOR_IN(b_data, vec4)
#define LOAD_PACKED(i) b_data[i]
#else
TENSOR_IN(b_data, B_T)
#endif
#ifdef HAS_BIAS
TENSOR_IN(c_data, C_T)
#endif
#ifdef HAS_RESIDUAL
TENSOR_IN(r_data, R_T)
#endif
TENSOR_META(out_meta)
TENSOR_META(a_meta)
TENSOR_META(b_meta)
#ifdef HAS_BIAS
TENSOR_META(c_meta)
#endif
// scalars_block (alpha, beta), batch_offsets and epilogue: shared with the GEMM core.
#include "gemm.h"

// acc[j] += a[row j, k] * b[k, the tile's 4 columns], for every row j of the tile.
#ifdef B_PACKED
#define LOAD_B(k) const vec4 bv = LOAD_PACKED(packed_row + (k));
#elif defined(B_NK)
#define LOAD_B(k) const vec4 bv = vec4(float(b_data[b_off + cols[0] * K + (k)]), \
    float(b_data[b_off + cols[1] * K + (k)]), float(b_data[b_off + cols[2] * K + (k)]), \
    float(b_data[b_off + cols[3] * K + (k)]));
#else
#define LOAD_B(k) const vec4 bv = vec4(float(b_data[b_off + (k) * N + cols[0]]), \
    float(b_data[b_off + (k) * N + cols[1]]), float(b_data[b_off + (k) * N + cols[2]]), \
    float(b_data[b_off + (k) * N + cols[3]]));
#endif
#ifdef SWIGLU
#if !defined(B_PACKED) && !defined(B_NK)
#error "SWIGLU needs B_PACKED or B_NK"
#endif
#ifdef B_PACKED
#define LOAD_UP(k) const vec4 bu = LOAD_PACKED(up_row + (k));
#else
#define LOAD_UP(k) const vec4 bu = vec4(float(b_data[b_off + (N + cols[0]) * K + (k)]), \
    float(b_data[b_off + (N + cols[1]) * K + (k)]), \
    float(b_data[b_off + (N + cols[2]) * K + (k)]), \
    float(b_data[b_off + (N + cols[3]) * K + (k)]));
#endif
#define ACCUMULATE_WITH(k, AV) { \
    LOAD_B(k) \
    LOAD_UP(k) \
    [[unroll]] for (int j = 0; j < M_TILE; ++j) { \
      const float av = AV; \
      acc[j] += av * bv; \
      acc_up[j] += av * bu; \
    } \
  }
// Output (m, n)'s value from its gate and up sums: the linear's epilogue for columns n
// and N + n of the merged product, each rounded as the linear's store rounds it, then
// the chain.
float swiglu_out(float gate_acc, float up_acc, int c_off, int m, int N, int n) {
  const float r0 = SWIGLU_ROUND(epilogue(gate_acc, c_off, m, n));
  const float r1 = SWIGLU_ROUND(epilogue(up_acc, c_off, m, N + n));
  CHAIN_BODY
  return CHAIN_RESULT;
}
#else
#define ACCUMULATE_WITH(k, AV) { \
    LOAD_B(k) \
    [[unroll]] for (int j = 0; j < M_TILE; ++j) { \
      acc[j] += (AV) * bv; \
    } \
  }
#endif
// AV: row j's a at k (j is the row loop's variable inside ACCUMULATE_WITH).
#define ACCUMULATE(k) ACCUMULATE_WITH(k, float(a_data[rows[j] + (k)]))
#ifdef A_VEC4
// k = 4 k4 .. 4 k4 + 3, in order.
#define ACCUMULATE4(k4) { \
    vec4 a4[M_TILE]; \
    [[unroll]] for (int j = 0; j < M_TILE; ++j) { \
      a4[j] = LOAD_A4((rows[j] >> 2) + (k4)); \
    } \
    [[unroll]] for (int kk = 0; kk < 4; ++kk) { \
      ACCUMULATE_WITH(4 * (k4) + kk, a4[j][kk]) \
    } \
  }
#endif

void main() {
  if (numel_of(out_meta) == 0) {
    return;
  }
  const int N = size_at(out_meta, 0);
  const int M = size_at(out_meta, 1);
  const int K = size_at(a_meta, 0);
  const int n0 = int(gl_GlobalInvocationID.x) * 4;
  const int m0 = int(gl_GlobalInvocationID.y) * M_TILE;
  if (n0 >= N || m0 >= M) {
    return;
  }
  int a_off, b_off, c_off;
  if (!batch_offsets(int(gl_GlobalInvocationID.z), a_off, b_off, c_off)) {
    return;  // beyond the current batch count (the grid covers the upper bound)
  }
  int rows[M_TILE];
  vec4 acc[M_TILE];
#ifdef SWIGLU
  vec4 acc_up[M_TILE];
#endif
  [[unroll]] for (int j = 0; j < M_TILE; ++j) {
    rows[j] = a_off + min(m0 + j, M - 1) * K;
    acc[j] = vec4(0.0);
#ifdef SWIGLU
    acc_up[j] = vec4(0.0);
#endif
  }
  int cols[4];
  [[unroll]] for (int j = 0; j < 4; ++j) {
    cols[j] = min(n0 + j, N - 1);
  }
#ifdef B_PACKED
  const int packed_row = (n0 >> 2) * K;
#ifdef SWIGLU
  const int up_row = (((N + 3) >> 2) + (n0 >> 2)) * K;
#endif
#endif
#ifdef A_VEC4
  const int K4 = K >> 2;
#ifdef LONG_K
  const int K16 = K4 & ~3;  // 16 k per iteration, then the rest (as below)
  for (int k0 = 0; k0 < K16; k0 += 4) {
    [[unroll]] for (int u = 0; u < 4; ++u) {
      ACCUMULATE4(k0 + u);
    }
  }
  for (int k4 = K16; k4 < K4; ++k4) {
#else
  for (int k4 = 0; k4 < K4; ++k4) {
#endif
    ACCUMULATE4(k4);
  }
#else
#ifdef LONG_K
  // 16 k per loop iteration, then the remainder: llvmpipe ends an invocation's loops
  // after LOOP_LIMIT iterations in all (common.h), which a K of 65536 would pass.
  // A variant for such K only: the unrolled form costs short products (bmm with
  // K = 64) about 40% on llvmpipe.
  const int K16 = K & ~15;
  for (int k0 = 0; k0 < K16; k0 += 16) {
    [[unroll]] for (int kk = 0; kk < 16; ++kk) {
      ACCUMULATE(k0 + kk);
    }
  }
  for (int k = K16; k < K; ++k) {
#else
  for (int k = 0; k < K; ++k) {
#endif
    ACCUMULATE(k);
  }
#endif
  [[unroll]] for (int j = 0; j < M_TILE; ++j) {
    const int m = m0 + j;
    if (m >= M) {
      break;
    }
    const int out_row = (int(gl_GlobalInvocationID.z) * M + m) * N;
    [[unroll]] for (int jj = 0; jj < 4; ++jj) {
      const int n = n0 + jj;
      if (n >= N) {
        break;
      }
#ifdef SWIGLU
      out_data[out_row + n] = OUT_STORE(swiglu_out(acc[j][jj], acc_up[j][jj], c_off, m,
                                                   N, n));
#else
      out_data[out_row + n] = OUT_STORE(WITH_RESIDUAL(epilogue(acc[j][jj], c_off, m, n),
                                                    out_row + n));
#endif
    }
  }
}
