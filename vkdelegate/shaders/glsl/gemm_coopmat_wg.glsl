#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_NV_cooperative_matrix2 : require
#extension GL_EXT_shader_explicit_arithmetic_types : require
#include "common.h"

// The GEMM core's workgroup-scope cooperative-matrix form (VK_NV_cooperative_matrix2:
// workgroup scope, flexible dimensions, tensor addressing, per-element operations;
// fp16 data, fp32 accumulation): out[..., M, N] = alpha * a[..., M, K] @ B + beta *
// bias, B per gemm.h (b [..., K, N], or b [..., N, K] with B_NK), batch dims
// broadcasting; the same bindings and epilogue as gemm.glsl. The whole workgroup owns
// ONE BM x BN accumulator matrix and, per step of BK along K, loads a BM x BK matrix
// of a and a BK x BN matrix of B with tensor-addressed loads: the driver stages them
// through shared memory and spreads the products over the workgroup's subgroups
// ("compiler-managed staging"), so this shader has no shared memory, barrier or
// fragment bookkeeping of its own.
// Two paths, chosen per workgroup (uniform): a block wholly inside [M, N] with K a
// multiple of BK and of 8 and N of 8 (16-byte rows) loads and stores through
// unclamped 2-D layouts; any other block through clamped 3-D layouts (batch, rows,
// columns): loads past an edge read zeros and stores past it are dropped, so ragged
// M, N and K need no other care. Both run UNROLL K steps of BK per iteration (the
// driver overlaps the loads of unrolled steps with the products: 183 TFLOP/s at
// UNROLL 1, 300 at 32 on an H100), then single steps for K's rest.
// (KHR loads of workgroup-scope matrices, without tensor addressing, ran 40x slower
// on an H100: docs/PERF.md.)
// Epilogue: alpha * acc (a matrix times a scalar); with HAS_BIAS, gemm.h's epilogue
// per element (coopMatPerElementNV) for the elements inside [M, N].
// Defines: OUT_T (float or float16_t), A_T = B_T = float16_t (C_T with HAS_BIAS), BM,
// BN, BK (multiples of the device's flexible granularities for THREADS invocations),
// THREADS (the runtime passes it as local size x), UNROLL, B_NK, HAS_BIAS.
// local_size (THREADS, 1, 1); grid x over N / BN, y over M / BM (upper bounds), z the
// batch index.

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

#define ACC coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>
#define MAT_A coopmat<float16_t, gl_ScopeWorkgroup, BM, BK, gl_MatrixUseA>
#define MAT_B coopmat<float16_t, gl_ScopeWorkgroup, BK, BN, gl_MatrixUseB>
#define CLAMPED gl_CooperativeMatrixClampModeConstantNV
// The K loop of both paths below, each with its own LOAD_A / LOAD_B (a's BM x BK and
// B's BK x BN matrix at k = kk): UNROLL steps of BK per iteration up to k_main, then
// single steps for the rest.
#define STEP(kk) {                \
    MAT_A am;                     \
    MAT_B bm;                     \
    LOAD_A(am, kk);               \
    LOAD_B(bm, kk);               \
    acc = coopMatMulAdd(am, bm, acc); \
  }
#define K_LOOP()                                                    \
  for (int k = 0; k < k_main; k += BK * UNROLL) {                   \
    [[unroll]] for (int u = 0; u < UNROLL; ++u) STEP(k + u * BK)    \
  }                                                                 \
  for (int k = k_main; k < K; k += BK) STEP(k)

#ifdef HAS_BIAS
// Element (r, c) of the block at (m0, n0): gemm.h's epilogue inside [M, N].
float bias_epilogue(const in uint32_t r, const in uint32_t c, const in float v,
                    const in int c_off, const in int m0, const in int n0, const in int M,
                    const in int N) {
  const int m = m0 + int(r);
  const int n = n0 + int(c);
  return m < M && n < N ? epilogue(v, c_off, m, n) : v;
}
#endif

