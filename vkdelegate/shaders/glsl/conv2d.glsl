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
// CLAMP: clamp the result to [conv.clamp.x, conv.clamp.y] (fused ReLU/ReLU6/clamp).
// Sizes come from the metadata (innermost first), so resized inputs need no rebuild.

#define PX 4

TENSOR_OUT(0, out_data, OUT_T)
TENSOR_IN(1, in_data, IN_T)
TENSOR_IN(2, w_data, W_T)
TENSOR_IN(3, b_data, B_T)
#define PARAM0 4
TENSOR_META(PARAM0, out_meta)
TENSOR_META(PARAM0 + 1, in_meta)
// Mirrors vkdelegate.backend.ops.convolution._conv_params.
layout(set = 0, binding = PARAM0 + 2) uniform conv_block {
  ivec4 kernel;      // KH, KW, IC per group, OC per group
  ivec4 stride_pad;  // stride h, stride w, padding h, padding w
  ivec4 dilation;    // dilation h, dilation w, spatial dims (1 or 2)
  vec4 clamp;        // output min, output max (CLAMP only)
} conv;

#if OC_TILE == 4
#define ACC_VEC vec4
#else
#define ACC_VEC float
#endif

// The OC_TILE weights of output channels oc..oc+OC_TILE-1 at (icg, kh, kw).
ACC_VEC load_w(int oc, int icg, int kh, int kw, int ICg, int OCg, int KH, int KW) {
#ifdef W_PACKED
  const int i = (((oc / OC_TILE) * ICg + icg) * KH + kh) * KW + kw;
#if OC_TILE == 4
  return vec4(float(w_data[4 * i]), float(w_data[4 * i + 1]), float(w_data[4 * i + 2]),
              float(w_data[4 * i + 3]));
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
  const int SPATIAL = conv.dilation.z;
  const int OW = size_at(out_meta, 0);
  const int OH = SPATIAL == 2 ? size_at(out_meta, 1) : 1;
  const int OC = size_at(out_meta, SPATIAL);
  const int N = size_at(out_meta, SPATIAL + 1);
  const int IW = size_at(in_meta, 0);
  const int IH = SPATIAL == 2 ? size_at(in_meta, 1) : 1;
  const int IC = size_at(in_meta, SPATIAL);
  const int KH = conv.kernel.x, KW = conv.kernel.y;
  const int ICg = conv.kernel.z, OCg = conv.kernel.w;
  const int OCB = (OC + OC_TILE - 1) / OC_TILE;

#ifdef POINTWISE
  const int P = OH * OW;  // flattened pixels: input and output share them
  const int tiles = (P + PX - 1) / PX;
  const uint i = linear_id();
  if (i >= uint(N * OCB * tiles)) {
    return;
  }
  const int tile = int(i) % tiles;
  const int ocb = (int(i) / tiles) % OCB;
  const int n = int(i) / (tiles * OCB);
  const int oc = ocb * OC_TILE;
  const int p0 = tile * PX;
  ACC_VEC acc[PX];
  for (int p = 0; p < PX; ++p) {
    acc[p] = ACC_VEC(0);
  }
  // The tail tile re-reads the last valid pixel instead of reading out of bounds.
  int pix[PX];
  for (int p = 0; p < PX; ++p) {
    pix[p] = min(p0 + p, P - 1);
  }
  int in_off = n * IC * P;
  for (int ic = 0; ic < IC; ++ic, in_off += P) {
    const ACC_VEC w = load_w(oc, ic, 0, 0, IC, OC, 1, 1);
    for (int p = 0; p < PX; ++p) {
      acc[p] += w * float(in_data[in_off + pix[p]]);
    }
  }
  const int out_base = (n * OC + oc) * P + p0;
  const int valid = min(PX, P - p0);
#else
  const int tiles = (OW + PX - 1) / PX;
  const uint i = linear_id();
  if (i >= uint(N * OCB * OH * tiles)) {
    return;
  }
  const int tile = int(i) % tiles;
  const int oh = (int(i) / tiles) % OH;
  const int ocb = (int(i) / (tiles * OH)) % OCB;
  const int n = int(i) / (tiles * OH * OCB);
  const int oc = ocb * OC_TILE;
  const int ow0 = tile * PX;
  const int g = oc / OCg;
  const int sH = conv.stride_pad.x, sW = conv.stride_pad.y;
  const int pH = conv.stride_pad.z, pW = conv.stride_pad.w;
  const int dH = conv.dilation.x, dW = conv.dilation.y;
  ACC_VEC acc[PX];
  for (int p = 0; p < PX; ++p) {
    acc[p] = ACC_VEC(0);
  }
  for (int icg = 0; icg < ICg; ++icg) {
    const int plane = (n * IC + g * ICg + icg) * IH * IW;
    for (int kh = 0; kh < KH; ++kh) {
#ifdef TRANSPOSED
      const int hn = oh + pH - kh * dH;
      if (hn < 0 || hn % sH != 0 || hn / sH >= IH) {
        continue;
      }
      const int row = plane + (hn / sH) * IW;
#else
      const int ih = oh * sH - pH + kh * dH;
      if (ih < 0 || ih >= IH) {
        continue;
      }
      const int row = plane + ih * IW;
#endif
      for (int kw = 0; kw < KW; ++kw) {
        const ACC_VEC w = load_w(oc, icg, kh, kw, ICg, OCg, KH, KW);
        for (int p = 0; p < PX; ++p) {
#ifdef TRANSPOSED
          const int wn = ow0 + p + pW - kw * dW;
          const bool ok = wn >= 0 && wn % sW == 0 && wn / sW < IW;
          const int iw = wn / sW;
#else
          const int iw = (ow0 + p) * sW - pW + kw * dW;
          const bool ok = iw >= 0 && iw < IW;
#endif
          const float x = ok ? float(in_data[row + iw]) : 0.0;
          acc[p] += w * x;
        }
      }
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
    out_data[out_base + p] = OUT_STORE(v);
  }
#endif
}
