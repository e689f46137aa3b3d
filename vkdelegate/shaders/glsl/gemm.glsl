#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"

// The GEMM core (GPUs): out[..., M, N] = alpha * a[..., M, K] @ B + beta * bias, B per
// gemm.h (b [..., K, N], or b [..., N, K] with B_NK), batch dims broadcasting.
// A 16 x 16 workgroup computes a BM x BN block of one batch's output (BM = 16 * TM,
// BN = 16 * TN); each invocation owns TM x TN outputs: rows 4 * (ty + 16 i) + 0..3
// and columns 4 * (tx + 16 j) + 0..3, so that its operands are whole vec4s of the
// shared tiles. Per step of BK along K the workgroup stages a BK x BM slice of a and a
// BK x BN slice of B in shared memory as vec4s (k-major, padded by one vec4 per row
// against bank conflicts); the next step's global loads are issued into registers
// before the current step's multiply-adds (register prefetch), and each shared vec4
// read feeds 4 * TN (or 4 * TM) multiply-adds. fp32 accumulation for fp16 data.
// Edge tiles load zeros outside [M, K] / [K, N] and store only their valid part.
// Defines: OUT_T, OUT_STORE(v), A_T, B_T (C_T with HAS_BIAS), TM, TN (multiples of 4),
// BK (BK * 16 * TM and BK * 16 * TN multiples of 4096: whole vec4 loads per
// invocation), B_NK, HAS_BIAS, VEC_LOAD (global loads of 4 consecutive elements as
// one vec4 where K, N and the batch offsets allow it; A_VT, B_VT). local_size
// (16, 16, 1). SPLIT_K (split-K, for few outputs and a long K): specialization
// constant 3 is SPLITS; workgroup z = batch index * SPLITS + split sums its split's
// part of K (whole BK steps) and stores the raw sums, fp32, at
// out_data[(z * M + m) * N + n] (a scratch buffer; out_meta still describes the real
// output); gemm_reduce.glsl then adds the SPLITS parts and applies the epilogue.
// Grid: x over N / TN, y over M / TM, z the batch index over out's dims before the
// last two; every invocation of a workgroup reaches every barrier.

TENSOR_OUT(out_data, OUT_T)
TENSOR_IN(a_data, A_T)
TENSOR_IN(b_data, B_T)
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
#ifdef VEC_LOAD
// The same a and b buffers as vec4s (A_VT, B_VT: vec4 or f16vec4).
layout(set = 0, binding = BINDING_a_data) readonly buffer a_vec_buffer { A_VT a_vec[]; };
layout(set = 0, binding = BINDING_b_data) readonly buffer b_vec_buffer { B_VT b_vec[]; };
#endif

#ifdef SPLIT_K
layout(constant_id = 3) const int SPLITS = 1;
#endif

#define BM (16 * TM)
#define BN (16 * TN)
#define A_LOADS (BK * BM / 4 / 256)  // vec4s of the a slice each invocation loads
#define B_LOADS (BK * BN / 4 / 256)

shared vec4 a_tile[BK][BM / 4 + 1];
shared vec4 b_tile[BK][BN / 4 + 1];

