#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"
#include "elementwise_math.h"

// softmax / log_softmax along one dim, max-shifted: exp(x - max) never overflows.
// One invocation per row (every element with the softmax dim's coordinate removed):
// pass 1 finds the max, pass 2 sums exp(x - max) in fp32, pass 3 writes.
// Defines: OUT_T, IN_T, OUT_STORE(v), LOG_SOFTMAX (set for log_softmax).
// `dim.x` is the softmax dim as a metadata index (innermost first). In and out are
// contiguous with the same sizes, so an element has the same offset in both. A NaN
// in a row makes the row NaN, a row of -inf is NaN (ATen's results).

TENSOR_OUT(0, out_data, OUT_T)
TENSOR_IN(1, in_data, IN_T)
TENSOR_META(2, out_meta)
TENSOR_META(3, in_meta)
layout(set = 0, binding = 4) uniform softmax_block { ivec4 dim; };

void main() {
  const uint o = linear_id();
  const int n = size_at(in_meta, dim.x);
  if (n == 0 || o >= uint(numel_of(in_meta) / n)) {
    return;
  }
  uint rem = o;
  int base = 0;
  [[unroll]] for (int d = 0; d < 8; ++d) {
    if (d != dim.x) {
      const int size = size_at(in_meta, d);
      base += int(rem % uint(size)) * stride_at(in_meta, d);
      rem /= uint(size);
    }
  }
  const int stride = stride_at(in_meta, dim.x);
  float m = -INF_F;
  for (int r = 0; r < n; ++r) {
    const float v = float(in_data[base + r * stride]);
    m = (isnan(v) || v > m) ? v : m;
    if (isnan(m)) {
      break;
    }
  }
  float sum = 0.0;
  for (int r = 0; r < n; ++r) {
    sum += exp(float(in_data[base + r * stride]) - m);
  }
#ifdef LOG_SOFTMAX
  const float log_sum = log(sum);
#endif
  for (int r = 0; r < n; ++r) {
    const int at = base + r * stride;
    const float shifted = float(in_data[at]) - m;
#ifdef LOG_SOFTMAX
    out_data[at] = OUT_STORE(shifted - log_sum);
#else
    out_data[at] = OUT_STORE(exp(shifted) / sum);
#endif
  }
}
