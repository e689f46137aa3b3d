#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"
#include "elementwise_math.h"

// linalg_vector_norm over any set of dims, fp32 accumulation (fp16 data too):
//   NORM_KIND 1: ord 2, sqrt(sum x * x)      2: ord 1, sum |x|
//             3: ord inf, max |x|            4: ord -inf, min |x|
//             5: ord 0, count of x != 0      6: ord p > 0, (sum |x|^p)^(1/p)
// NaN propagates (max/min included; NaN != 0 counts for ord 0), as in ATen.
// Defines: OUT_T, IN_T, OUT_STORE(v), NORM_KIND; WG_REDUCE=<n> for the cooperative
// form (reduce_sum.glsl's two forms). The reduced dims are a bitmask in `mask.x`
// (reduced_dims.h); `fparams.x` is p. Sizes come from in_meta (resizable).

TENSOR_OUT(out_data, OUT_T)
TENSOR_IN(in_data, IN_T)
TENSOR_META(out_meta)
TENSOR_META(in_meta)
PARAMS(reduce_block) { ivec4 mask; vec4 fparams; };

#include "reduced_dims.h"

#if NORM_KIND == 3
#define IDENTITY 0.0
float fold(float acc, float v) { return max_nan(acc, abs(v)); }
#elif NORM_KIND == 4
#define IDENTITY INF_F
float fold(float acc, float v) { return isnan(v) || isnan(acc) ? NAN_F : min(acc, abs(v)); }
#else
#define IDENTITY 0.0
#if NORM_KIND == 1
float term(float v) { return v * v; }
#elif NORM_KIND == 2
float term(float v) { return abs(v); }
#elif NORM_KIND == 5
float term(float v) { return v != 0.0 || isnan(v) ? 1.0 : 0.0; }
#else
float term(float v) { return isnan(v) ? v : pow(abs(v), fparams.x); }
#endif
float fold(float acc, float v) { return acc + term(v); }
#endif

// Two partial states combined (the tree, and the blocks of 16 of the sums).
float combine(float a, float b) {
#if NORM_KIND == 3
  return max_nan(a, b);
#elif NORM_KIND == 4
  return isnan(a) || isnan(b) ? NAN_F : min(a, b);
#else
  return a + b;
#endif
}

float finish(float acc) {
#if NORM_KIND == 1
  return sqrt(acc);
#elif NORM_KIND == 6
  return isnan(acc) ? acc : pow(acc, 1.0 / fparams.x);  // pow's NaN is undefined
#else
  return acc;
#endif
}

#ifdef WG_REDUCE
#define STEP (16u * WG_REDUCE)
#define LANE gl_LocalInvocationID.x
#define LANE_STRIDE uint(WG_REDUCE)
shared float partial[WG_REDUCE];
uint out_index() { return gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x; }
#else
#define STEP 16u
#define LANE 0u
#define LANE_STRIDE 1u
uint out_index() { return linear_id(); }
#endif

void main() {
  const uint o = out_index();
  if (o >= uint(numel_of(out_meta))) {
    return;  // the whole workgroup leaves together: no barrier is split
  }
  uint count;
  const int base = kept_base(o, count);
  float acc = IDENTITY;
  // 16 loads per loop iteration (LOOP_LIMIT in common.h), each block folded apart.
  for (uint r0 = 0u; r0 < count; r0 += STEP) {
    float block = IDENTITY;
    [[unroll]] for (uint j = 0u; j < 16u; ++j) {
      const uint r = r0 + j * LANE_STRIDE + LANE;
      if (r < count) {
        block = fold(block, float(in_data[reduced_offset(base, r)]));
      }
    }
    acc = combine(acc, block);
  }
#ifdef WG_REDUCE
  partial[LANE] = acc;
  barrier();
  for (uint s = WG_REDUCE / 2; s > 0u; s >>= 1) {
    if (LANE < s) {
      partial[LANE] = combine(partial[LANE], partial[LANE + s]);
    }
    barrier();
  }
  if (LANE == 0u) {
    out_data[o] = OUT_STORE(finish(partial[0]));
  }
#else
  out_data[o] = OUT_STORE(finish(acc));
#endif
}
