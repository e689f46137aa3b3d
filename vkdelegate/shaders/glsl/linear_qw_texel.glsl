#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"

// The weight-only quantized linears on CPU drivers (llvmpipe; ops/families/
// quantized_linear.py, ``texel_form``): out[m, n] = sum_k x[m, k] * dequant(w)[n, k]
// (+ bias[n]), fp32 accumulation, for
//   W4: et_vk.linear_q4gsw (groups of GS values of k, GS a multiple of 32): each
//       group's products with the integer weight values summed, then times the group's
//       scale once (fp16 models: the dequantized weight is not rounded to fp16 first,
//       as eager's dequantize does; at most 2^-12 of each product, as
//       linear_qw_gemv.glsl);
//   W8: aten._weight_int8pack_mm (K a multiple of 16): one group of K, the scale
//       applied after the sum as ATen does.
// Every large input is a uniform texel buffer (docs/RUNTIME.md, "Texel-buffer
// inputs"): on llvmpipe a texelFetch is one vectorised gather, a storage-buffer load at
// a run-time address a loop over the 8 SIMD lanes, and each fetch costs about the same
// whatever its width, so every fetch brings 16 bytes. No shared memory, no barrier, no
// division.
// Layout (the op prepacks the constants, ``pack_texel_weight`` / ``pack_texel_scales``):
// invocation gid is lane gid % 8 of tile gid / 8 and owns the R output columns
// tile * 8R + 8r + lane (r < R); its RW weight rows are those columns, then with SWIGLU
// the R up rows N + column (RW = 2R). The weight is [tile][block][RW][lane] 16-byte
// blocks (32 int4 / 16 int8 values of k, bytes as the original rows hold them): the 8
// invocations of one SIMD vector read 8 consecutive blocks per row, a tile's blocks
// are one stream. The scales are [tile][group][RW / 4][lane] vec4s, those of rows
// 4q .. 4q + 3 (stored as the program's: S16 fp16, else fp32). Columns past N compute column N - 1 (packed so) and store nothing.
// Unpacking: a 4 (W4) or 8-bit (W8) field at bit p of a half word, ORed with 2^23's
// bits and masked in place, is the float 2^23 + v 2^p exactly; minus 2^23 + bias 2^p
// it is (v - bias) 2^p. x's values are multiplied by 2^-p once (exact; XSCALE), so
// each weight costs one AND, one subtraction and one FMA per row of x, and
// x 2^-p * (v - bias) 2^p is x * (v - bias) to the bit.
// x: [M, K], M_TILE rows per invocation (grid y; rows past M compute the last one and
// store nothing); X16: fp16 x read 8 values a texel (rgba32ui, unpackHalf2x16), else
// fp32 4 a texel (rgba32f).
// RMS_NORM (vkdelegate.rms_norm_linear_q4gsw, rms_norm_weight_int8pack_mm and their
// SWIGLU forms): the product's rows are et_vk.rms_norm(x, n_data, eps = qnorm.x), never
// formed: x is multiplied by the norm weight (n_data [K], read as x is) as it is loaded,
// the squares of the raw x values summed on the way (each invocation reads the whole
// row), and each sum scaled by 1 / sqrt(sum / K + eps) before the epilogue, as
// linear_qw_gemv.glsl's RMS_NORM: fp32 throughout, the normalized row never rounded to
// x's dtype.
// Epilogue as linear_qw_gemv.glsl's: the bias, HAS_RESIDUAL's r[m, n] (out's shape),
// one rounding at the store; SWIGLU (kernels/swiglu.py): output n from its gate and up
// sums, each finished and rounded as the plain op's store rounds it (SWIGLU_ROUND),
// then CHAIN_BODY over r0 = gate and r1 = up. A column's sum is the same sequence of
// operations whichever form, tile or lane it lands in, so the SWIGLU and HAS_RESIDUAL
// forms give the plain form's bits.

#if defined(RMS_NORM) && defined(HAS_RESIDUAL)
#error "RMS_NORM takes no HAS_RESIDUAL"
#endif
#ifdef SWIGLU
#ifdef HAS_RESIDUAL
#error "SWIGLU takes no HAS_RESIDUAL"
#endif
#define RW (2 * R)
#else
#define RW R
#endif

