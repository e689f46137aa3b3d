#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"

// et_vk.apply_rotary_emb on one of xq / xk (vkdelegate/ops/families/rotary.py): x of
// sizes [..., S, H, D] with (real, imaginary) pairs interleaved along D, freqs_cos and
// freqs_sin of sizes [S, D/2]. One invocation per pair p = (.., s, h, j):
//   out[2p]     = x[2p] * cos[s, j] - x[2p+1] * sin[s, j]
//   out[2p + 1] = x[2p] * sin[s, j] + x[2p+1] * cos[s, j]
// in fp32 (ExecuTorch's pattern computes in float and converts back to x's dtype).
// Defines: OUT_T, IN_T, F_T (storage types), OUT_STORE(v).

TENSOR_OUT(out_data, OUT_T)
TENSOR_IN(in_data, IN_T)
TENSOR_IN(cos_data, F_T)
TENSOR_IN(sin_data, F_T)
PARAMS(rotary_block) {
  ivec4 info;  // x: pairs (numel / 2), y: D / 2, z: H, w: S
};

void main() {
  const uint p = linear_id();
  if (p >= uint(info.x)) {
    return;
  }
  const uint half_d = uint(info.y);
  const uint j = p % half_d;
  const uint s = (p / (half_d * uint(info.z))) % uint(info.w);
  const float c = float(cos_data[s * half_d + j]);
  const float sn = float(sin_data[s * half_d + j]);
  const float x0 = float(in_data[2u * p]);
  const float x1 = float(in_data[2u * p + 1u]);
  out_data[2u * p] = OUT_STORE(x0 * c - x1 * sn);
  out_data[2u * p + 1u] = OUT_STORE(x0 * sn + x1 * c);
}
