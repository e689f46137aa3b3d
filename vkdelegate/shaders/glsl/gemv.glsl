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
// RMS_NORM (B_NK only; vkdelegate.rms_norm_linear): the product's row is
// et_vk.rms_norm(a, n_data, eps) (n_data [K], eps = scalars.z), formed by each
// workgroup in a prologue: the raw row into shared memory xs (XS_LEN vector units,
// specialization constant 3: K / 8, K / 4 or K), its sum of squares in fp32
// (invocations stride over K; subgroupAdd or a tree, as the products' sums), rstd =
// 1 / sqrt(sum / K + eps), then each invocation rewrites its own elements as
// (x * rstd) * w, rounded once to a's dtype (NORM_HALF: fp16, round_to_half; as
// norm.glsl stores et_vk.rms_norm's output), and after a barrier the products read
// xs in place of a_data. Only the fp32 sum's order differs from norm.glsl's.
// SWIGLU (B_NK only; vkdelegate.linear_swiglu, kernels/swiglu.py): b is a merged
// gate/up weight [2N, K] for an output of N columns; a workgroup's ROWS rows are the
// gate rows n0 .. n0 + ROWS/2 - 1 and the up rows N + n0 .., so each of its ROWS/2
// outputs has its pair (n, N + n) of dot products (each computed exactly as the plain
// GEMV computes that row); the output is CHAIN_BODY (the fused elementwise chain's
// GLSL) over r0 = gate and r1 = up, each rounded to the output dtype first
// (SWIGLU_HALF: round_to_half, the value the linear's fp16 store keeps).
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
TENSOR_IN(n_data, NW_T)
#endif
TENSOR_META(out_meta)
TENSOR_META(a_meta)
TENSOR_META(b_meta)
#ifdef HAS_BIAS
TENSOR_META(c_meta)
#endif
#include "gemm.h"

#ifdef B_NK
#define THREADS 128
shared float partial[ROWS][THREADS];
#ifdef RMS_NORM
layout(constant_id = 3) const int XS_LEN = 1;
#if defined(VEC8)
shared uvec4 xs[XS_LEN];  // 8 fp16 values each, as a_data's uvec4s
#define A_VEC8(kk) xs[kk]
#elif defined(VEC4)
shared vec4 xs[XS_LEN];
#define A_VEC4(kk) xs[kk]
#else
shared float xs[XS_LEN];
#define A_SCALAR(k) xs[k]
#endif
#ifdef NORM_HALF
#define NORM_ROUND(v) round_to_half(v)
#else
#define NORM_ROUND(v) (v)
#endif

// The sum of every invocation's v (the same value in each): subgroupAdd and one slot
// per subgroup, else a tree, in partial[0]; the caller's next barrier must come
// before partial is written again.
float sum_threads(float v, int t) {
#ifdef SUBGROUP
  const float s = subgroupAdd(v);
  if (subgroupElect()) {
    partial[0][gl_SubgroupID] = s;
  }
  barrier();
  float total = 0.0;
  for (uint i = 0u; i < gl_NumSubgroups; ++i) {
    total += partial[0][i];
  }
  return total;
#else
  partial[0][t] = v;
  barrier();
  [[unroll]] for (int s = THREADS / 2; s > 0; s >>= 1) {
    if (t < s) {
      partial[0][t] += partial[0][t + s];
    }
    barrier();
  }
  return partial[0][0];
#endif
}

