#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"

// vkdelegate.choose_qparams_per_token (ops/families/choose_qparams.py): per row of x
// [rows, K] (fp32), torchao's asymmetric int8 per-token qparams, op for op as its
// decomposition computes them (custom_ops._choose_qparams_per_token):
//   lo = min(amin(x), 0), hi = max(amax(x), 0) (a NaN in the row: both NaN),
//   scale = max((hi - lo) / 255, FLT_MIN) (NaN handled before: torch.clamp keeps it),
//   zp = int8(clamp(-128 - roundEven(lo / scale), -128, 127)) (NaN, from a NaN or
//   a -inf in the row: 0, as eager's cast gives on the CPU),
// both divisions correctly rounded (div_rn), as the CPU's are.
// Workgroup r (of WG invocations, linear_id() / WG) reduces row r; workgroups past
// the current rows (params.info.x; the grid is sized for the most) write nothing.
// Defines: WG (a power of two), SCALE_T / SCALE_STORE(v), ZP_T / ZP_STORE(v).

TENSOR_OUT(scale_data, SCALE_T)
TENSOR_OUT(zp_data, ZP_T)
TENSOR_IN(x_data, float)
PARAMS(qparams_block) {
  ivec4 info;     // x: rows now, y: K
  vec4 fparams;   // x: 255 (quant_max - quant_min), y: eps (FLT_MIN)
};

// a / b (b > 0) rounded to nearest even, as the CPU's division: GLSL's `/` may be off
// by a few ulp (Vulkan allows 2.5; the H100 gave a row's scale one ulp off). The
// quotient is corrected once by its remainder, which brings it within an ulp, so that
// the remainder r = a - q b is exact (one fma); then the true quotient lies past the
// midpoint to a neighbour q' exactly when r passes (q' - q) / 2 * b (exact: a power of
// two times b), and equals it at a tie (then the even mantissa). Finite nonzero
// quotients only (the others are returned as they are).
float next_toward(float q, bool up) {
  const uint u = floatBitsToUint(q);
  return uintBitsToFloat((q > 0.0) == up ? u + 1u : u - 1u);
}

float div_rn(float a, float b) {
  float q = a / b;
  if (isinf(q) || isnan(q) || q == 0.0) {
    return q;
  }
  q += fma(-q, b, a) / b;
  if (q == 0.0) {
    return q;
  }
  precise const float r = fma(-q, b, a);
  const float qu = next_toward(q, true);
  const float qd = next_toward(q, false);
  precise const float hu = (qu - q) * 0.5 * b;
  precise const float hd = (q - qd) * 0.5 * b;
  if (r > hu || (r == hu && (floatBitsToUint(qu) & 1u) == 0u)) {
    return qu;
  }
  if (r < -hd || (r == -hd && (floatBitsToUint(qd) & 1u) == 0u)) {
    return qd;
  }
  return q;
}

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
    // lo may be -0.0 or +0.0 where eager's is the other (min(+0, -0) may give
    // either): hi - lo and lo / scale are then the same or +-0, and -128 - round(+-0)
    // is -128 either way.
    const float scale = max(div_rn(s_hi[0] - s_lo[0], fparams.x), fparams.y);
    // lo = -inf gives inf / inf = NaN here (GLSL's clamp of NaN is undefined): 0, as
    // eager's cast of the NaN gives.
    const float zp = -128.0 - roundEven(div_rn(s_lo[0], scale));
    scale_data[row] = SCALE_STORE(scale);
    zp_data[row] = ZP_STORE(isnan(zp) ? 0 : int(clamp(zp, -128.0, 127.0)));
  }
}
