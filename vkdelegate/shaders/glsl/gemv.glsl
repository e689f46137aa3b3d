#version 450
#extension GL_GOOGLE_include_directive : require
#ifdef SUBGROUP
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif
#include "common.h"

// The GEMV path: products with one row per batch (M = 1, LLM decode), bandwidth-bound
// on B, so each workgroup splits the K reduction across its invocations (each reads
// its own part of B, adjacent invocations adjacent addresses) and sums the partial
// sums in shared memory. Same products, bindings and epilogue as the GEMM core
// (gemm.h).
//   B_NK (b [N, K], nn.Linear's weight): local_size (128, 1, 1); a workgroup computes
//     ROWS outputs, invocation t reading k = t, t + 128, ... (VEC4: vec4s 4t.. of K)
//     of each of its ROWS weight rows, UNROLL such k (vector) steps per iteration with
//     all their loads issued before the first is used (indices clamped in bounds, so
//     no branch separates them); then subgroupAdd and one shared slot per subgroup
//     (SUBGROUP, devices with subgroup arithmetic), else a tree sum over the 128
//     invocations.
//   otherwise (b [K, N]): local_size (16, 16, 1); a workgroup computes 64 columns,
//     invocation (x, y) columns 4x..4x+3 over k = y, y + 16, ... (VEC4: one vec4 load
//     per k); then a tree sum over y.
// VEC4: the innermost dim of b (K with B_NK, else N) and the batch offsets are
// multiples of 4 (the op checks at load), so b_data (and with B_NK a_data) is read as
// vec4s (B_VT, A_VT: vec4 or f16vec4). VEC8 (B_NK, fp16 data stored as 16 bits, K a
// multiple of 8): uvec4 loads of 8 fp16 values, unpacked with unpackHalf2x16.
// HAS_RESIDUAL (vkdelegate.linear_add): r_data (out's shape) is added to each output
// in fp32 after the bias, one rounding at the store (gemm.h's WITH_RESIDUAL).
// RMS_NORM (B_NK only; vkdelegate.rms_norm_linear, vkdelegate.rms_norm_linear_swiglu):
// the product's row is et_vk.rms_norm(a, n_data, eps) (n_data [K], eps = scalars.z),
// never formed: each invocation multiplies its elements of a by the norm weight's as
// it loads them (a * w, fp32) and sums their squares alongside the products; the sum
// of squares is reduced with the products' sums (one more slot), and each output's
// sum is scaled by 1 / sqrt(sum / K + eps) before the epilogue. The weight loads start
// at once (a prologue that normalized the row first delayed them: docs/PERF.md). Not
// rounded to a's dtype in between (norm.glsl stores the normalized row in a's
// dtype): in fp16 the products differ from the unfused pair's by that rounding.
// SWIGLU (B_NK only; vkdelegate.linear_swiglu, kernels/swiglu.py): b is a merged
// gate/up weight [2N, K] for an output of N columns; a workgroup's ROWS rows are the
// gate rows n0 .. n0 + ROWS/2 - 1 and the up rows N + n0 .., so each of its ROWS/2
// outputs has its pair (n, N + n) of dot products (each computed exactly as the plain
// GEMV computes that row); the output is CHAIN_BODY (the fused elementwise chain's
// GLSL) over r0 = gate and r1 = up, each rounded to the output dtype first
// (SWIGLU_HALF: round_to_half, the value the linear's fp16 store keeps).
// ROTARY (B_NK only; vkdelegate.rms_norm_linear_rotary_cache, kernels/rotary_cache.py):
// b is a merged q/k/v weight [N, K] (N = Nq + 2 Nk, rot.x = Nq, rot.y = Nk) and the
// product y [N] is never stored: a workgroup's ROWS rows are ROWS/2 units of two rows
// (rotary_cache.h, shared with linear_qw_gemv.glsl: ``rotary_row``), slot r < ROWS/2
// the first row of unit n0 + r, slot ROWS/2 + r its second; invocation t < ROWS/2
// finishes its unit's two sums with the epilogue, rounds them as the linear's store
// would (ROTARY_ROUND) and rotates or writes them (``rotary_out``: q', k' into
// cache_data at the position's row, v into cache2_data; an index ATen rejects sets
// error_flags[rot.w] and writes nothing). Its cos/sin and positions are loaded before
// the products (``rotary_loads``).
// Each row's sum is computed exactly as the plain GEMV computes it.
// fp32 accumulation. Grid: x over the output blocks,
// z the batch index (as gemm.glsl); out's M must be 1.

