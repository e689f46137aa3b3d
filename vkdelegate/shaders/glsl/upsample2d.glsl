#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"

// Upsampling (or downsampling) of the last two dims of an (N, C, H, W) tensor, one
// output element per invocation, with ATen's index arithmetic in fp32
// (aten/src/ATen/native/UpSample.h): ``precise`` keeps the compiler from fusing the
// multiply-adds, so source indices round exactly as on the CPU.
// Defines: OUT_T, OUT_STORE(v), IN_T; NEAREST (legacy "nearest") or BILINEAR;
// PLANE_LOOP: see plane_grid.h.
// Sizes come from the metadata; a scale factor given at export (> 0) replaces
// input/output as ATen's compute_scales_value does.

TENSOR_OUT(out_data, OUT_T)
TENSOR_IN(in_data, IN_T)
TENSOR_META(out_meta)
TENSOR_META(in_meta)
PARAMS(upsample_block) {
  vec4 inv_scales;  // 1 / scale_h, 1 / scale_w from the export's scale factors, 0: none
  ivec4 flags;      // x: align_corners
} up;

float scale_of(int in_size, int out_size, float inv_scale) {
#ifdef BILINEAR
  if (up.flags.x != 0) {
    return out_size > 1 ? float(in_size - 1) / float(out_size - 1) : 0.0;
  }
#endif
  return inv_scale > 0.0 ? inv_scale : float(in_size) / float(out_size);
}

#ifdef NEAREST
int nearest_idx(int o, int in_size, int out_size, float inv_scale) {
  if (out_size == in_size) {
    return o;
  }
  if (out_size == 2 * in_size) {
    return o >> 1;
  }
  precise float src = float(o) * scale_of(in_size, out_size, inv_scale);
  return min(int(floor(src)), in_size - 1);
}
#else
// (index0, index1, lambda0, lambda1) of ATen's linear interpolation along one dim.
void linear_idx(int o, int in_size, int out_size, float inv_scale, out int i0, out int i1,
                out float l0, out float l1) {
  const float scale = scale_of(in_size, out_size, inv_scale);
  precise float src;
  if (up.flags.x != 0) {
    src = scale * float(o);
  } else {
    src = scale * (float(o) + 0.5) - 0.5;
    src = src < 0.0 ? 0.0 : src;
  }
  i0 = int(src);
  i1 = i0 + (i0 < in_size - 1 ? 1 : 0);
  l1 = min(max(src - float(i0), 0.0), 1.0);
  l0 = 1.0 - l1;
}
#endif

// One output element (plane_grid.h calls it).
void output_at(int ow, int oh, int plane, int OW, int OH, int IW, int IH) {
  const int i = (plane * OH + oh) * OW + ow;
  const int base = plane * IH * IW;
#ifdef NEAREST
  const int ih = nearest_idx(oh, IH, OH, up.inv_scales.x);
  const int iw = nearest_idx(ow, IW, OW, up.inv_scales.y);
  out_data[i] = OUT_STORE(float(in_data[base + ih * IW + iw]));
#else
  int h0, h1, w0, w1;
  float hl0, hl1, wl0, wl1;
  linear_idx(oh, IH, OH, up.inv_scales.x, h0, h1, hl0, hl1);
  linear_idx(ow, IW, OW, up.inv_scales.y, w0, w1, wl0, wl1);
  const float top = wl0 * float(in_data[base + h0 * IW + w0])
      + wl1 * float(in_data[base + h0 * IW + w1]);
  const float bottom = wl0 * float(in_data[base + h1 * IW + w0])
      + wl1 * float(in_data[base + h1 * IW + w1]);
  out_data[i] = OUT_STORE(hl0 * top + hl1 * bottom);
#endif
}

#include "plane_grid.h"
