#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"

// 2-D pooling over the last two dims of a (C, H, W) or (N, C, H, W) tensor, one output
// element per invocation, following ATen's CPU kernels window for window.
// Defines: OUT_T, OUT_STORE(v), IN_T; one of
//   MAX_POOL: max over the window (dilated), NaN wins (ATen: val > max || isnan(val));
//     IDX_T: indices output (flat h * W + w within the plane, as ATen picks it);
//   AVG_POOL: mean with padding, ceil_mode, count_include_pad, divisor_override;
// ADAPTIVE: windows [floor(o * I / O), ceil((o + 1) * I / O)) instead of kernel/stride;
// LONG_WINDOW: 16 window columns per loop iteration (windows of many elements);
// PLANE_LOOP: see plane_grid.h;
// STATIC_WINDOW (max and avg pools of small windows): the window geometry is
//   specialization constants (conv_window.h, as the convolutions pass them) and every
//   tap is unrolled, the in-bounds ones taken in the same order as the loops below:
//   the same results, without the loops of run-time trip count and the divisions that
//   cost llvmpipe most of a 2 x 2 max pool's time.
// Sizes come from the metadata, so resized inputs need no rebuild.

#ifdef STATIC_WINDOW
#include "conv_window.h"
#endif

TENSOR_OUT(out_data, OUT_T)
#ifdef MAX_POOL
TENSOR_OUT(idx_data, IDX_T)
#endif
TENSOR_IN(in_data, IN_T)
TENSOR_META(out_meta)
TENSOR_META(in_meta)
PARAMS(pool_block) {
  ivec4 kernel_stride;  // kernel h, kernel w, stride h, stride w
  ivec4 pad_dilation;   // padding h, padding w, dilation h, dilation w
  ivec4 avg;            // count_include_pad, divisor_override (0: none)
} pool;

// One output element (plane_grid.h calls it).
void output_at(int ow, int oh, int plane, int OW, int OH, int IW, int IH) {
  const int i = (plane * OH + oh) * OW + ow;
  const int in_base = plane * IH * IW;
#ifdef STATIC_WINDOW
  const int h0 = oh * SH - PH;
  const int w0 = ow * SW - PW;
  const int h1 = h0 + (KH - 1) * DH + 1;
  const int w1 = w0 + (KW - 1) * DW + 1;
#elif defined(ADAPTIVE)
  const int h0 = (oh * IH) / OH, h1 = ((oh + 1) * IH + OH - 1) / OH;
  const int w0 = (ow * IW) / OW, w1 = ((ow + 1) * IW + OW - 1) / OW;
  const int dH = 1, dW = 1;
#else
  const int dH = pool.pad_dilation.z, dW = pool.pad_dilation.w;
  const int h0 = oh * pool.kernel_stride.z - pool.pad_dilation.x;
  const int w0 = ow * pool.kernel_stride.w - pool.pad_dilation.y;
  const int h1 = h0 + (pool.kernel_stride.x - 1) * dH + 1;
  const int w1 = w0 + (pool.kernel_stride.y - 1) * dW + 1;
#endif

#ifdef MAX_POOL
  // First in-bounds tap of the (dilated) window.
#ifdef STATIC_WINDOW
  const int hs = h0 < 0 ? h0 + ((DH - 1 - h0) / DH) * DH : h0;
  const int ws = w0 < 0 ? w0 + ((DW - 1 - w0) / DW) * DW : w0;
#else
  int hs = h0, ws = w0;
  while (hs < 0) hs += dH;
  while (ws < 0) ws += dW;
#endif
  float best = uintBitsToFloat(0xff800000u);  // -inf
  int best_idx = hs * IW + ws;
  // ATen's rule, kept literally: a later NaN takes the index again.
#define MAX_TAP(h, w) { \
    const float v = float(in_data[in_base + (h) * IW + (w)]); \
    if (v > best || isnan(v)) { \
      best = v; \
      best_idx = (h) * IW + (w); \
    } \
  }
  const int he = min(h1, IH), we = min(w1, IW);