void main() {
  if (numel_of(out_meta) == 0) {
    return;  // uniform across the dispatch
  }
  const int N = size_at(out_meta, 0);
  const int M = size_at(out_meta, 1);
  const int K = size_at(a_meta, 0);
  const int zb = int(gl_WorkGroupID.z);
  int a_off, b_off, c_off;
  if (!batch_offsets(zb, a_off, b_off, c_off)) {
    return;  // a whole workgroup past the batch count
  }
  const int m0 = int(gl_WorkGroupID.y) * BM;
  const int n0 = int(gl_WorkGroupID.x) * BN;
  if (m0 >= M || n0 >= N) {
    return;  // past the current sizes (the grid covers the upper bounds)
  }
  ACC acc = ACC(0.0);
  // K in UNROLL steps of BK per iteration, then single steps for the rest.
  const int k_main = K - K % (BK * UNROLL);
  const bool whole = m0 + BM <= M && n0 + BN <= N && K % BK == 0 && (K & 7) == 0 &&
      (N & 7) == 0;  // uniform in the workgroup
  if (whole) {
    // Whole block, 16-byte rows (the masks tell the compiler so).
    const int k8 = K & ~7;
    tensorLayoutNV<2> la = createTensorLayoutNV(2);
    la = setTensorLayoutDimensionNV(la, M, k8);
    la = setTensorLayoutStrideNV(la, k8, 1);
    tensorLayoutNV<2> lb = createTensorLayoutNV(2);
#ifdef B_NK
    tensorViewNV<2, false, 1, 0> transposed = createTensorViewNV(2, false, 1, 0);
    lb = setTensorLayoutDimensionNV(lb, N, k8);
    lb = setTensorLayoutStrideNV(lb, k8, 1);
#define LOAD_B(bm, kk) coopMatLoadTensorNV(bm, b_data, uint(b_off & ~7), \
                                           sliceTensorLayoutNV(lb, n0, BN, kk, BK), transposed)
#else
    lb = setTensorLayoutDimensionNV(lb, k8, N & ~7);
    lb = setTensorLayoutStrideNV(lb, N & ~7, 1);
#define LOAD_B(bm, kk) coopMatLoadTensorNV(bm, b_data, uint(b_off & ~7), \
                                           sliceTensorLayoutNV(lb, kk, BK, n0, BN))
#endif
#define LOAD_A(am, kk) coopMatLoadTensorNV(am, a_data, uint(a_off & ~7), \
                                           sliceTensorLayoutNV(la, m0, BM, kk, BK))
    K_LOOP()
#undef LOAD_A
#undef LOAD_B
  } else {
    // A block at an edge, or sizes without 16-byte rows: clamped 3-D layouts over
    // (batch, rows, columns) from each buffer's start (the batch offsets are whole
    // matrices: a_off / (M * K) is a's batch index); the last step reads zeros past K.
    const int a_batch = a_off / max(1, M * K);
    const int b_batch = b_off / max(1, N * K);
    tensorLayoutNV<3, CLAMPED> la = createTensorLayoutNV(3, CLAMPED);
    la = setTensorLayoutDimensionNV(la, a_batch + 1, M, K);
    tensorLayoutNV<3, CLAMPED> lb = createTensorLayoutNV(3, CLAMPED);
#ifdef B_NK
    tensorViewNV<3, false, 0, 2, 1> transposed = createTensorViewNV(3, false, 0, 2, 1);
    lb = setTensorLayoutDimensionNV(lb, b_batch + 1, N, K);
#define LOAD_B(bm, kk) coopMatLoadTensorNV(bm, b_data, 0, \
                                           sliceTensorLayoutNV(lb, b_batch, 1, n0, BN, kk, BK), \
                                           transposed)
#else
    lb = setTensorLayoutDimensionNV(lb, b_batch + 1, K, N);
#define LOAD_B(bm, kk) coopMatLoadTensorNV(bm, b_data, 0, \
                                           sliceTensorLayoutNV(lb, b_batch, 1, kk, BK, n0, BN))
#endif
#define LOAD_A(am, kk) coopMatLoadTensorNV(am, a_data, 0, \
                                           sliceTensorLayoutNV(la, a_batch, 1, m0, BM, kk, BK))
    K_LOOP()
#undef LOAD_A
#undef LOAD_B
  }
#ifdef HAS_BIAS
  coopMatPerElementNV(acc, acc, bias_epilogue, c_off, m0, n0, M, N);
#else
  acc = acc * scalars.x;
#endif
  coopmat<OUT_T, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator> o =
      coopmat<OUT_T, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>(acc);
  if (whole) {
    const int n8 = N & ~7;
    tensorLayoutNV<2> lo = createTensorLayoutNV(2);
    lo = setTensorLayoutDimensionNV(lo, M, n8);
    lo = setTensorLayoutStrideNV(lo, n8, 1);
    coopMatStoreTensorNV(o, out_data, uint((zb * M * n8) & ~7),
                         sliceTensorLayoutNV(lo, m0, BM, n0, BN));
  } else {
    tensorLayoutNV<3, CLAMPED> lo = createTensorLayoutNV(3, CLAMPED);
    lo = setTensorLayoutDimensionNV(lo, zb + 1, M, N);
    coopMatStoreTensorNV(o, out_data, 0, sliceTensorLayoutNV(lo, zb, 1, m0, BM, n0, BN));
  }
}
