#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"
#include "elementwise_math.h"

// softmax / log_softmax along one dim, max-shifted: exp(x - max) never overflows.
// Pass 1 finds the row's max, pass 2 sums exp(x - max) in fp32, pass 3 writes.
// Defines: OUT_T, IN_T, OUT_STORE(v), LOG_SOFTMAX (set for log_softmax); WG_REDUCE=<n>
// for the cooperative form. Two forms, as in reduce_sum.glsl:
// - default: one invocation per row (every element with the softmax dim's coordinate
//   removed) walks the row;
// - WG_REDUCE=n: one workgroup of n invocations (a power of two, the local size) per
//   row; each takes a strided share of every pass, trees in shared memory combine the
//   max and the sum (long rows: llvmpipe ends a loop after LOOP_LIMIT iterations).
// Both do 16 elements per loop iteration ([[unroll]]ed) for the same reason.
// `dim.x` is the softmax dim as a metadata index (innermost first). In and out are
// contiguous with the same sizes, so an element has the same offset in both. A NaN
// in a row makes the row NaN, a row of -inf is NaN (ATen's results).

TENSOR_OUT(out_data, OUT_T)
TENSOR_IN(in_data, IN_T)
TENSOR_META(out_meta)
TENSOR_META(in_meta)
PARAMS(softmax_block) { ivec4 dim; };

#ifdef WG_REDUCE
#define STEP (16 * WG_REDUCE)
#define LANE int(gl_LocalInvocationID.x)
#define LANE_STRIDE WG_REDUCE
shared float partial[WG_REDUCE];
#else
#define STEP 16
#define LANE 0
#define LANE_STRIDE 1
#endif

#ifdef WG_REDUCE
// Combines every lane's value (max_nan from elementwise_math.h: NaN wins, or +) through shared memory; all lanes get it.
float combine_lanes(float v, bool is_max) {
  partial[LANE] = v;
  barrier();
  for (int s = WG_REDUCE / 2; s > 0; s >>= 1) {
    if (LANE < s) {
      const float b = partial[LANE + s];
      partial[LANE] = is_max ? max_nan(partial[LANE], b) : partial[LANE] + b;
    }
    barrier();
  }
  const float result = partial[0];
  barrier();  // every lane has read the result before shared memory is reused
  return result;
}

uint row_index() {
  return gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
}
#else
float combine_lanes(float v, bool is_max) { return v; }

uint row_index() { return linear_id(); }
#endif

void main() {
  const uint o = row_index();
  const int n = size_at(in_meta, dim.x);
  if (n == 0 || o >= uint(numel_of(in_meta) / n)) {
    return;  // a whole workgroup leaves together in the cooperative form
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
  // This invocation's elements: r = r0 + j * LANE_STRIDE + LANE, 16 per iteration.
  float m = -INF_F;
  for (int r0 = 0; r0 < n; r0 += STEP) {
    [[unroll]] for (int j = 0; j < 16; ++j) {
      const int r = r0 + j * LANE_STRIDE + LANE;
      if (r < n) {
        m = max_nan(m, float(in_data[base + r * stride]));
      }
    }
    if (isnan(m)) {
      break;
    }
  }
  m = combine_lanes(m, true);
  float sum = 0.0;
  for (int r0 = 0; r0 < n; r0 += STEP) {
    float block = 0.0;  // summed apart first: less rounding error in long rows
    [[unroll]] for (int j = 0; j < 16; ++j) {
      const int r = r0 + j * LANE_STRIDE + LANE;
      if (r < n) {
        block += exp(float(in_data[base + r * stride]) - m);
      }
    }
    sum += block;
  }
  sum = combine_lanes(sum, false);
#ifdef LOG_SOFTMAX
  const float log_sum = log(sum);
#endif
  for (int r0 = 0; r0 < n; r0 += STEP) {
    [[unroll]] for (int j = 0; j < 16; ++j) {
      const int r = r0 + j * LANE_STRIDE + LANE;
      if (r < n) {
        const int at = base + r * stride;
        const float shifted = float(in_data[at]) - m;
#ifdef LOG_SOFTMAX
        out_data[at] = OUT_STORE(shifted - log_sum);
#else
        out_data[at] = OUT_STORE(exp(shifted) / sum);
#endif
      }
    }
  }
}