#ifdef STATIC_WINDOW
  [[unroll]] for (int kh = 0; kh < KH; ++kh) {
    const int h = h0 + kh * DH;
    [[unroll]] for (int kw = 0; kw < KW; ++kw) {
      const int w = w0 + kw * DW;
      if (h >= 0 && h < he && w >= 0 && w < we) {
        MAX_TAP(h, w)
      }
    }
  }
#else
  // Loops count taps with a unit step (tap h = hs + th * dH): Mesa 22.3's lavapipe
  // runs a loop whose step is read from a storage buffer (PARAMS_IN_STORAGE) once.
  const int taps_h = hs < he ? (he - hs + dH - 1) / dH : 0;
  const int taps_w = ws < we ? (we - ws + dW - 1) / dW : 0;
  for (int th = 0; th < taps_h; ++th) {
    const int h = hs + th * dH;
    int tw = 0;
#ifdef LONG_WINDOW
    // 16 taps per loop iteration, then the rest: llvmpipe ends an invocation's loops
    // after LOOP_LIMIT iterations in all (common.h; ops/pool.py picks this variant for
    // windows that need it and checks at load). Only then: it costs small windows 3x.
    for (; tw + 15 < taps_w; tw += 16) {
      [[unroll]] for (int j = 0; j < 16; ++j) {
        MAX_TAP(h, ws + (tw + j) * dW)
      }
    }
#endif
    for (; tw < taps_w; ++tw) {
      MAX_TAP(h, ws + tw * dW)
    }
  }
#endif
  out_data[i] = OUT_STORE(best);
  idx_data[i] = IDX_T(best_idx);
#else
#ifdef ADAPTIVE
  const int hs = h0, he = h1, ws = w0, we = w1;
  const int divisor = (h1 - h0) * (w1 - w0);
#else
  // ATen: the padded window (clipped to input + padding) sets count_include_pad's
  // divisor; the sum runs over the window clipped to the input.
#ifdef STATIC_WINDOW
  const int he_pad = min(h0 + KH, IH + PH);
  const int we_pad = min(w0 + KW, IW + PW);
#else
  const int he_pad = min(h0 + pool.kernel_stride.x, IH + pool.pad_dilation.x);
  const int we_pad = min(w0 + pool.kernel_stride.y, IW + pool.pad_dilation.y);
#endif
  const int pool_size = (he_pad - h0) * (we_pad - w0);
  const int hs = max(h0, 0), ws = max(w0, 0);
  const int he = min(he_pad, IH), we = min(we_pad, IW);
  int divisor = pool.avg.y != 0 ? pool.avg.y
      : (pool.avg.x != 0 ? pool_size : (he - hs) * (we - ws));
#endif
  float sum = 0.0;
#ifdef STATIC_WINDOW
  [[unroll]] for (int kh = 0; kh < KH; ++kh) {
    const int h = h0 + kh;
    [[unroll]] for (int kw = 0; kw < KW; ++kw) {
      const int w = w0 + kw;
      if (h >= hs && h < he && w >= ws && w < we) {
        sum += float(in_data[in_base + h * IW + w]);
      }
    }
  }
#else
  for (int h = hs; h < he; ++h) {
    const int row = in_base + h * IW;
    int w = ws;
#ifdef LONG_WINDOW
    // 16 elements per loop iteration (in order), then the rest: see MAX_POOL above.
    for (; w + 15 < we; w += 16) {
      [[unroll]] for (int j = 0; j < 16; ++j) {
        sum += float(in_data[row + w + j]);
      }
    }
#endif
    for (; w < we; ++w) {
      sum += float(in_data[row + w]);
    }
  }
#endif
  out_data[i] = OUT_STORE(hs < he && ws < we ? sum / float(divisor) : 0.0);
#endif
}

#include "plane_grid.h"