// The normalized row of a (K elements from a_off) into xs; ends with a barrier.
void rms_norm_row(int a_off, int K, int t) {
  float ss = 0.0;
#if defined(VEC8)
  const int KV = K / 8;
  for (int i = t; i < KV; i += THREADS) {
    const uvec4 v = a_data[a_off / 8 + i];
    xs[i] = v;
    const vec4 x0 = vec4(unpackHalf2x16(v.x), unpackHalf2x16(v.y));
    const vec4 x1 = vec4(unpackHalf2x16(v.z), unpackHalf2x16(v.w));
    ss += dot(x0, x0) + dot(x1, x1);
  }
#elif defined(VEC4)
  const int KV = K / 4;
  for (int i = t; i < KV; i += THREADS) {
    const vec4 v = vec4(a_data[a_off / 4 + i]);
    xs[i] = v;
    ss += dot(v, v);
  }
#else
  for (int i = t; i < K; i += THREADS) {
    const float v = float(a_data[a_off + i]);
    xs[i] = v;
    ss += v * v;
  }
#endif
  const float rstd = 1.0 / sqrt(sum_threads(ss, t) / float(K) + scalars.z);
  // Each invocation rewrites the elements it wrote: no barrier between.
#if defined(VEC8)
  for (int i = t; i < KV; i += THREADS) {
    const uvec4 v = xs[i];
    vec4 y0 = vec4(unpackHalf2x16(v.x), unpackHalf2x16(v.y)) * rstd;
    vec4 y1 = vec4(unpackHalf2x16(v.z), unpackHalf2x16(v.w)) * rstd;
    const int k = 8 * i;
    y0 *= vec4(float(n_data[k]), float(n_data[k + 1]), float(n_data[k + 2]),
               float(n_data[k + 3]));
    y1 *= vec4(float(n_data[k + 4]), float(n_data[k + 5]), float(n_data[k + 6]),
               float(n_data[k + 7]));
    // round_to_half's results are fp16 values: packHalf2x16 keeps them exactly.
    xs[i] = uvec4(packHalf2x16(vec2(round_to_half(y0.x), round_to_half(y0.y))),
                  packHalf2x16(vec2(round_to_half(y0.z), round_to_half(y0.w))),
                  packHalf2x16(vec2(round_to_half(y1.x), round_to_half(y1.y))),
                  packHalf2x16(vec2(round_to_half(y1.z), round_to_half(y1.w))));
  }
#elif defined(VEC4)
  for (int i = t; i < KV; i += THREADS) {
    const int k = 4 * i;
    const vec4 y = xs[i] * rstd * vec4(float(n_data[k]), float(n_data[k + 1]),
                                       float(n_data[k + 2]), float(n_data[k + 3]));
    xs[i] = vec4(NORM_ROUND(y.x), NORM_ROUND(y.y), NORM_ROUND(y.z), NORM_ROUND(y.w));
  }
#else
  for (int i = t; i < K; i += THREADS) {
    xs[i] = NORM_ROUND(xs[i] * rstd * float(n_data[i]));
  }
#endif
  barrier();  // xs complete, and every invocation has read partial[0]
}
#endif
#else
#ifdef RMS_NORM
#error "RMS_NORM needs B_NK"
#endif
#ifdef SWIGLU
#error "SWIGLU needs B_NK"
#endif
#define THREADS 16
shared vec4 partial[THREADS][16];
#endif
// The products' row of a (main's a_off): a_data, or xs with RMS_NORM.
#ifndef A_VEC8
#define A_VEC8(kk) a_data[a_off / 8 + (kk)]
#endif
#ifndef A_VEC4
#define A_VEC4(kk) vec4(a_data[a_off / 4 + (kk)])
#endif
#ifndef A_SCALAR
#define A_SCALAR(k) float(a_data[a_off + (k)])
#endif
#ifdef SWIGLU
#define OUT_ROWS (ROWS / 2)  // outputs per workgroup: a gate row and an up row each
#ifdef SWIGLU_HALF
#define SWIGLU_ROUND(v) round_to_half(v)
#else
#define SWIGLU_ROUND(v) (v)
#endif
// Output n's value from its gate and up sums: the linear's epilogue for columns n and
// N + n of the merged product, each rounded as the linear's store rounds it, then the
// chain.
float swiglu_out(float gate_acc, float up_acc, int c_off, int N, int n) {
  const float r0 = SWIGLU_ROUND(epilogue(gate_acc, c_off, 0, n));
  const float r1 = SWIGLU_ROUND(epilogue(up_acc, c_off, 0, N + n));
  CHAIN_BODY
  return CHAIN_RESULT;
}
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
#ifdef RMS_NORM
  rms_norm_row(a_off, K, t);
