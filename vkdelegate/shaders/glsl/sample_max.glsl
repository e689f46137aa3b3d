#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"

// The first pass of vkdelegate.sample / sample_record over V > SPAN logits
// (vkdelegate/ops/families/sample.py): workgroup g of WGM invocations finds the maximum
// key (sample_keys.h: (fkey(z), V - 1 - i), z the logit or logit / temperature) of
// logits g * SPAN .. (g + 1) * SPAN - 1 and writes it to part_data[2g], [2g + 1];
// sample.glsl's PARTIALS form then takes the largest of the ceil(V / SPAN) keys
// instead of reading every logit in its one workgroup. Workgroups past ceil(V / SPAN)
// (the grid is sized for the largest V) write nothing.
// Defines: IN_T (logit storage), SAMP_T, WGM, SPAN (a multiple of WGM).

TENSOR_OUT(part_data, uint)
TENSOR_IN(logits, IN_T)
TENSOR_IN(sampling, SAMP_T)
PARAMS(sample_block) {
  ivec4 info;  // x: V (number of logits)
};
#include "sample_keys.h"

shared uint sh[WGM];
shared uint sl[WGM];

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint g = gl_WorkGroupID.x;
  const uint nv = uint(info.x);
  if (g >= (nv + SPAN - 1u) / SPAN) {
    return;  // the whole workgroup leaves together
  }
  const float temp = float(sampling[0]);
  uint bh = 0u, bl = 0u;
  [[unroll]] for (uint u = 0u; u < SPAN / WGM; ++u) {
    const uint i = g * SPAN + u * WGM + tid;
    if (i < nv) {
      const uint h = fkey(z_of(float(logits[i]), temp));
      const uint l = nv - 1u - i;
      if (key_ge(h, l, bh, bl)) {
        bh = h;
        bl = l;
      }
    }
  }
  sh[tid] = bh;
  sl[tid] = bl;
  barrier();
  for (uint s = WGM / 2u; s > 0u; s >>= 1) {
    if (tid < s && key_ge(sh[tid + s], sl[tid + s], sh[tid], sl[tid])) {
      sh[tid] = sh[tid + s];
      sl[tid] = sl[tid + s];
    }
    barrier();
  }
  if (tid == 0u) {
    part_data[2u * g] = sh[0];
    part_data[2u * g + 1u] = sl[0];
  }
}
