#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"

// vkdelegate.choose_qparams_per_token (ops/families/choose_qparams.py): per row of x
// [rows, K] (fp32), torchao's asymmetric int8 per-token qparams, op for op as its
// decomposition computes them (custom_ops._choose_qparams_per_token):
//   lo = min(amin(x), 0), hi = max(amax(x), 0) (a NaN in the row: both NaN),
//   scale = max((hi - lo) / 255, FLT_MIN) (NaN handled before: torch.clamp keeps it),
//   zp = int8(clamp(-128 - roundEven(lo / scale), -128, 127)) (NaN: 0, as eager's
//   cast gives on the CPU).
// Workgroup r (of WG invocations, linear_id() / WG) reduces row r; workgroups past the current rows
// (params.info.x; the grid is sized for the most) write nothing.
// Defines: WG (a power of two), SCALE_T / SCALE_STORE(v), ZP_T / ZP_STORE(v).

TENSOR_OUT(scale_data, SCALE_T)
TENSOR_OUT(zp_data, ZP_T)
TENSOR_IN(x_data, float)
PARAMS(qparams_block) {
  ivec4 info;     // x: rows now, y: K
  vec4 fparams;   // x: 255 (quant_max - quant_min), y: eps (FLT_MIN): uniforms, so
                  // that the compiler divides as the elementwise div does (by a
                  // value, not by a constant it may turn into a reciprocal product)
};

shared float s_lo[WG];
shared float s_hi[WG];
shared bool s_nan[WG];

void main() {
  const int t = int(gl_LocalInvocationID.x);
  const int row = int(linear_id()) / WG;  // the grid may fold into y (linear_id)
  if (row >= info.x) {
    return;  // the whole workgroup leaves together
  }
  const int K = info.y;
  float lo = 0.0, hi = 0.0;  // min(., 0) and max(., 0) of the row: start at 0
  bool nan = false;
  for (int k = t; k < K; k += WG) {
    const float v = x_data[row * K + k];
    if (isnan(v)) {
      nan = true;
    } else {
      lo = min(lo, v);
      hi = max(hi, v);
    }
  }
  s_lo[t] = lo;
  s_hi[t] = hi;
  s_nan[t] = nan;
  barrier();
  for (int s = WG / 2; s > 0; s >>= 1) {
    if (t < s) {
      s_lo[t] = min(s_lo[t], s_lo[t + s]);
      s_hi[t] = max(s_hi[t], s_hi[t + s]);
      s_nan[t] = s_nan[t] || s_nan[t + s];
    }
    barrier();
  }
  if (t == 0) {
    if (s_nan[0]) {
      scale_data[row] = SCALE_STORE(NAN_F);
      zp_data[row] = ZP_STORE(0);
      return;
    }
    // -0.0 cannot arise: lo starts at +0 and min(+0, -0) may give either, but
    // hi - lo and lo / scale are then +-0 alike, and -128 - round(+-0) is -128.
    const float scale = max((s_hi[0] - s_lo[0]) / fparams.x, fparams.y);
    const float zp = clamp(-128.0 - roundEven(s_lo[0] / scale), -128.0, 127.0);
    scale_data[row] = SCALE_STORE(scale);
    zp_data[row] = ZP_STORE(int(zp));
  }
}