#endif
  float acc[ROWS];
  int w_row[ROWS];
  [[unroll]] for (int r = 0; r < ROWS; ++r) {
    acc[r] = 0.0;
#ifdef SWIGLU
    w_row[r] = b_off + (r < OUT_ROWS ? min(n0 + r, N - 1)
                                     : N + min(n0 + r - OUT_ROWS, N - 1)) * K;
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
    [[unroll]] for (int u = 0; u < UNROLL; ++u) {
      const int kk = min(k8 + u * THREADS, K8 - 1);
      xa[u] = A_VEC8(kk);
      [[unroll]] for (int r = 0; r < ROWS; ++r) {
        w[u][r] = b_data[w_row[r] / 8 + kk];
      }
    }
    [[unroll]] for (int u = 0; u < UNROLL; ++u) {
      if (k8 + u * THREADS < K8) {
        const vec4 x0 = vec4(unpackHalf2x16(xa[u].x), unpackHalf2x16(xa[u].y));
        const vec4 x1 = vec4(unpackHalf2x16(xa[u].z), unpackHalf2x16(xa[u].w));
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
    [[unroll]] for (int u = 0; u < UNROLL; ++u) {
      const int kk = min(k4 + u * THREADS, K4 - 1);
      xa[u] = A_VEC4(kk);
      [[unroll]] for (int r = 0; r < ROWS; ++r) {
        w[u][r] = vec4(b_data[w_row[r] / 4 + kk]);
      }
    }
    [[unroll]] for (int u = 0; u < UNROLL; ++u) {
      if (k4 + u * THREADS < K4) {
        [[unroll]] for (int r = 0; r < ROWS; ++r) {
          acc[r] += dot(xa[u], w[u][r]);
        }
      }
    }
  }
#else
  for (int k = t; k < K; k += THREADS) {
    const float x = A_SCALAR(k);
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
  barrier();
#ifdef SWIGLU
  if (t < OUT_ROWS && n0 + t < N) {
    float gate = 0.0, up = 0.0;
    for (uint i = 0u; i < gl_NumSubgroups; ++i) {
      gate += partial[t][i];
      up += partial[t + OUT_ROWS][i];
    }
    out_data[out_off + n0 + t] = OUT_STORE(swiglu_out(gate, up, c_off, N, n0 + t));
  }
#else
  if (t < ROWS && n0 + t < N) {
    float total = 0.0;
    for (uint i = 0u; i < gl_NumSubgroups; ++i) {
      total += partial[t][i];
    }
    out_data[out_off + n0 + t] = OUT_STORE(WITH_RESIDUAL(epilogue(total, c_off, 0, n0 + t),
                                                       out_off + n0 + t));
  }
#endif
#else
  [[unroll]] for (int r = 0; r < ROWS; ++r) {
    partial[r][t] = acc[r];
  }
  barrier();
  [[unroll]] for (int s = THREADS / 2; s > 0; s >>= 1) {
    if (t < s) {
      [[unroll]] for (int r = 0; r < ROWS; ++r) {
        partial[r][t] += partial[r][t + s];
      }
    }
    barrier();
  }
#ifdef SWIGLU
  if (t < OUT_ROWS && n0 + t < N) {
    out_data[out_off + n0 + t] = OUT_STORE(swiglu_out(partial[t][0],
                                                      partial[t + OUT_ROWS][0], c_off,
                                                      N, n0 + t));
  }
#else
  if (t < ROWS && n0 + t < N) {
    out_data[out_off + n0 + t] = OUT_STORE(WITH_RESIDUAL(
        epilogue(partial[t][0], c_off, 0, n0 + t), out_off + n0 + t));
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