TENSOR_OUT(out_data, OUT_T)
#if defined(VEC8)
TENSOR_IN(a_data, uvec4)
#elif defined(VEC4) && defined(B_NK)
TENSOR_IN(a_data, A_VT)
#else
TENSOR_IN(a_data, A_T)
#endif
#if defined(VEC8)
TENSOR_IN(b_data, uvec4)
#elif defined(VEC4)
TENSOR_IN(b_data, B_VT)
#else
TENSOR_IN(b_data, B_T)
#endif
#ifdef HAS_BIAS
TENSOR_IN(c_data, C_T)
#endif
#ifdef HAS_RESIDUAL
TENSOR_IN(r_data, R_T)
#endif
#ifdef RMS_NORM
#if defined(VEC8)
TENSOR_IN(n_data, uvec4)
#elif defined(VEC4)
TENSOR_IN(n_data, NW_VT)
#else
TENSOR_IN(n_data, NW_T)
#endif
#endif
TENSOR_META(out_meta)
TENSOR_META(a_meta)
TENSOR_META(b_meta)
#ifdef HAS_BIAS
TENSOR_META(c_meta)
#endif
#include "gemm.h"
#ifdef ROTARY
// out_data is q' (q's elements in order); out_meta describes the product y [.., N].
#define ROTARY_FINISH(s, c_off, n) epilogue(s, c_off, 0, n)
#include "rotary_cache.h"
#endif

#ifdef B_NK
#define THREADS 128
#ifdef RMS_NORM
#define SLOTS (ROWS + 1)  // the rows' sums, then the sum of squares of a's row
#else
#define SLOTS ROWS
#endif
shared float partial[SLOTS][THREADS];
#else
#ifdef RMS_NORM
#error "RMS_NORM needs B_NK"
#endif
#ifdef SWIGLU
#error "SWIGLU needs B_NK"
#endif
#ifdef ROTARY
#error "ROTARY needs B_NK"
#endif
#define THREADS 16
shared vec4 partial[THREADS][16];
#endif
// The products' row of a (main's a_off).
#define A_VEC8(kk) a_data[a_off / 8 + (kk)]
#define A_VEC4(kk) vec4(a_data[a_off / 4 + (kk)])
#define A_SCALAR(k) float(a_data[a_off + (k)])
#ifdef RMS_NORM
// An output's sum times the row's 1 / sqrt(mean(x^2) + eps) (eps = scalars.z).
#define NORM_SCALE(v, ss) ((v) * (1.0 / sqrt((ss) / float(K) + scalars.z)))
#else
#define NORM_SCALE(v, ss) (v)
#endif
#ifdef SWIGLU
#define OUT_ROWS (ROWS / 2)  // outputs per workgroup: a gate row and an up row each
// Output n's value from its gate and up sums: the linear's epilogue for columns n and
// N + n of the merged product, each rounded as the linear's store rounds it, then the
// chain.
float swiglu_out(float gate_acc, float up_acc, int c_off, int N, int n) {
  const float r0 = SWIGLU_ROUND(epilogue(gate_acc, c_off, 0, n));
  const float r1 = SWIGLU_ROUND(epilogue(up_acc, c_off, 0, N + n));
  CHAIN_BODY
  return CHAIN_RESULT;
}
#elif defined(ROTARY)
#define OUT_ROWS (ROWS / 2)  // units per workgroup: two rows each (rotary_row)
#else
#define OUT_ROWS ROWS
#endif

