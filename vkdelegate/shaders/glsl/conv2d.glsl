#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"

// 1-D and 2-D convolution (direct and transposed) over NCHW / NCL tensors.
// Each invocation computes an OC_TILE x PX tile: OC_TILE (1 or 4) output channels of
// one group at PX consecutive output positions, so every input value loaded is used
// OC_TILE times and every weight PX times. Accumulation is fp32.
//
// Defines: OUT_T, OUT_STORE(v), IN_T, W_T, B_T (the bias; zeros prepacked when there is none);
// OC_TILE (1 or 4; 4 only when the output channels per group are a multiple of 4);
// W_PACKED: weights prepacked at load as fp32 [OC / OC_TILE, IC/groups, KH, KW, OC_TILE]
//   (the OC_TILE weights of one tap are contiguous); otherwise the weight is read as
//   stored: [OC, IC/groups, KH, KW], or [IC, OC/groups, KH, KW] when TRANSPOSED;
// TRANSPOSED: transposed convolution, computed as a gather over input positions;
// POINTWISE: 1x1 kernel, stride 1, no padding, groups 1: a GEMM over flattened pixels;
//   PW_SHIFTED (input channels a multiple of 4): planes that are not a multiple of 4
//   read as vec4s too (see there); PW_TEXEL (CPU drivers, with W_PACKED): the packed
//   weights w_data and the input's vec4s in4_data are uniform texel buffers
//   (TEXEL_IN: one vectorised gather per load on llvmpipe instead of a loop over the
//   SIMD lanes), same values in the same order as the storage-buffer form;
// CLAMP: clamp the result to [conv.clamp.x, conv.clamp.y] (fused ReLU/ReLU6/clamp);
// RESIDUAL (R_T): then add r_data, a tensor of the output's shape (a fused aten.add).
// Sizes come from the metadata (innermost first), so resized inputs need no rebuild.
// The window geometry (kernel, stride, padding, dilation) is specialization constants
// 3..10: the compiler unrolls the tap loops and folds the index arithmetic, and the
// direct path loads each input row segment once for all taps of the row.

// Output positions per invocation: 4 with 4 channels in the direct path (16
// accumulators besides the row segment), 8 otherwise (pointwise: 8 x 4 accumulators).
#if OC_TILE == 4 && !defined(POINTWISE)
#define PX 4
#else
#define PX 8
#endif

#include "conv_window.h"

// LONG_LOOPS, chosen at load when the plain loops could run past llvmpipe's loop
// budget (LOOP_LIMIT iterations per invocation in all, common.h): every tap loop
// [[unroll]]ed and 4 pointwise channels per iteration, so only the channel loop
// counts. Only then: the unrolled form costs 5x5 depthwise convs ~40% and pointwise
// convs ~25% of their time on llvmpipe.
#ifdef LONG_LOOPS
#define TAP_FOR [[unroll]] for
#else
#define TAP_FOR for
#endif

TENSOR_OUT(out_data, OUT_T)
TENSOR_IN(in_data, IN_T)
#ifdef PW_TEXEL
#if !defined(POINTWISE) || !defined(W_PACKED)
#error "PW_TEXEL needs POINTWISE and W_PACKED"
#endif
TEXEL_IN(w_data)  // rgba32f (OC_TILE 4) or r32f: the prepacked fp32 weights
#elif defined(W_PACKED) && OC_TILE == 4
TENSOR_IN(w_data, vec4)  // prepacked fp32: the 4 channels' weights of a tap at once
#else
TENSOR_IN(w_data, W_T)
#endif
TENSOR_IN(b_data, B_T)
#ifdef RESIDUAL
TENSOR_IN(r_data, R_T)
#endif
#ifdef POINTWISE
// The input again, 4 elements per load (used when a channel plane is a multiple of 4).
#ifdef PW_TEXEL
TEXEL_IN(in4_data)  // rgba32f, or rgba16f for an fp16 input
#define LOAD_IN4(i) texelFetch(in4_data, i)
#else
TENSOR_IN(in4_data, IN4_T)
#define LOAD_IN4(i) vec4(in4_data[i])
#endif
#endif
TENSOR_META(out_meta)
TENSOR_META(in_meta)
PARAMS(conv_block) {
  ivec4 channels;  // IC per group, OC per group
  vec4 clamp;      // output min, output max (CLAMP only)
} conv;

