#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#include "common.h"

// The GEMM core's cooperative-matrix form (GL_KHR_cooperative_matrix, fp16 data, fp32
// accumulation): out[..., M, N] = alpha * a[..., M, K] @ B + beta * bias, B per gemm.h
// (b [..., K, N], or b [..., N, K] with B_NK), batch dims broadcasting; the same
// bindings and epilogue as gemm.glsl.
// A workgroup of SGS = (BM / WM) * (BN / WN) subgroups computes a BM x BN block of one
// batch's output; subgroup s owns the WM x WN sub-block at (s / (BN / WN), s % (BN /
// WN)) as (WM / 16) x (WN / 16) 16 x 16 fp32 accumulator matrices (coopmat shape
// 16 x 16 x 16, FLOAT16 x FLOAT16 -> FLOAT32). Per step of BK along K the workgroup
// stages a BM x BK slice of a and a BK x BN slice of B in shared memory as uvec4s
// (8 fp16 each; rows padded by one uvec4 against bank conflicts): a row-major (k
// innermost), B as stored (B_NK: n-major rows of k, loaded column-major; else k-major
// rows of n). The next step's global loads go to registers while the current step's
// products run; STAGES = 2 double-buffers the shared tiles (one barrier per step),
// STAGES = 1 uses one buffer (two). Global loads are one uvec4 of 8 consecutive
// elements where the innermost dim and the batch offsets are multiples of 8 (checked
// at run time, uniform), else 8 scalar loads; outside [M, K] / [K, N] they load
// zeros, so ragged edges need no other care in the loop.
// Epilogue: a tile wholly inside the output without bias (or with beta = 0), N a
// multiple of 8, is scaled by alpha, converted to OUT_T and stored as a matrix; any
// other goes through this
// subgroup's part of the (then free) shared a tile, and each invocation stores its
// valid elements with gemm.h's epilogue.
// Defines: OUT_T (float or float16_t), OUT_STORE(v), A_T = B_T = float16_t (C_T with
// HAS_BIAS), BM, BN, BK (multiples of 16), WM, WN (multiples of 16 dividing BM, BN),
// THREADS (= SGS * the subgroup size: the workgroup size the runtime passes; the
// kernel picks this form only on devices with one fixed subgroup size), STAGES,
// B_NK, HAS_BIAS; ACC16 (fp16 accumulators, the 16 x 16 x 16 FLOAT16 -> FLOAT16 shape;
// a measurement probe, no table row picks it). PROBE (benchmarks/gemm.py's probes of
// where the time goes; results are wrong): 1 no global loads in the K loop, 2 nor
// shared stores and barriers, 3 only coopMatMulAdd on fragments loaded once.
// local_size (THREADS, 1, 1); grid x over N / BN, y over M / BM, z
// the batch index; every invocation reaches every barrier.

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
// The same a and b buffers as uvec4s: 8 fp16 elements each.
layout(set = 0, binding = BINDING_a_data) readonly buffer a_vec_buffer { uvec4 a_vec[]; };
layout(set = 0, binding = BINDING_b_data) readonly buffer b_vec_buffer { uvec4 b_vec[]; };

#define SG_N (BN / WN)
#define SGS ((BM / WM) * SG_N)
#define FM (WM / 16)  // accumulator matrices per subgroup along M
#define FN (WN / 16)
#define A_STRIDE (BK / 8 + 1)  // uvec4s per row of the shared a tile
#ifdef B_NK
#define B_ROWS BN
#define B_STRIDE (BK / 8 + 1)
#else
#define B_ROWS BK
#define B_STRIDE (BN / 8 + 1)
#endif
#define A_SIZE (BM * A_STRIDE)  // uvec4s of one stage
#define B_SIZE (B_ROWS * B_STRIDE)
#define A_LOADS (BM * BK / 8 / THREADS)  // uvec4s each invocation loads per step
#define B_LOADS (BN * BK / 8 / THREADS)
#if A_LOADS * THREADS != BM * BK / 8 || B_LOADS * THREADS != BN * BK / 8
#error "BM * BK / 8 and BN * BK / 8 must be multiples of THREADS"
#endif
#if A_SIZE * STAGES < SGS * 64
#error "the epilogue needs 64 uvec4s (a 16 x 16 fp32 tile) of shared a per subgroup"
#endif

shared uvec4 a_tile[A_SIZE * STAGES];
shared uvec4 b_tile[B_SIZE * STAGES];

#ifdef ACC16
#define ACC_T float16_t
#else
#define ACC_T float
#endif
#ifndef PROBE
#define PROBE 0
#endif
#define ACC_MAT coopmat<ACC_T, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#define ACC_F coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>