void main() {
  if (numel_of(out_meta) == 0) {
    return;  // uniform across the dispatch
  }
  const int N = size_at(out_meta, 0);
  const int K = size_at(a_meta, 0);
  int a_off, b_off, c_off;
  if (!batch_offsets(int(gl_WorkGroupID.z), a_off, b_off, c_off)) {
    return;  // a whole workgroup past the batch count
  }
  const int out_off = int(gl_WorkGroupID.z) * N;
#ifdef B_NK
  const int t = int(gl_LocalInvocationID.x);
  const int n0 = int(gl_WorkGroupID.x) * OUT_ROWS;
#ifdef ROTARY
  // The epilogue's invocations (t < OUT_ROWS, a unit each) load what it reads now.
  RotaryLoads loads = RotaryLoads(0.0, 0.0, 0.0, 0.0, 0, 0);
  if (t < OUT_ROWS && n0 + t < N / 2) {
    loads = rotary_loads(n0 + t);
  }
#endif
  float acc[ROWS];
  float ss = 0.0;  // RMS_NORM: the sum of squares of this invocation's elements of a
  int w_row[ROWS];
  [[unroll]] for (int r = 0; r < ROWS; ++r) {
    acc[r] = 0.0;
#ifdef SWIGLU
    w_row[r] = b_off + (r < OUT_ROWS ? min(n0 + r, N - 1)
                                     : N + min(n0 + r - OUT_ROWS, N - 1)) * K;
#elif defined(ROTARY)
    w_row[r] = b_off + rotary_row(min(n0 + r % OUT_ROWS, N / 2 - 1), r >= OUT_ROWS) * K;
#else
    w_row[r] = b_off + min(n0 + r, N - 1) * K;
#endif
  }
#if defined(VEC8)
  // UNROLL uvec4s (8 fp16 values each) per row per iteration: x's and every row's
  // loads first, then the products.
  const int K8 = K / 8;
  for (int k8 = t; k8 < K8; k8 += UNROLL * THREADS) {
    uvec4 xa[UNROLL];
    uvec4 w[UNROLL][ROWS];
#ifdef RMS_NORM
    uvec4 nw[UNROLL];
#endif
    [[unroll]] for (int u = 0; u < UNROLL; ++u) {
      const int kk = min(k8 + u * THREADS, K8 - 1);
      xa[u] = A_VEC8(kk);
#ifdef RMS_NORM
      nw[u] = n_data[kk];
#endif
      [[unroll]] for (int r = 0; r < ROWS; ++r) {
        w[u][r] = b_data[w_row[r] / 8 + kk];
      }
    }
    [[unroll]] for (int u = 0; u < UNROLL; ++u) {
      if (k8 + u * THREADS < K8) {
        vec4 x0 = vec4(unpackHalf2x16(xa[u].x), unpackHalf2x16(xa[u].y));
        vec4 x1 = vec4(unpackHalf2x16(xa[u].z), unpackHalf2x16(xa[u].w));
#ifdef RMS_NORM
        ss += dot(x0, x0) + dot(x1, x1);
        x0 *= vec4(unpackHalf2x16(nw[u].x), unpackHalf2x16(nw[u].y));
        x1 *= vec4(unpackHalf2x16(nw[u].z), unpackHalf2x16(nw[u].w));
#endif
        [[unroll]] for (int r = 0; r < ROWS; ++r) {
          acc[r] += dot(x0, vec4(unpackHalf2x16(w[u][r].x), unpackHalf2x16(w[u][r].y)))
              + dot(x1, vec4(unpackHalf2x16(w[u][r].z), unpackHalf2x16(w[u][r].w)));
        }
      }
    }
  }
#elif defined(VEC4)
  const int K4 = K / 4;
  for (int k4 = t; k4 < K4; k4 += UNROLL * THREADS) {
    vec4 xa[UNROLL];
    vec4 w[UNROLL][ROWS];
#ifdef RMS_NORM
    vec4 nw[UNROLL];
#endif
    [[unroll]] for (int u = 0; u < UNROLL; ++u) {
      const int kk = min(k4 + u * THREADS, K4 - 1);
      xa[u] = A_VEC4(kk);
#ifdef RMS_NORM
      nw[u] = vec4(n_data[kk]);
#endif
      [[unroll]] for (int r = 0; r < ROWS; ++r) {
        w[u][r] = vec4(b_data[w_row[r] / 4 + kk]);
      }
    }
    [[unroll]] for (int u = 0; u < UNROLL; ++u) {
      if (k4 + u * THREADS < K4) {
#ifdef RMS_NORM
        ss += dot(xa[u], xa[u]);
        xa[u] *= nw[u];
#endif
        [[unroll]] for (int r = 0; r < ROWS; ++r) {
          acc[r] += dot(xa[u], w[u][r]);
        }
      }
    }
  }
#else
  for (int k = t; k < K; k += THREADS) {
#ifdef RMS_NORM
    const float xr = A_SCALAR(k);
    ss += xr * xr;
    const float x = xr * float(n_data[k]);
#else
    const float x = A_SCALAR(k);
#endif
    [[unroll]] for (int r = 0; r < ROWS; ++r) {
      acc[r] += x * float(b_data[w_row[r] + k]);
    }
  }
#endif
#ifdef SUBGROUP
  [[unroll]] for (int r = 0; r < ROWS; ++r) {
    const float s = subgroupAdd(acc[r]);
    if (subgroupElect()) {
      partial[r][gl_SubgroupID] = s;
    }
  }
#ifdef RMS_NORM
  {
    const float s = subgroupAdd(ss);
    if (subgroupElect()) {
      partial[ROWS][gl_SubgroupID] = s;
    }
  }
#endif
  barrier();
  float ss_total = 0.0;
#ifdef RMS_NORM
  for (uint i = 0u; i < gl_NumSubgroups; ++i) {
    ss_total += partial[ROWS][i];
  }
#endif
#ifdef SWIGLU
  if (t < OUT_ROWS && n0 + t < N) {
    float gate = 0.0, up = 0.0;
    for (uint i = 0u; i < gl_NumSubgroups; ++i) {
      gate += partial[t][i];
      up += partial[t + OUT_ROWS][i];
    }
    out_data[out_off + n0 + t] = OUT_STORE(swiglu_out(NORM_SCALE(gate, ss_total),
                                                      NORM_SCALE(up, ss_total), c_off,
                                                      N, n0 + t));
  }
#elif defined(ROTARY)
  if (t < OUT_ROWS && n0 + t < N / 2) {
    float first = 0.0, second = 0.0;
    for (uint i = 0u; i < gl_NumSubgroups; ++i) {
      first += partial[t][i];
      second += partial[t + OUT_ROWS][i];
    }
    rotary_out(NORM_SCALE(first, ss_total), NORM_SCALE(second, ss_total), c_off, n0 + t,
               loads);
  }
#else
  if (t < ROWS && n0 + t < N) {
    float total = 0.0;
    for (uint i = 0u; i < gl_NumSubgroups; ++i) {
      total += partial[t][i];
    }
    out_data[out_off + n0 + t] = OUT_STORE(WITH_RESIDUAL(
        epilogue(NORM_SCALE(total, ss_total), c_off, 0, n0 + t), out_off + n0 + t));
  }
#endif
#else
  [[unroll]] for (int r = 0; r < ROWS; ++r) {
    partial[r][t] = acc[r];
  }
#ifdef RMS_NORM
  partial[ROWS][t] = ss;
#endif
  barrier();
  [[unroll]] for (int s = THREADS / 2; s > 0; s >>= 1) {
    if (t < s) {
      [[unroll]] for (int r = 0; r < SLOTS; ++r) {
        partial[r][t] += partial[r][t + s];
      }
    }
    barrier();
  }
#ifdef RMS_NORM
  const float ss_total = partial[ROWS][0];
#else
  const float ss_total = 0.0;
#endif
#ifdef SWIGLU
  if (t < OUT_ROWS && n0 + t < N) {
    out_data[out_off + n0 + t] = OUT_STORE(swiglu_out(
        NORM_SCALE(partial[t][0], ss_total), NORM_SCALE(partial[t + OUT_ROWS][0], ss_total),
        c_off, N, n0 + t));
  }
#elif defined(ROTARY)
  if (t < OUT_ROWS && n0 + t < N / 2) {
    rotary_out(NORM_SCALE(partial[t][0], ss_total),
               NORM_SCALE(partial[t + OUT_ROWS][0], ss_total), c_off, n0 + t, loads);
  }
#else
  if (t < ROWS && n0 + t < N) {
    out_data[out_off + n0 + t] = OUT_STORE(WITH_RESIDUAL(
        epilogue(NORM_SCALE(partial[t][0], ss_total), c_off, 0, n0 + t), out_off + n0 + t));
  }
#endif
#endif
#else
  const int tx = int(gl_LocalInvocationID.x);
  const int ty = int(gl_LocalInvocationID.y);
  const int c = int(gl_WorkGroupID.x) * 64 + 4 * tx;
  vec4 acc = vec4(0.0);
  if (c < N) {
    for (int k = ty; k < K; k += THREADS) {
      const float x = float(a_data[a_off + k]);
#ifdef VEC4
      acc += x * vec4(b_data[(b_off + k * N + c) / 4]);
#else
      [[unroll]] for (int e = 0; e < 4; ++e) {
        acc[e] += x * float(b_data[b_off + k * N + min(c + e, N - 1)]);
      }
#endif
    }
  }
  partial[ty][tx] = acc;
  barrier();
  [[unroll]] for (int s = THREADS / 2; s > 0; s >>= 1) {
    if (ty < s) {
      partial[ty][tx] += partial[ty + s][tx];
    }
    barrier();
  }
  if (ty == 0) {
    [[unroll]] for (int e = 0; e < 4; ++e) {
      if (c + e < N) {
        out_data[out_off + c + e] = OUT_STORE(WITH_RESIDUAL(
            epilogue(partial[0][tx][e], c_off, 0, c + e), out_off + c + e));
      }
    }
  }
#endif
}