TENSOR_OUT(out_data, OUT_T)
#ifdef X16
TEXEL_IN_UINT(x_data)  // [M, K] fp16: 8 values of a row per texel
#else
TEXEL_IN(x_data)       // [M, K] fp32: 4 values of a row per texel
#endif
TEXEL_IN_UINT(w_data)  // the prepacked weight blocks
TEXEL_IN(s_data)       // the prepacked scales (rgba16f with S16, else rgba32f)
#ifdef HAS_BIAS
TENSOR_IN(c_data, C_T)
#endif
#ifdef HAS_RESIDUAL
TENSOR_IN(r_data, R_T)
#endif
#ifdef RMS_NORM
#ifdef X16
TEXEL_IN_UINT(n_data)  // the norm weight [K], read as x is
#else
TEXEL_IN(n_data)
#endif
#endif
TENSOR_META(out_meta)
// qdims: K, N, -, weight blocks per row (K / KV); qstrides: -, blocks per group
// (GS / KV; W8: K / KV), groups (K / GS; W8: 1), -.
PARAMS(qlinear_block) { ivec4 qdims; ivec4 qstrides; };
#ifdef RMS_NORM
PARAMS(qnorm_block) { vec4 qnorm; };  // RMS_NORM: eps, -, -, -
#endif

#ifdef W4
#define KV 32  // k values per weight block
#define XV 8   // vec4s of x per block
// 2^-p of the fields' bit positions p by the vec4's component: word e of a block holds
// k = 8e .. 8e + 7 (k even in the low nibble of a byte), its half word h the four
// k = 8e + 4h + j at bit 4j; vec4 2e + h of the block's x holds them.
#define XSCALE vec4(1.0, 1.0 / 16.0, 1.0 / 256.0, 1.0 / 4096.0)
#else
#define KV 16
#define XV 4
// Word e holds k = 4e .. 4e + 3 (one byte each), its half word h the two k = 4e + 2h + j
// at bit 8j; vec4 e of the block's x holds them.
#define XSCALE vec4(1.0, 1.0 / 256.0, 1.0, 1.0 / 256.0)
#endif

const float MAGIC = 8388608.0;  // 2^23: uintBitsToFloat(0x4B000000u)

// acc + the block's sum of x * (weight value), x its XV vec4s times XSCALE.
float block_dot(uvec4 w, vec4 xv[XV], float acc) {
#ifdef W4
  [[unroll]] for (int e = 0; e < 4; ++e) {
    [[unroll]] for (int h = 0; h < 2; ++h) {
      const uint hw = (h == 0 ? w[e] & 0xFFFFu : w[e] >> 16) | 0x4B000000u;
      [[unroll]] for (int j = 0; j < 4; ++j) {
        const float q = uintBitsToFloat(hw & (0x4B000000u | (0xFu << (4 * j))))
            - (MAGIC + 8.0 * float(1 << (4 * j)));  // stored + 8
        acc = fma(xv[2 * e + h][j], q, acc);
      }
    }
  }
#else
  [[unroll]] for (int e = 0; e < 4; ++e) {
    const uint word = w[e] ^ 0x80808080u;  // each signed byte + 128
    [[unroll]] for (int h = 0; h < 2; ++h) {
      const uint hw = (h == 0 ? word & 0xFFFFu : word >> 16) | 0x4B000000u;
      [[unroll]] for (int j = 0; j < 2; ++j) {
        const float q = uintBitsToFloat(hw & (0x4B000000u | (0xFFu << (8 * j))))
            - (MAGIC + 128.0 * float(1 << (8 * j)));
        acc = fma(xv[e][2 * h + j], q, acc);
      }
    }
  }
#endif
  return acc;
}

// vec4s v and v + 1 (v even) of x's (or the norm weight's) rows, as fp32.
#ifdef X16
#define FETCH_X2(data, v, a, b) fetch_half8(data, v, a, b)
void fetch_half8(usamplerBuffer data, int v, out vec4 a, out vec4 b) {
  const uvec4 u = texelFetch(data, v >> 1);
  a = vec4(unpackHalf2x16(u.x), unpackHalf2x16(u.y));
  b = vec4(unpackHalf2x16(u.z), unpackHalf2x16(u.w));
}
#else
#define FETCH_X2(data, v, a, b) \
  a = texelFetch(data, v);      \
  b = texelFetch(data, (v) + 1)
#endif

// The XV vec4s of x's row (its first vec4 xr) for the block from vec4 xb, times XSCALE
// and (RMS_NORM) the norm weight's nv, the squares of the raw values added to ss.
void load_x(int xr, int xb, vec4 nv[XV], out vec4 xv[XV], inout float ss) {
  [[unroll]] for (int t = 0; t < XV; t += 2) {
    FETCH_X2(x_data, xr + xb + t, xv[t], xv[t + 1]);
  }
  [[unroll]] for (int t = 0; t < XV; ++t) {
#ifdef RMS_NORM
    const vec4 v = xv[t];
    ss = fma(v.w, v.w, fma(v.z, v.z, fma(v.y, v.y, fma(v.x, v.x, ss))));
    xv[t] = v * nv[t] * XSCALE;
#else
    xv[t] *= XSCALE;
#endif
  }
}