// 8 fp16 elements data[base + 0..7] as a uvec4, those at or past `valid` as zero.
#define PACK8(data, base, valid) \
  uvec4(packFloat2x16(f16vec2(0 < valid ? data[base] : 0.0hf, 1 < valid ? data[base + 1] : 0.0hf)), \
        packFloat2x16(f16vec2(2 < valid ? data[base + 2] : 0.0hf, 3 < valid ? data[base + 3] : 0.0hf)), \
        packFloat2x16(f16vec2(4 < valid ? data[base + 4] : 0.0hf, 5 < valid ? data[base + 5] : 0.0hf)), \
        packFloat2x16(f16vec2(6 < valid ? data[base + 6] : 0.0hf, 7 < valid ? data[base + 7] : 0.0hf)))

// Slot s of a [rows, K] operand's slice (a, or b with B_NK): row first + s / (BK / 8),
// k = k0 + 8 * (s % (BK / 8)): consecutive invocations read consecutive 16 bytes of
// a row.
#define LOAD_RK(next, LOADS, data, vdata, vec, off, first, LIMIT, k0) \
  [[unroll]] for (int l = 0; l < LOADS; ++l) { \
    const int s = tid + l * THREADS; \
    const int k = (k0) + 8 * (s % (BK / 8)); \
    const int r = (first) + s / (BK / 8); \
    if (vec) { \
      next[l] = (r < LIMIT && k < K) ? vdata[(off + r * K + k) >> 3] : uvec4(0u); \
    } else { \
      const int valid = r < LIMIT ? min(8, K - k) : 0; \
      const int base = off + r * K + k; \
      next[l] = PACK8(data, base, valid); \
    } \
  }
#define STORE_RK(next, LOADS, tile, tbase, STRIDE) \
  [[unroll]] for (int l = 0; l < LOADS; ++l) { \
    const int s = tid + l * THREADS; \
    tile[tbase + (s / (BK / 8)) * STRIDE + s % (BK / 8)] = next[l]; \
  }

