#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"
#include "elementwise_math.h"

// Reductions over any set of dims: mean, prod, amax, amin, var, argmax/argmin and any
// (sum keeps its own shader, reduce_sum.glsl). One invocation per output element walks
// the reduced elements in row-major order, accumulating in ACC_T (fp32 for fp16 data).
// Defines: OUT_T, IN_T, OUT_STORE(v), ACC_T (ACC_FLOAT for float), REDUCE_KIND (one of
// the KIND_* below). The reduced dims are a bitmask in `mask.x`, bit d for metadata
// dim d (innermost first); `fparams.x` is var's correction. The output is contiguous
// over the kept dims in their order, keepdim or not, so the output index maps to the
// kept-dim coordinates of the input directly. Sizes come from in_meta (resizable).
#define KIND_MEAN 1
#define KIND_PROD 2
#define KIND_MAX 3
#define KIND_MIN 4
#define KIND_VAR 5
#define KIND_ARGMAX 6
#define KIND_ARGMIN 7
#define KIND_ANY 8

TENSOR_OUT(0, out_data, OUT_T)
TENSOR_IN(1, in_data, IN_T)
TENSOR_META(2, out_meta)
TENSOR_META(3, in_meta)
layout(set = 0, binding = 4) uniform reduce_block { ivec4 mask; vec4 fparams; };

// Offset of the r-th reduced element (row-major over the reduced dims) from `base`.
int reduced_offset(int base, uint r) {
  int offset = base;
  [[unroll]] for (int d = 0; d < 8; ++d) {
    if ((mask.x & (1 << d)) != 0) {
      const int size = size_at(in_meta, d);
      offset += int(r % uint(size)) * stride_at(in_meta, d);
      r /= uint(size);
    }
  }
  return offset;
}

#ifdef ACC_FLOAT
#define LOWEST (-INF_F)
#define HIGHEST INF_F
bool is_nan(float v) { return isnan(v); }
#else
#define LOWEST (-2147483647 - 1)
#define HIGHEST 2147483647
bool is_nan(int v) { return false; }
#endif

void main() {
  const uint o = linear_id();
  if (o >= uint(numel_of(out_meta))) {
    return;
  }
  uint rem = o;
  int base = 0;
  uint count = 1u;
  [[unroll]] for (int d = 0; d < 8; ++d) {
    const int size = size_at(in_meta, d);
    if ((mask.x & (1 << d)) != 0) {
      count *= uint(size);
    } else {
      base += int(rem % uint(size)) * stride_at(in_meta, d);
      rem /= uint(size);
    }
  }
#if REDUCE_KIND == KIND_MEAN || REDUCE_KIND == KIND_VAR
  float sum = 0.0;
  for (uint r = 0u; r < count; ++r) {
    sum += float(in_data[reduced_offset(base, r)]);
  }
  const float mean = count == 0u ? NAN_F : sum / float(count);
#if REDUCE_KIND == KIND_MEAN
  out_data[o] = OUT_STORE(mean);
#else
  // Two passes (mean, then squared deviations): no cancellation of sum(x^2) - n*mean^2.
  float m2 = 0.0;
  for (uint r = 0u; r < count; ++r) {
    const float dev = float(in_data[reduced_offset(base, r)]) - mean;
    m2 += dev * dev;
  }
  const float denom = float(count) - fparams.x;
  // ATen divides by max(0, N - correction): 0/0 is NaN, m2/0 is inf.
  const float var = denom > 0.0 ? m2 / denom : (m2 > 0.0 ? INF_F : NAN_F);
  out_data[o] = OUT_STORE(var);
#endif
#elif REDUCE_KIND == KIND_PROD
  ACC_T acc = ACC_T(1);
  for (uint r = 0u; r < count; ++r) {
    acc *= ACC_T(in_data[reduced_offset(base, r)]);
  }
  out_data[o] = OUT_STORE(acc);
#elif REDUCE_KIND == KIND_MAX || REDUCE_KIND == KIND_MIN
  // NaN wins (ATen's amax/amin propagate it).
  ACC_T acc = REDUCE_KIND == KIND_MAX ? ACC_T(LOWEST) : ACC_T(HIGHEST);
  for (uint r = 0u; r < count; ++r) {
    const ACC_T v = ACC_T(in_data[reduced_offset(base, r)]);
    if (is_nan(v)) {
      acc = v;
      break;
    }
    acc = REDUCE_KIND == KIND_MAX ? max(acc, v) : min(acc, v);
  }
  out_data[o] = OUT_STORE(acc);
#elif REDUCE_KIND == KIND_ANY
  // Truthiness as in ATen: nonzero, NaN included (NaN != 0 is true).
  bool found = false;
  for (uint r = 0u; r < count; ++r) {
    if (ACC_T(in_data[reduced_offset(base, r)]) != ACC_T(0)) {
      found = true;
      break;
    }
  }
  out_data[o] = OUT_STORE(found);
#elif REDUCE_KIND == KIND_ARGMAX || REDUCE_KIND == KIND_ARGMIN
  // argmax/argmin: index of the first extreme value, or of the first NaN (ATen).
  ACC_T best = ACC_T(0);
  int index = 0;
  for (uint r = 0u; r < count; ++r) {
    const ACC_T v = ACC_T(in_data[reduced_offset(base, r)]);
    if (is_nan(v)) {
      index = int(r);
      break;
    }
    const bool better = REDUCE_KIND == KIND_ARGMAX ? v > best : v < best;
    if (r == 0u || better) {
      best = v;
      index = int(r);
    }
  }
  out_data[o] = OUT_STORE(index);
#else
#error unknown REDUCE_KIND
#endif
}