#if OC_TILE == 4
#define ACC_VEC vec4
#else
#define ACC_VEC float
#endif

// The OC_TILE weights of output channels oc..oc+OC_TILE-1 at (icg, kh, kw).
ACC_VEC load_w(int oc, int icg, int kh, int kw, int ICg, int OCg) {
#ifdef W_PACKED
  const int i = (((oc / OC_TILE) * ICg + icg) * KH + kh) * KW + kw;
#if defined(PW_TEXEL) && OC_TILE == 4
  return texelFetch(w_data, i);
#elif defined(PW_TEXEL)
  return texelFetch(w_data, i).x;
#elif OC_TILE == 4
  return w_data[i];
#else
  return float(w_data[i]);
#endif
#else
#ifdef TRANSPOSED
  // [IC, OC/groups, KH, KW]: input channel g * ICg + icg, output channel oc % OCg.
  const int g = oc / OCg;
  const int base = (((g * ICg + icg) * OCg + (oc - g * OCg)) * KH + kh) * KW + kw;
  const int step = KH * KW;
#else
  const int base = ((oc * ICg + icg) * KH + kh) * KW + kw;
  const int step = ICg * KH * KW;
#endif
#if OC_TILE == 4
  return vec4(float(w_data[base]), float(w_data[base + step]),
              float(w_data[base + 2 * step]), float(w_data[base + 3 * step]));
#else
  return float(w_data[base]);
#endif
#endif
}