void main() {
  if (numel_of(out_meta) == 0) {
    return;  // uniform across the dispatch: no barrier is skipped by part of a group
  }
  const int N = size_at(out_meta, 0);
  const int M = size_at(out_meta, 1);
  const int K = size_at(a_meta, 0);
  const int zb = int(gl_WorkGroupID.z);
  int a_off, b_off, c_off;
  if (!batch_offsets(zb, a_off, b_off, c_off)) {
    return;  // a whole workgroup past the batch count
  }
  const int tid = int(gl_LocalInvocationIndex);
  const int sg = int(gl_SubgroupID);
  const int row0 = int(gl_WorkGroupID.y) * BM;
  const int col0 = int(gl_WorkGroupID.x) * BN;
  const int sg_row = (sg / SG_N) * WM;  // this subgroup's sub-block in the block
  const int sg_col = (sg % SG_N) * WN;

  const bool vec_a = (K & 7) == 0 && (a_off & 7) == 0;
#ifdef B_NK
  const bool vec_b = (K & 7) == 0 && (b_off & 7) == 0;
#else
  const bool vec_b = (N & 7) == 0 && (b_off & 7) == 0;
#endif

  ACC_MAT acc[FM][FN];
  [[unroll]] for (int i = 0; i < FM; ++i) {
    [[unroll]] for (int j = 0; j < FN; ++j) {
      acc[i][j] = ACC_MAT(0.0);
    }
  }
  uvec4 a_next[A_LOADS];
  uvec4 b_next[B_LOADS];

#define LOAD_A(k0) LOAD_RK(a_next, A_LOADS, a_data, a_vec, vec_a, a_off, row0, M, k0)
#define STORE_A(stage) STORE_RK(a_next, A_LOADS, a_tile, (stage) * A_SIZE, A_STRIDE)
#ifdef B_NK
#define LOAD_B(k0) LOAD_RK(b_next, B_LOADS, b_data, b_vec, vec_b, b_off, col0, N, k0)
#define STORE_B(stage) STORE_RK(b_next, B_LOADS, b_tile, (stage) * B_SIZE, B_STRIDE)
#else
// b [K, N]: slot s is row k0 + s / (BN / 8), columns col0 + 8 * (s % (BN / 8)) + 0..7.
#define LOAD_B(k0) \
  [[unroll]] for (int l = 0; l < B_LOADS; ++l) { \
    const int s = tid + l * THREADS; \
    const int k = (k0) + s / (BN / 8); \
    const int c = col0 + 8 * (s % (BN / 8)); \
    if (vec_b) { \
      b_next[l] = (k < K && c < N) ? b_vec[(b_off + k * N + c) >> 3] : uvec4(0u); \
    } else { \
      const int valid = k < K ? min(8, N - c) : 0; \
      const int base = b_off + k * N + c; \
      b_next[l] = PACK8(b_data, base, valid); \
    } \
  }
#define STORE_B(stage) \
  [[unroll]] for (int l = 0; l < B_LOADS; ++l) { \
    const int s = tid + l * THREADS; \
    b_tile[(stage) * B_SIZE + (s / (BN / 8)) * B_STRIDE + s % (BN / 8)] = b_next[l]; \
  }
#endif

  LOAD_A(0)
  LOAD_B(0)
#if STAGES == 2
  STORE_A(0)
  STORE_B(0)
  barrier();
#endif
  int stage = 0;
#if PROBE == 3
  barrier();
  coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> am_p[FM];
  coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> bm_p[FN];
  [[unroll]] for (int i = 0; i < FM; ++i) {
    coopMatLoad(am_p[i], a_tile, 0, A_STRIDE,
                gl_CooperativeMatrixLayoutRowMajor);
  }
  [[unroll]] for (int j = 0; j < FN; ++j) {
    coopMatLoad(bm_p[j], b_tile, 0, B_STRIDE,
                gl_CooperativeMatrixLayoutColumnMajor);
  }
#endif
  for (int k0 = 0; k0 < K; k0 += BK) {
    const bool more = k0 + BK < K;  // uniform
#if STAGES == 1 && PROBE < 2
    barrier();  // the previous step's products have read the tiles
    STORE_A(0)
    STORE_B(0)
    barrier();
#endif
#if PROBE == 0
    if (more) {  // the next slice's global loads overlap this one's products
      LOAD_A(k0 + BK)
      LOAD_B(k0 + BK)
    }
#endif
    const int a_base = stage * A_SIZE;
    const int b_base = stage * B_SIZE;
#if PROBE == 3
    [[unroll]] for (int kk = 0; kk < BK; kk += 16) {
      [[unroll]] for (int j = 0; j < FN; ++j) {
        [[unroll]] for (int i = 0; i < FM; ++i) {
          acc[i][j] = coopMatMulAdd(am_p[i], bm_p[j], acc[i][j]);
        }
      }
    }
#else
    [[unroll]] for (int kk = 0; kk < BK; kk += 16) {
      coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> am[FM];
      [[unroll]] for (int i = 0; i < FM; ++i) {
        coopMatLoad(am[i], a_tile, a_base + (sg_row + 16 * i) * A_STRIDE + kk / 8, A_STRIDE,
                    gl_CooperativeMatrixLayoutRowMajor);
      }
      [[unroll]] for (int j = 0; j < FN; ++j) {
        coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> bm;
#ifdef B_NK
        coopMatLoad(bm, b_tile, b_base + (sg_col + 16 * j) * B_STRIDE + kk / 8, B_STRIDE,
                    gl_CooperativeMatrixLayoutColumnMajor);
#else
        coopMatLoad(bm, b_tile, b_base + kk * B_STRIDE + (sg_col + 16 * j) / 8, B_STRIDE,
                    gl_CooperativeMatrixLayoutRowMajor);
#endif
        [[unroll]] for (int i = 0; i < FM; ++i) {
          acc[i][j] = coopMatMulAdd(am[i], bm, acc[i][j]);
        }
      }
    }
#endif
#if STAGES == 2
#if PROBE < 2
    if (more) {
      STORE_A(stage ^ 1)
      STORE_B(stage ^ 1)
    }
    barrier();  // the stores are visible, and nobody reads this stage any more
#endif
    stage ^= 1;
#endif
  }
#if STAGES == 1
  barrier();  // the shared a tile is free for the epilogue
#endif

  const int out_off = zb * M * N;
  // Matrix stores need 16-byte aligned rows (Vulkan: the lesser of 16 bytes and a
  // row's size), so N a multiple of 8 (and then so is out_off).
#ifdef HAS_BIAS
  const bool direct = (N & 7) == 0 && scalars.y == 0.0;  // ATen ignores a 0 * bias
#else
  const bool direct = (N & 7) == 0;
#endif
  const int region = sg * 64;  // this subgroup's 16 x 16 fp32 staging tile
  const int lane = int(gl_SubgroupInvocationID);
  [[unroll]] for (int i = 0; i < FM; ++i) {
    [[unroll]] for (int j = 0; j < FN; ++j) {
      const int m0 = row0 + sg_row + 16 * i;
      const int n0 = col0 + sg_col + 16 * j;
      if (direct && m0 + 16 <= M && n0 + 16 <= N) {  // uniform in the subgroup
        coopmat<OUT_T, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator> o =
            coopmat<OUT_T, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>(
                ACC_F(acc[i][j]) * scalars.x);
        coopMatStore(o, out_data, out_off + m0 * N + n0, N, gl_CooperativeMatrixLayoutRowMajor);
      } else if (m0 < M && n0 < N) {
        coopMatStore(ACC_F(acc[i][j]), a_tile, region, 4, gl_CooperativeMatrixLayoutRowMajor);
        subgroupBarrier();  // the tile is in shared memory for every lane
        for (int e = lane; e < 256; e += int(gl_SubgroupSize)) {
          const int m = m0 + e / 16;
          const int n = n0 + e % 16;
          if (m < M && n < N) {
            const float v = uintBitsToFloat(a_tile[region + e / 4][e % 4]);
            out_data[out_off + m * N + n] = OUT_STORE(epilogue(v, c_off, m, n));
          }
        }
        subgroupBarrier();  // every lane has read it before the next tile overwrites it
      }
    }
  }
}