#include "qlinear_out.h"

void main() {
  const int K = qdims.x;
  const int N = qdims.y;
  const int blocks = qdims.w;
  const int M = N > 0 ? numel_of(out_meta) / N : 0;
  const int gid = int(gl_GlobalInvocationID.x);
  const int lane = gid & 7;
  const int tile = gid >> 3;
  const int n0 = tile * (8 * R) + lane;  // the column of r = 0
  const int m0 = int(gl_GlobalInvocationID.y) * M_TILE;
  if (tile * (8 * R) >= N || m0 >= M) {
    return;
  }
  const int group_blocks = qstrides.y;
  const int groups = qstrides.z;
  int xrow[M_TILE];  // the first vec4 of each row of x
  float acc[M_TILE][RW];
  float ss[M_TILE];  // RMS_NORM: the sums of squares of the rows of x
  [[unroll]] for (int i = 0; i < M_TILE; ++i) {
    xrow[i] = min(m0 + i, M - 1) * (K / 4);
    ss[i] = 0.0;
    [[unroll]] for (int r = 0; r < RW; ++r) {
      acc[i][r] = 0.0;
    }
  }
  int wi = tile * blocks * (RW * 8) + lane;   // the next block's texel of row 0
  int si = tile * groups * (RW / 4 * 8) + lane;  // the next group's scales, rows 0 .. 3
  int xb = 0;                                 // the next block's first vec4 of x
  for (int g = 0; g < groups; ++g) {
    float gacc[M_TILE][RW];
    [[unroll]] for (int i = 0; i < M_TILE; ++i) {
      [[unroll]] for (int r = 0; r < RW; ++r) {
        gacc[i][r] = 0.0;
      }
    }
    for (int bb = 0; bb < group_blocks; ++bb) {
      vec4 nv[XV];
#ifdef RMS_NORM
      [[unroll]] for (int t = 0; t < XV; t += 2) {
        FETCH_X2(n_data, xb + t, nv[t], nv[t + 1]);
      }
#else
      [[unroll]] for (int t = 0; t < XV; ++t) {
        nv[t] = vec4(1.0);
      }
#endif
      vec4 xv[M_TILE][XV];
      [[unroll]] for (int i = 0; i < M_TILE; ++i) {
        load_x(xrow[i], xb, nv, xv[i], ss[i]);
      }
      uvec4 w[RW];
      [[unroll]] for (int r = 0; r < RW; ++r) {
        w[r] = texelFetch(w_data, wi + 8 * r);
      }
      [[unroll]] for (int i = 0; i < M_TILE; ++i) {
        [[unroll]] for (int r = 0; r < RW; ++r) {
          gacc[i][r] = block_dot(w[r], xv[i], gacc[i][r]);
        }
      }
      wi += RW * 8;
      xb += XV;
    }
    [[unroll]] for (int q = 0; q < RW / 4; ++q) {
      const vec4 s = texelFetch(s_data, si + 8 * q);
      [[unroll]] for (int i = 0; i < M_TILE; ++i) {
        [[unroll]] for (int c = 0; c < 4; ++c) {
          acc[i][4 * q + c] = fma(gacc[i][4 * q + c], s[c], acc[i][4 * q + c]);
        }
      }
    }
    si += RW / 4 * 8;
  }
#ifdef RMS_NORM
  [[unroll]] for (int i = 0; i < M_TILE; ++i) {
    const float rstd = 1.0 / sqrt(ss[i] / float(K) + qnorm.x);
    [[unroll]] for (int r = 0; r < RW; ++r) {
      acc[i][r] *= rstd;
    }
  }
#endif
  [[unroll]] for (int i = 0; i < M_TILE; ++i) {
    const int m = m0 + i;
    [[unroll]] for (int r = 0; r < R; ++r) {
      const int n = n0 + 8 * r;
      if (m < M && n < N) {
#ifdef SWIGLU
        out_data[m * N + n] = OUT_STORE(swiglu_out(acc[i][r], acc[i][R + r], m, n));
#else
        out_data[m * N + n] = OUT_STORE(finish(acc[i][r], m, n));
#endif
      }
    }
  }
}
