#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"

// 2-D (and 1-D) convolution, not transposed, constant weight, over NCHW / NCL tensors,
// in output columns: each invocation computes ROWS outputs down one output column
// (rows oh0 .. oh0 + ROWS - 1 at column ow) for OC_TILE (1 or 4) output channels of
// one group. Per input channel of the group it holds the KH x KW filter taps of its
// channels in registers, walks the (ROWS - 1) * SH + (KH - 1) * DH + 1 input rows its
// windows cover once, loads the KW input values of each row, and adds them into every
// output whose window holds that row. Adjacent invocations take adjacent output
// columns, so the loads of one tap are consecutive addresses across invocations
// (coalesced on GPUs, vector loads on llvmpipe) instead of one row segment per
// invocation (conv2d.glsl's direct path). Depthwise layers are the groups == channels
// case (OC_TILE 1, one input channel per group).
//
// Defines: OUT_T, OUT_STORE(v), IN_T, B_T (fp32 bias, zeros when there is none),
// OC_TILE, ROWS (outputs per invocation); weights prepacked fp32
// [OC / OC_TILE, IC / groups, KH, KW, OC_TILE] (conv2d.glsl's W_PACKED layout);
// CLAMP (clamp to [conv.clamp.x, conv.clamp.y], ATen keeps NaN); RESIDUAL (R_T): add
// r_data, a tensor of out's shape, after the clamp. Window geometry: specialization
// constants 3..11 (conv2d.glsl's). COL_TEXEL (CPU drivers): the weights and the input
// are uniform texel buffers (r32f / rgba32f weights, r32f or r16f input; TEXEL_IN):
// one vectorised gather per load on llvmpipe instead of a loop over the SIMD lanes.
// An input load outside the plane still reads 0 (its index is clamped into the
// buffer, its value not used). The tap loops are unrolled; only the input-channel
// loop counts against llvmpipe's loop budget. Sizes from the metadata: resizable in
// batch and spatial sizes.

#include "conv_window.h"

TENSOR_OUT(out_data, OUT_T)
#ifdef COL_TEXEL
TEXEL_IN(in_data)
TEXEL_IN(w_data)
#define LOAD_IN(i) texelFetch(in_data, i).x
#if OC_TILE == 4
#define ACC_VEC vec4
#define LOAD_W(i) texelFetch(w_data, i)
#else
#define ACC_VEC float
#define LOAD_W(i) texelFetch(w_data, i).x
#endif
#else
TENSOR_IN(in_data, IN_T)
#define LOAD_IN(i) float(in_data[i])
#if OC_TILE == 4
TENSOR_IN(w_data, vec4)
#define ACC_VEC vec4
#else
TENSOR_IN(w_data, float)
#define ACC_VEC float
#endif
#define LOAD_W(i) w_data[i]
#endif
TENSOR_IN(b_data, B_T)
#ifdef RESIDUAL
TENSOR_IN(r_data, R_T)
#endif
TENSOR_META(out_meta)
TENSOR_META(in_meta)
PARAMS(conv_block) {
  ivec4 channels;  // IC per group, OC per group
  vec4 clamp;      // output min, output max (CLAMP only)
} conv;

void main() {
  const int OW = size_at(out_meta, 0);
  const int OH = SPATIAL == 2 ? size_at(out_meta, 1) : 1;
  const int C = size_at(out_meta, SPATIAL);
  const int N = size_at(out_meta, SPATIAL + 1);
  const int IW = size_at(in_meta, 0);
  const int IH = SPATIAL == 2 ? size_at(in_meta, 1) : 1;

  const int ICg = conv.channels.x, OCg = conv.channels.y;
  const int OCB = C / OC_TILE;
  const int IC = size_at(in_meta, SPATIAL);

  // Grid: (output column, row block, batch x channel block).
  const int ow = int(gl_GlobalInvocationID.x);
  const int oh0 = int(gl_GlobalInvocationID.y) * ROWS;
  const int z = int(gl_GlobalInvocationID.z);
  if (ow >= OW || oh0 >= OH || z >= N * OCB) {
    return;
  }
  const int n = z / OCB;
  const int ocb = z - n * OCB;
  const int oc = ocb * OC_TILE;
  const int g = oc / OCg;
  ACC_VEC acc[ROWS];
  [[unroll]] for (int r = 0; r < ROWS; ++r) {
    acc[r] = ACC_VEC(0.0);
  }
  const int ih0 = oh0 * SH - PH;
  const int iw0 = ow * SW - PW;
  const int IN_ROWS = (ROWS - 1) * SH + (KH - 1) * DH + 1;
  for (int icg = 0; icg < ICg; ++icg) {
    const int plane = (n * IC + g * ICg + icg) * IH * IW;
    ACC_VEC w[KH * KW];
    const int w0 = (ocb * ICg + icg) * KH * KW;
    [[unroll]] for (int i = 0; i < KH * KW; ++i) {
      w[i] = LOAD_W(w0 + i);
    }
    [[unroll]] for (int j = 0; j < IN_ROWS; ++j) {
      const int ih = ih0 + j;
      if (ih < 0 || ih >= IH) {
        continue;
      }
      float x[KW];
      [[unroll]] for (int kw = 0; kw < KW; ++kw) {
        const int iw = iw0 + kw * DW;
#ifdef COL_TEXEL
        const bool inside = iw >= 0 && iw < IW;
        const float v = LOAD_IN(plane + ih * IW + (inside ? iw : 0));
        x[kw] = inside ? v : 0.0;
#else
        x[kw] = (iw >= 0 && iw < IW) ? LOAD_IN(plane + ih * IW + iw) : 0.0;
#endif
      }
      // Output r's window holds input row j at tap kh = (j - r * SH) / DH.
      [[unroll]] for (int r = 0; r < ROWS; ++r) {
        const int t = j - r * SH;
        if (t >= 0 && t % DH == 0 && t / DH < KH) {
          const int kh = t / DH;
          [[unroll]] for (int kw = 0; kw < KW; ++kw) {
            acc[r] += w[kh * KW + kw] * x[kw];
          }
        }
      }
    }
  }
  const int P = OH * OW;  // channel stride of the output
  const int base = ((n * C + oc) * OH + oh0) * OW + ow;
  [[unroll]] for (int t = 0; t < OC_TILE; ++t) {
    const float bias = float(b_data[oc + t]);
    [[unroll]] for (int r = 0; r < ROWS; ++r) {
      if (oh0 + r < OH) {
#if OC_TILE == 4
        float v = acc[r][t] + bias;
#else
        float v = acc[r] + bias;
#endif
#ifdef CLAMP
        v = isnan(v) ? v : min(max(v, conv.clamp.x), conv.clamp.y);
#endif
#ifdef RESIDUAL
        v += float(r_data[base + t * P + r * OW]);
#endif
        out_data[base + t * P + r * OW] = OUT_STORE(v);
      }
    }
  }
}
