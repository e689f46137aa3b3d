#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"

// Merges the key splits of sdpa.glsl's SPLIT_K form (flash decoding):
//   out[b, h, i, e] = sum_s acc_s[e] exp(m_s - M) / sum_s l_s exp(m_s - M),  M = max_s m_s
// part_data: fp32 rows of D_MAX + 4 (acc[0..D_MAX), m, l), row
// ((b * Hq + h) * L + i) * SPLITS + s; out [B, Hq, L, Ev] (SEQ_FIRST: [B, L, Hq, Ev]).
// A split that saw no key has m = -inf and l = 0 and adds nothing; a row no split saw a
// key for gets FULLY_MASKED (as sdpa.glsl). One invocation per output element
// (x: e, y: i, z: b * Hq + h).
// Defines: OUT_T, PART_T, OUT_STORE(v), D_MAX, FULLY_MASKED, SEQ_FIRST.

TENSOR_OUT(out_data, OUT_T)
TENSOR_IN(part_data, PART_T)
TENSOR_META(out_meta)
PARAMS(combine_block) { ivec4 splits; };  // x: the number of splits

#define NEG_INF uintBitsToFloat(0xff800000u)
#ifdef SEQ_FIRST
#define SEQ_DIM 2
#define HEAD_DIM 1
#else
#define SEQ_DIM 1
#define HEAD_DIM 2
#endif

void main() {
  const int e = int(gl_GlobalInvocationID.x);
  const int i = int(gl_GlobalInvocationID.y);
  const int bh = int(gl_GlobalInvocationID.z);
  const int Ev = size_at(out_meta, 0);
  const int L = size_at(out_meta, SEQ_DIM);
  const int Hq = size_at(out_meta, HEAD_DIM);
  const int B = size_at(out_meta, 3);
  if (e >= Ev || i >= L || bh >= B * Hq) {
    return;
  }
  const int n = splits.x;
  const int row0 = (bh * L + i) * n;
  float big = NEG_INF;
  for (int s = 0; s < n; ++s) {
    big = max(big, float(part_data[(row0 + s) * (D_MAX + 4) + D_MAX]));
  }
  float num = 0.0;
  float den = 0.0;
  for (int s = 0; s < n; ++s) {
    const int base = (row0 + s) * (D_MAX + 4);
    const float ms = float(part_data[base + D_MAX]);
    if (ms != NEG_INF) {
      const float f = (ms == big) ? 1.0 : exp(ms - big);
      num += float(part_data[base + e]) * f;
      den += float(part_data[base + D_MAX + 1]) * f;
    }
  }
  const int b = bh / Hq;
  const int h = bh % Hq;
  out_data[b * stride_at(out_meta, 3) + h * stride_at(out_meta, HEAD_DIM)
           + i * stride_at(out_meta, SEQ_DIM) + e]
      = OUT_STORE(den > 0.0 ? num / den : FULLY_MASKED);
}
