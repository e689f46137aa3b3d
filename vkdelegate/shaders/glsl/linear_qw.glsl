#version 450
#extension GL_GOOGLE_include_directive : require
#ifdef INT_DOT
#extension GL_EXT_spirv_intrinsics : require
#endif
#include "common.h"

// Quantized-weight linear: out[m, n] = sum_k x[m, k] * dequant(w)[n, k] (+ bias[n]),
// accumulated in fp32, for the weight formats of ExecuTorch's Vulkan backend:
//   W4: et_vk.linear_q4gsw: w = uint8 [N, K/2] (two int4 per byte, k even in the low
//       nibble, stored + 8), scales [K / GS, N]; dequant = (nibble - 8) * scale,
//       rounded to fp16 with F16_WEIGHTS (what an fp16 model's dequantize gives).
//   W8: aten._weight_int8pack_mm: w = int8 [N, K], scales [N]; out = (x @ w.T) * s.
//   DQ8CA (with W4): et_vk.linear_dq8ca_q4gsw: x is first quantized per row with the
//       given scale / int8 zero point (clamp(roundEven(x / s) + zp, -128, 127), as
//       torchao's quantize_affine), products summed as integers per group.
// The weight is read in chunks of CH values of k: a uint word (8 int4 or 4 int8
// values) with W_WORDS, else one W_T element (int8 with K % 4 != 0, or the 32-bit
// fallback of devices without 8-bit storage, which assembles each word from 4 bytes).
// Forms:
//   GEMV: one workgroup (WG invocations, a power of two) per NPW output columns of one
//     row: the invocations split the K chunks (consecutive invocations read
//     consecutive words of a weight row), then a shared-memory tree reduction.
//   else GEMM: one invocation per M_TILE x 4 output tile (M_TILE 4, or 1 for fewer
//     than 4 rows); edge tiles re-read the last row / column and store only their
//     valid part.
// DQ8CA's zero point is corrected with the precomputed per-group weight sums; INT_DOT:
// int8 dot products of 4 packed values (dotPacked4x8EXT).
// SWIGLU (W4 or W8, with or without DQ8CA; vkdelegate.linear_q4gsw_swiglu /
// weight_int8pack_mm_swiglu / linear_dq8ca_q4gsw_swiglu, kernels/swiglu.py): w is a
// merged gate/up weight of 2N rows for an output of N columns (qdims.y = N; scales
// and bias index the merged rows). Output n has the sums of rows n (gate) and N + n (up), each accumulated
// exactly as the plain form accumulates that column (GEMV: a workgroup's NPW rows are
// NPW / 2 gate rows and the matching up rows, NPW / 2 outputs; GEMM: an invocation's 4
// columns accumulate their gate and up rows), finished as the plain op finishes them
// and rounded as its store rounds them (SWIGLU_HALF: round_to_half), then CHAIN_BODY
// (the fused elementwise chain's GLSL) over r0 = gate and r1 = up.
// HAS_RESIDUAL (not SWIGLU; the *_add ops, kernels/residual.py): r_data (out's shape,
// [M, N]) added to each output in fp32 after the bias, one rounding at the store.

#if defined(SWIGLU) && defined(HAS_RESIDUAL)
#error "SWIGLU takes no HAS_RESIDUAL"
#endif


TENSOR_OUT(out_data, OUT_T)
TENSOR_IN(x_data, X_T)
#ifdef W_WORDS
TENSOR_IN(w_data, uint)
#else
TENSOR_IN(w_data, W_T)
#endif
TENSOR_IN(s_data, S_T)
#ifdef HAS_BIAS
TENSOR_IN(c_data, C_T)
#endif
#ifdef DQ8CA
TENSOR_IN(xs_data, XS_T)
TENSOR_IN(xz_data, XZ_T)
TENSOR_IN(sum_data, int)
#endif
#ifdef HAS_RESIDUAL
TENSOR_IN(r_data, R_T)
#endif
TENSOR_META(out_meta)
// qdims: K, N, group size (W4), weight chunks per row (K / CH); qstrides: row strides
// of the scales (W4) and of the weight sums (DQ8CA), N or padded past it, and of the
// weight in chunks (past K / CH where ExecuTorch padded K to a multiple of 8).
PARAMS(qlinear_block) { ivec4 qdims; ivec4 qstrides; };
#include "qlinear.h"

#ifdef W4
#define CH 8
#elif defined(W_WORDS)
#define CH 4
#else
#define CH 1
#endif

#ifdef F16_WEIGHTS
#define WROUND(v) round_to_half(v)
#else
#define WROUND(v) (v)
#endif

#ifndef W_WORDS
uint byte_at(int i) { return uint(int(w_data[i])) & 0xFFu; }
#endif