void main() {
  if (numel_of(out_meta) == 0) {
    return;  // uniform across the dispatch: no barrier is skipped by part of a group
  }
  const int N = size_at(out_meta, 0);
  const int M = size_at(out_meta, 1);
  const int K = size_at(a_meta, 0);
#ifdef SPLIT_K
  // z = batch index * SPLITS + split; this split's K range is whole BK steps.
  const int split = int(gl_WorkGroupID.z) % SPLITS;
  const int zb = int(gl_WorkGroupID.z) / SPLITS;
  const int chunk = ((K + SPLITS - 1) / SPLITS + BK - 1) / BK * BK;
  const int k_begin = split * chunk;
  const int k_end = min(K, k_begin + chunk);
#else
  const int zb = int(gl_WorkGroupID.z);
  const int k_begin = 0;
  const int k_end = K;
#endif
  int a_off, b_off, c_off;
  if (!batch_offsets(zb, a_off, b_off, c_off)) {
    return;  // a whole workgroup past the batch count
  }
  const int tx = int(gl_LocalInvocationID.x);
  const int ty = int(gl_LocalInvocationID.y);
  const int tid = ty * 16 + tx;
  const int row0 = int(gl_WorkGroupID.y) * BM;
  const int col0 = int(gl_WorkGroupID.x) * BN;

  vec4 acc[TM][TN / 4];
  [[unroll]] for (int i = 0; i < TM; ++i) {
    [[unroll]] for (int j = 0; j < TN / 4; ++j) {
      acc[i][j] = vec4(0.0);
    }
  }
  vec4 a_next[A_LOADS];
  vec4 b_next[B_LOADS];

// Slot s of the a slice: k = s % BK (consecutive invocations read consecutive k of a
// row), rows 4 * (s / BK) + 0..3; b [N, K] (B_NK) likewise with columns for rows.
#define LOAD_ROWS(next, LOADS, data, off, first, LIMIT, k0) \
  [[unroll]] for (int l = 0; l < LOADS; ++l) { \
    const int s = tid + l * 256; \
    const int k = (k0) + s % BK; \
    const int r = (first) + 4 * (s / BK); \
    [[unroll]] for (int e = 0; e < 4; ++e) { \
      next[l][e] = (r + e < LIMIT && k < k_end) ? float(data[off + (r + e) * K + k]) : 0.0; \
    } \
  }
#define STORE_ROWS(next, LOADS, tile) \
  [[unroll]] for (int l = 0; l < LOADS; ++l) { \
    const int s = tid + l * 256; \
    tile[s % BK][s / BK] = next[l]; \
  }
#ifdef VEC_LOAD
// With K a multiple of 4 (checked at run time, uniform), one vec4 load of 4
// consecutive k per slot instead: slot s is row s / (BK / 4), k = 4 * (s % (BK / 4)),
// stored as 4 components of the k-major tile.
#define LOAD_ROWS_VEC(next, LOADS, data, off, first, LIMIT, k0) \
  [[unroll]] for (int l = 0; l < LOADS; ++l) { \
    const int s = tid + l * 256; \
    const int k = (k0) + 4 * (s % (BK / 4)); \
    const int r = (first) + s / (BK / 4); \
    next[l] = (r < LIMIT && k < k_end) ? vec4(data[(off + r * K + k) >> 2]) : vec4(0.0); \
  }
#define STORE_ROWS_VEC(next, LOADS, tile) \
  [[unroll]] for (int l = 0; l < LOADS; ++l) { \
    const int s = tid + l * 256; \
    const int k = 4 * (s % (BK / 4)); \
    const int r = s / (BK / 4); \
    [[unroll]] for (int e = 0; e < 4; ++e) { \
      tile[k + e][r >> 2][r & 3] = next[l][e]; \
    } \
  }
#define LOAD_A(k0) if (vec) { LOAD_ROWS_VEC(a_next, A_LOADS, a_vec, a_off, row0, M, k0) } \
                   else { LOAD_ROWS(a_next, A_LOADS, a_data, a_off, row0, M, k0) }
#define STORE_A if (vec) { STORE_ROWS_VEC(a_next, A_LOADS, a_tile) } \
                else { STORE_ROWS(a_next, A_LOADS, a_tile) }
#else
#define LOAD_A(k0) LOAD_ROWS(a_next, A_LOADS, a_data, a_off, row0, M, k0)
#define STORE_A STORE_ROWS(a_next, A_LOADS, a_tile)
#endif

#ifdef B_NK
#if defined(VEC_LOAD)
#define LOAD_B(k0) if (vec) { LOAD_ROWS_VEC(b_next, B_LOADS, b_vec, b_off, col0, N, k0) } \
                   else { LOAD_ROWS(b_next, B_LOADS, b_data, b_off, col0, N, k0) }
#define STORE_B if (vec) { STORE_ROWS_VEC(b_next, B_LOADS, b_tile) } \
                else { STORE_ROWS(b_next, B_LOADS, b_tile) }
#else
#define LOAD_B(k0) LOAD_ROWS(b_next, B_LOADS, b_data, b_off, col0, N, k0)
#define STORE_B STORE_ROWS(b_next, B_LOADS, b_tile)
#endif
#else
// b [K, N]: slot s holds columns 4 * (s % (BN / 4)) + 0..3 of row k = s / (BN / 4)
// (consecutive invocations read consecutive columns; with VEC_LOAD and N a multiple
// of 4, as one vec4 load).
#ifdef VEC_LOAD
#define LOAD_B_VEC(c, k) b_next[l] = (c < N && k < k_end) ? vec4(b_vec[(b_off + k * N + c) >> 2]) \
                                                      : vec4(0.0);
#else
#define LOAD_B_VEC(c, k)
#endif
#define LOAD_B(k0) \
  [[unroll]] for (int l = 0; l < B_LOADS; ++l) { \
    const int s = tid + l * 256; \
    const int k = (k0) + s / (BN / 4); \
    const int c = col0 + 4 * (s % (BN / 4)); \
    if (vec) { \
      LOAD_B_VEC(c, k) \
    } else { \
      [[unroll]] for (int e = 0; e < 4; ++e) { \
        b_next[l][e] = (c + e < N && k < k_end) ? float(b_data[b_off + k * N + c + e]) : 0.0; \
      } \
    } \
  }
#define STORE_B \
  [[unroll]] for (int l = 0; l < B_LOADS; ++l) { \
    const int s = tid + l * 256; \
    b_tile[s / (BN / 4)][s % (BN / 4)] = b_next[l]; \
  }
#endif

#ifdef VEC_LOAD
  // vec4 loads need every row start (and the batch offsets) at a multiple of 4.
#ifdef B_NK
  const bool vec = (K & 3) == 0 && (a_off & 3) == 0 && (b_off & 3) == 0;
#else
  const bool vec = (K & 3) == 0 && (N & 3) == 0 && (a_off & 3) == 0 && (b_off & 3) == 0;
#endif
#else
  const bool vec = false;
#endif
  LOAD_A(k_begin)
  LOAD_B(k_begin)
  for (int k0 = k_begin; k0 < k_end; k0 += BK) {
    STORE_A
    STORE_B
    barrier();
    if (k0 + BK < k_end) {  // uniform: the next slice's loads overlap this one's math
      LOAD_A(k0 + BK)
      LOAD_B(k0 + BK)
    }
    [[unroll]] for (int k = 0; k < BK; ++k) {
      vec4 av[TM / 4];
      vec4 bv[TN / 4];
      [[unroll]] for (int i = 0; i < TM / 4; ++i) {
        av[i] = a_tile[k][ty + 16 * i];
      }
      [[unroll]] for (int j = 0; j < TN / 4; ++j) {
        bv[j] = b_tile[k][tx + 16 * j];
      }
      [[unroll]] for (int i = 0; i < TM / 4; ++i) {
        [[unroll]] for (int e = 0; e < 4; ++e) {
          [[unroll]] for (int j = 0; j < TN / 4; ++j) {
            acc[4 * i + e][j] += av[i][e] * bv[j];
          }
        }
      }
    }
    barrier();
  }

  const int out_off = int(gl_WorkGroupID.z) * M * N;  // SPLIT_K: zb * SPLITS + split
  [[unroll]] for (int i = 0; i < TM / 4; ++i) {
    [[unroll]] for (int e = 0; e < 4; ++e) {
      const int m = row0 + 4 * (ty + 16 * i) + e;
      if (m < M) {
        [[unroll]] for (int j = 0; j < TN / 4; ++j) {
          [[unroll]] for (int f = 0; f < 4; ++f) {
            const int n = col0 + 4 * (tx + 16 * j) + f;
            if (n < N) {
#ifdef SPLIT_K
              out_data[out_off + m * N + n] = acc[4 * i + e][j][f];
#else
              out_data[out_off + m * N + n] = OUT_STORE(epilogue(acc[4 * i + e][j][f],
                                                                 c_off, m, n));
#endif
            }
          }
        }
      }
    }
  }
}