void main() {
  const int OW = size_at(out_meta, 0);
  const int OH = SPATIAL == 2 ? size_at(out_meta, 1) : 1;
  const int OC = size_at(out_meta, SPATIAL);
  const int N = size_at(out_meta, SPATIAL + 1);
  const int IW = size_at(in_meta, 0);
  const int IH = SPATIAL == 2 ? size_at(in_meta, 1) : 1;
  const int IC = size_at(in_meta, SPATIAL);
  const int ICg = conv.channels.x, OCg = conv.channels.y;
  const int OCB = (OC + OC_TILE - 1) / OC_TILE;

#ifdef POINTWISE
  const int P = OH * OW;  // flattened pixels: input and output share them
  const int tiles = (P + PX - 1) / PX;
  // Grid: (pixel tile, channel block, batch); no per-invocation division (llvmpipe
  // runs integer division lane by lane).
  const int tile = int(gl_GlobalInvocationID.x);
  const int ocb = int(gl_GlobalInvocationID.y);
  const int n = int(gl_GlobalInvocationID.z);
  if (tile >= tiles || ocb >= OCB || n >= N) {
    return;
  }
  const int oc = ocb * OC_TILE;
  const int p0 = tile * PX;
  ACC_VEC acc[PX];
  TAP_FOR (int p = 0; p < PX; ++p) {
    acc[p] = ACC_VEC(0);
  }
  // The tail tile re-reads the last valid pixel instead of reading out of bounds.
  int pix[PX];
  TAP_FOR (int p = 0; p < PX; ++p) {
    pix[p] = min(p0 + p, P - 1);
  }
  int in_off = n * IC * P;
  // LONG_LOOPS: 4 channels per loop iteration, then the remainder (see TAP_FOR).
  const int IC4 = IC & ~3;
  if ((P & 3) == 0) {
    // Aligned planes: two vec4 loads per channel; the second of a tail tile is clamped
    // to the plane's last vec4 (its values are not stored).
    const int q0 = p0 >> 2;
    const int q1 = min(q0 + 1, (P >> 2) - 1);
    int q_off = in_off >> 2;
#define PW_ALIGNED(ic) { \
      const ACC_VEC w = load_w(oc, ic, 0, 0, IC, OC); \
      const vec4 lo = LOAD_IN4(q_off + q0); \
      const vec4 hi = LOAD_IN4(q_off + q1); \
      q_off += P >> 2; \
      acc[0] += w * lo.x; \
      acc[1] += w * lo.y; \
      acc[2] += w * lo.z; \
      acc[3] += w * lo.w; \
      acc[4] += w * hi.x; \
      acc[5] += w * hi.y; \
      acc[6] += w * hi.z; \
      acc[7] += w * hi.w; \
    }
#ifdef LONG_LOOPS
    for (int ic0 = 0; ic0 < IC4; ic0 += 4) {
      [[unroll]] for (int u = 0; u < 4; ++u) {
        PW_ALIGNED(ic0 + u)
      }
    }
    for (int ic = IC4; ic < IC; ++ic) {
#else
    for (int ic = 0; ic < IC; ++ic) {
#endif
      PW_ALIGNED(ic)
    }
  } else {
#ifdef PW_SHIFTED
    // Planes not a multiple of 4 (7 x 7, ...), input channels a multiple of 4 (so the
    // input's size is, checked at load): the tile's 8 pixels are elements g .. g + 7,
    // held by the 3 vec4s from g / 4 on, picked by g % 4: 4 loads per channel
    // instead of 9 (llvmpipe runs each load as a loop over the SIMD lanes). Past the
    // input's end the vec4 index is clamped: those pixels (a tail tile's, the next
    // plane's elsewhere) are never stored.
    const int last4 = ((N * IC * P) >> 2) - 1;
#define PW_SHIFTED_CHANNEL(ic) { \
      const ACC_VEC w = load_w(oc, ic, 0, 0, IC, OC); \
      const int g = in_off + p0; \
      const int q = g >> 2, s = g & 3; \
      const vec4 v0 = LOAD_IN4(min(q, last4)); \
      const vec4 v1 = LOAD_IN4(min(q + 1, last4)); \
      const vec4 v2 = LOAD_IN4(min(q + 2, last4)); \
      const float e[12] = float[12](v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w, \
                                    v2.x, v2.y, v2.z, v2.w); \
      [[unroll]] for (int p = 0; p < PX; ++p) { \
        const float x = s == 0 ? e[p] : (s == 1 ? e[p + 1] : (s == 2 ? e[p + 2] : e[p + 3])); \
        acc[p] += w * x; \
      } \
      in_off += P; \
    }
#ifdef LONG_LOOPS
    for (int ic0 = 0; ic0 < IC4; ic0 += 4) {
      [[unroll]] for (int u = 0; u < 4; ++u) {
        PW_SHIFTED_CHANNEL(ic0 + u)
      }
    }
#else
    for (int ic = 0; ic < IC; ++ic) {
      PW_SHIFTED_CHANNEL(ic)
    }
#endif
#else
#define PW_ROWS(ic) { \
      const ACC_VEC w = load_w(oc, ic, 0, 0, IC, OC); \
      TAP_FOR (int p = 0; p < PX; ++p) { \
        acc[p] += w * float(in_data[in_off + pix[p]]); \
      } \
      in_off += P; \
    }
#ifdef LONG_LOOPS
    for (int ic0 = 0; ic0 < IC4; ic0 += 4) {
      [[unroll]] for (int u = 0; u < 4; ++u) {
        PW_ROWS(ic0 + u)
      }
    }
    for (int ic = IC4; ic < IC; ++ic) {
#else
    for (int ic = 0; ic < IC; ++ic) {
#endif
      PW_ROWS(ic)
    }
#endif
  }
  const int out_base = (n * OC + oc) * P + p0;
  const int valid = min(PX, P - p0);