// Word / element c of weight row n (``stride`` of them per row).
uint load_word(int n, int c, int stride) {
  const int i = n * stride + c;
#ifdef W_WORDS
  return w_data[i];
#elif CH == 1
  return uint(int(w_data[i]));
#else
  return byte_at(4 * i) | (byte_at(4 * i + 1) << 8) | (byte_at(4 * i + 2) << 16)
      | (byte_at(4 * i + 3) << 24);
#endif
}

// The CH signed weight values of a word, in k order.
void unpack(uint word, out int q[CH]) {
#ifdef W4
  [[unroll]] for (int t = 0; t < 8; ++t) {
    q[t] = int((word >> (4 * t)) & 0xFu) - 8;
  }
#elif CH == 4
  [[unroll]] for (int t = 0; t < 4; ++t) {
    q[t] = bitfieldExtract(int(word), 8 * t, 8);
  }
#else
  q[0] = int(word);
#endif
}


// One chunk of a row of x as the products read it: its values and, for DQ8CA, their
// int8 quantization (clamp(roundEven(x / s) + z), as torchao's quantize_affine; with
// INT_DOT packed by k parity, the low nibbles holding k even, with their sum), made
// once per chunk and row, shared by every column.
struct XChunk {
  float v[CH];
#ifdef DQ8CA
  int q[CH];
#ifdef INT_DOT
  uint even;
  uint odd;
  int qsum;
#endif
#endif
};

XChunk load_x(int m, int c, int K, float inv, int z) {
  XChunk x;
  [[unroll]] for (int t = 0; t < CH; ++t) {
    x.v[t] = float(x_data[m * K + c * CH + t]);
#ifdef DQ8CA
    x.q[t] = int(quantize_x(x.v[t], inv, z));
#endif
  }
#ifdef INT_DOT
  x.even = 0u;
  x.odd = 0u;
  x.qsum = 0;
  [[unroll]] for (int t = 0; t < 8; ++t) {
    x.qsum += x.q[t];
    if ((t & 1) == 0) {
      x.even |= (uint(x.q[t]) & 0xFFu) << (8 * (t >> 1));
    } else {
      x.odd |= (uint(x.q[t]) & 0xFFu) << (8 * (t >> 1));
    }
  }
#endif
  return x;
}

// One chunk's contribution to out[m, n]: x chunk x, weight word of column n.
float chunk_dot(XChunk x, uint word, int n, int c, ivec4 dims, float xs, int z) {
  int q[CH];
#ifdef W4
  const float s = float(s_data[((c * CH) / dims.z) * qstrides.x + n]);
#endif
#ifdef DQ8CA
  // sum_k (xq - z) * q over a group = sum_k xq * q - z * (the group's weight sum):
  // the chunk that starts a group subtracts the zero point's share.
  const int g = (c * CH) / dims.z;
  int isum = (c * CH) % dims.z == 0 ? -z * sum_data[g * qstrides.y + n] : 0;
#ifdef INT_DOT
  // Against the stored nibbles (0..15, the value + 8): minus 8 * sum(xq).
  isum += dotPacked4x8EXT(x.even, word & 0x0F0F0F0Fu)
      + dotPacked4x8EXT(x.odd, (word >> 4) & 0x0F0F0F0Fu) - 8 * x.qsum;
#else
  unpack(word, q);
  [[unroll]] for (int t = 0; t < CH; ++t) {
    isum += x.q[t] * q[t];
  }
#endif
  return float(isum) * (s * xs);
#elif defined(W4)
  unpack(word, q);
  float acc = 0.0;
  [[unroll]] for (int t = 0; t < CH; ++t) {
    acc += x.v[t] * WROUND(float(q[t]) * s);
  }
  return acc;
#else
  unpack(word, q);
  float acc = 0.0;
  [[unroll]] for (int t = 0; t < CH; ++t) {
    acc += x.v[t] * float(q[t]);
  }
  return acc;
#endif
}

#ifdef W8
#define SCALE_LAST  // the int8 scale once per output, after the sum
#endif
#include "qlinear_out.h"  // finish(acc, m, n) (the scale, bias, residual), swiglu_out

#ifdef GEMV
shared float partial[NPW * WG];
#ifdef SWIGLU
#define OUT_NPW (NPW / 2)  // outputs per workgroup: a gate row and an up row each
#else
#define OUT_NPW NPW
#endif