#else
  const int tiles = (OW + PX - 1) / PX;
  // Grid: (column tile, output row, batch x channel block).
  const int tile = int(gl_GlobalInvocationID.x);
  const int oh = int(gl_GlobalInvocationID.y);
  const int ocb = int(gl_GlobalInvocationID.z) % OCB;
  const int n = int(gl_GlobalInvocationID.z) / OCB;
  if (tile >= tiles || oh >= OH || n >= N) {
    return;
  }
  const int oc = ocb * OC_TILE;
  const int ow0 = tile * PX;
  const int g = oc / OCg;
  ACC_VEC acc[PX];
  TAP_FOR (int p = 0; p < PX; ++p) {
    acc[p] = ACC_VEC(0);
  }
#ifndef TRANSPOSED
  // Input columns that the PX outputs' windows touch: one row segment per (icg, kh).
  const int SEG = (PX - 1) * SW + (KW - 1) * DW + 1;
  const int iw0 = ow0 * SW - PW;
  float seg[SEG];
#endif
  // LONG_LOOPS unrolls the tap loops (their trip counts are specialization constants)
  // so that only the ICg loop counts against llvmpipe's loop budget (see TAP_FOR).
  for (int icg = 0; icg < ICg; ++icg) {
    const int plane = (n * IC + g * ICg + icg) * IH * IW;
    TAP_FOR (int kh = 0; kh < KH; ++kh) {
#ifdef TRANSPOSED
      const int hn = oh + PH - kh * DH;
      if (hn < 0 || hn % SH != 0 || hn / SH >= IH) {
        continue;
      }
      const int row = plane + (hn / SH) * IW;
      TAP_FOR (int kw = 0; kw < KW; ++kw) {
        const ACC_VEC w = load_w(oc, icg, kh, kw, ICg, OCg);
        TAP_FOR (int p = 0; p < PX; ++p) {
          const int wn = ow0 + p + PW - kw * DW;
          const bool ok = wn >= 0 && wn % SW == 0 && wn / SW < IW;
          const float x = ok ? float(in_data[row + wn / SW]) : 0.0;
          acc[p] += w * x;
        }
      }
#else
      const int ih = oh * SH - PH + kh * DH;
      if (ih < 0 || ih >= IH) {
        continue;
      }
      const int row = plane + ih * IW;
      TAP_FOR (int j = 0; j < SEG; ++j) {
        const int iw = iw0 + j;
        seg[j] = (iw >= 0 && iw < IW) ? float(in_data[row + iw]) : 0.0;
      }
      TAP_FOR (int kw = 0; kw < KW; ++kw) {
        const ACC_VEC w = load_w(oc, icg, kh, kw, ICg, OCg);
        TAP_FOR (int p = 0; p < PX; ++p) {
          acc[p] += w * seg[p * SW + kw * DW];
        }
      }
#endif
    }
  }
  const int out_base = ((n * OC + oc) * OH + oh) * OW + ow0;
  const int P = OH * OW;  // channel stride of the output
  const int valid = min(PX, OW - ow0);
#endif

#if OC_TILE == 4
  for (int t = 0; t < 4; ++t) {
    const float bias = float(b_data[oc + t]);
    for (int p = 0; p < valid; ++p) {
      float v = acc[p][t] + bias;
#ifdef CLAMP
      v = isnan(v) ? v : min(max(v, conv.clamp.x), conv.clamp.y);  // ATen keeps NaN
#endif
#ifdef RESIDUAL
      v += float(r_data[out_base + t * P + p]);
#endif
      out_data[out_base + t * P + p] = OUT_STORE(v);
    }
  }
#else
  const float bias = float(b_data[oc]);
  for (int p = 0; p < valid; ++p) {
    float v = acc[p] + bias;
#ifdef CLAMP
    v = isnan(v) ? v : min(max(v, conv.clamp.x), conv.clamp.y);  // ATen keeps NaN
#endif
#ifdef RESIDUAL
    v += float(r_data[out_base + p]);
#endif
    out_data[out_base + p] = OUT_STORE(v);
  }
#endif
}