void main() {
  const ivec4 dims = qdims;
  const int K = dims.x;
  const int N = dims.y;
  const int row_chunks = dims.w;
  const int M = N > 0 ? numel_of(out_meta) / N : 0;
  const int lid = int(gl_LocalInvocationID.x);
  const int n0 = int(gl_WorkGroupID.x) * OUT_NPW;
  const int m = int(gl_WorkGroupID.y);
  const bool live = m < M && n0 < N;  // uniform across the workgroup
  float inv = 0.0, xs = 0.0;
  int z = 0;
#ifdef DQ8CA
  if (live) {
    row_qparams(m, inv, xs, z);
  }
#endif
  float acc[NPW];
  [[unroll]] for (int j = 0; j < NPW; ++j) {
    acc[j] = 0.0;
  }
  if (live) {
    for (int c = lid; c < row_chunks; c += WG) {
      const XChunk xc = load_x(m, c, K, inv, z);
      [[unroll]] for (int j = 0; j < NPW; ++j) {
#ifdef SWIGLU
        const int n = j < OUT_NPW ? min(n0 + j, N - 1) : N + min(n0 + j - OUT_NPW, N - 1);
#else
        const int n = min(n0 + j, N - 1);
#endif
        acc[j] += chunk_dot(xc, load_word(n, c, qstrides.z), n, c, dims, xs, z);
      }
    }
  }
  [[unroll]] for (int j = 0; j < NPW; ++j) {
    partial[j * WG + lid] = acc[j];
  }
  barrier();
  for (int s = WG / 2; s > 0; s >>= 1) {
    if (lid < s) {
      [[unroll]] for (int j = 0; j < NPW; ++j) {
        partial[j * WG + lid] += partial[j * WG + lid + s];
      }
    }
    barrier();
  }
#ifdef SWIGLU
  if (live && lid < OUT_NPW && n0 + lid < N) {
    out_data[m * N + n0 + lid] = OUT_STORE(swiglu_out(
        partial[lid * WG], partial[(lid + OUT_NPW) * WG], m, n0 + lid));
  }
#else
  if (live && lid < NPW && n0 + lid < N) {
    out_data[m * N + n0 + lid] = OUT_STORE(finish(partial[lid * WG], m, n0 + lid));
  }
#endif
}

#else  // GEMM: an M_TILE x 4 tile per invocation

void main() {
  const ivec4 dims = qdims;
  const int K = dims.x;
  const int N = dims.y;
  const int row_chunks = dims.w;
  const int M = N > 0 ? numel_of(out_meta) / N : 0;
  const int n0 = int(gl_GlobalInvocationID.x) * 4;
  const int m0 = int(gl_GlobalInvocationID.y) * M_TILE;
  if (n0 >= N || m0 >= M) {
    return;
  }
  int rows[M_TILE];
  int cols[4];
  float inv[M_TILE], xs[M_TILE];
  int z[M_TILE];
  [[unroll]] for (int j = 0; j < 4; ++j) {
    cols[j] = min(n0 + j, N - 1);
  }
  [[unroll]] for (int i = 0; i < M_TILE; ++i) {
    rows[i] = min(m0 + i, M - 1);
    inv[i] = 0.0;
    xs[i] = 0.0;
    z[i] = 0;
#ifdef DQ8CA
    row_qparams(rows[i], inv[i], xs[i], z[i]);
#endif
  }
  float acc[M_TILE][4];
#ifdef SWIGLU
  float acc_up[M_TILE][4];  // the up rows N + cols[j]
#endif
  [[unroll]] for (int i = 0; i < M_TILE; ++i) {
    [[unroll]] for (int j = 0; j < 4; ++j) {
      acc[i][j] = 0.0;
#ifdef SWIGLU
      acc_up[i][j] = 0.0;
#endif
    }
  }
  for (int c = 0; c < row_chunks; ++c) {
    uint words[4];
    [[unroll]] for (int j = 0; j < 4; ++j) {
      words[j] = load_word(cols[j], c, qstrides.z);
    }
#ifdef SWIGLU
    uint words_up[4];
    [[unroll]] for (int j = 0; j < 4; ++j) {
      words_up[j] = load_word(N + cols[j], c, qstrides.z);
    }
#endif
    [[unroll]] for (int i = 0; i < M_TILE; ++i) {
      const XChunk xc = load_x(rows[i], c, K, inv[i], z[i]);
      [[unroll]] for (int j = 0; j < 4; ++j) {
        acc[i][j] += chunk_dot(xc, words[j], cols[j], c, dims, xs[i], z[i]);
#ifdef SWIGLU
        acc_up[i][j] += chunk_dot(xc, words_up[j], N + cols[j], c, dims, xs[i], z[i]);
#endif
      }
    }
  }
  [[unroll]] for (int i = 0; i < M_TILE; ++i) {
    [[unroll]] for (int j = 0; j < 4; ++j) {
      if (m0 + i < M && n0 + j < N) {
#ifdef SWIGLU
        out_data[(m0 + i) * N + n0 + j] = OUT_STORE(swiglu_out(acc[i][j], acc_up[i][j],
                                                               m0 + i, n0 + j));
#else
        out_data[(m0 + i) * N + n0 + j] = OUT_STORE(finish(acc[i][j], m0 + i, n0 + j));
#endif
      }
    }
  }
}
#endif
