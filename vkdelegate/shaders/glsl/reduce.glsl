#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"
#include "elementwise_math.h"

// Reductions over any set of dims: mean, prod, amax, amin, var, argmax/argmin and any
// (sum keeps its own shader, reduce_sum.glsl), accumulating in ACC_T (fp32 for fp16).
// Defines: OUT_T, IN_T, OUT_STORE(v), ACC_T (ACC_FLOAT for float), REDUCE_KIND (one of
// the KIND_* below); WG_REDUCE=<n> for the cooperative form. The reduced dims are a
// bitmask in `mask.x` (index arithmetic: reduced_dims.h); `fparams.x` is var's
// correction. Sizes come from in_meta (resizable).
// Two forms, as in reduce_sum.glsl:
// - default: one invocation per output walks its reduced elements;
// - WG_REDUCE=n: one workgroup of n invocations (a power of two, the local size) per
//   output; each folds a strided share, then a tree in shared memory folds the n
//   partial states (long reductions: llvmpipe ends a loop after LOOP_LIMIT iterations).
// Both load 16 elements per loop iteration ([[unroll]]ed) for the same reason.
// Every kind is a fold over a state (value, index) with one `combine` that is
// associative and commutative given the indices (argmax/argmin break ties, NaN
// included, by the lower index), so the strided shares and the tree give ATen's
// results: first index of the extreme value or of the first NaN, NaN propagating
// through amax/amin, any true on NaN.
#define KIND_MEAN 1
#define KIND_PROD 2
#define KIND_MAX 3
#define KIND_MIN 4
#define KIND_VAR 5
#define KIND_ARGMAX 6
#define KIND_ARGMIN 7
#define KIND_ANY 8

TENSOR_OUT(out_data, OUT_T)
TENSOR_IN(in_data, IN_T)
TENSOR_META(out_meta)
TENSOR_META(in_meta)
PARAMS(reduce_block) { ivec4 mask; vec4 fparams; };

#include "reduced_dims.h"

#ifdef ACC_FLOAT
#define LOWEST (-INF_F)
#define HIGHEST INF_F
bool is_nan(float v) { return isnan(v); }
#else
#define LOWEST (-2147483647 - 1)
#define HIGHEST 2147483647
bool is_nan(int v) { return false; }
#endif

#if REDUCE_KIND == KIND_MEAN || REDUCE_KIND == KIND_VAR
#define IDENTITY ACC_T(0)
#elif REDUCE_KIND == KIND_PROD
#define IDENTITY ACC_T(1)
#elif REDUCE_KIND == KIND_MAX || REDUCE_KIND == KIND_ARGMAX
#define IDENTITY ACC_T(LOWEST)
#elif REDUCE_KIND == KIND_MIN || REDUCE_KIND == KIND_ARGMIN
#define IDENTITY ACC_T(HIGHEST)
#elif REDUCE_KIND == KIND_ANY
#define IDENTITY ACC_T(0)
#else
#error unknown REDUCE_KIND
#endif

// Folds state (bv, bi) into (av, ai). Indices matter for argmax/argmin only, where
// ai < 0 marks the empty state.
void combine(inout ACC_T av, inout int ai, ACC_T bv, int bi) {
#if REDUCE_KIND == KIND_MEAN || REDUCE_KIND == KIND_VAR
  av += bv;
#elif REDUCE_KIND == KIND_PROD
  av *= bv;
#elif REDUCE_KIND == KIND_MAX || REDUCE_KIND == KIND_MIN
  if (!is_nan(av)) {  // NaN wins
    av = is_nan(bv) ? bv : (REDUCE_KIND == KIND_MAX ? max(av, bv) : min(av, bv));
  }
#elif REDUCE_KIND == KIND_ANY
  av = (av != ACC_T(0) || bv != ACC_T(0)) ? ACC_T(1) : ACC_T(0);
#else  // argmax / argmin
  bool take;
  if (bi < 0 || ai < 0) {
    take = ai < 0;
  } else if (is_nan(av) || is_nan(bv)) {
    take = is_nan(av) && is_nan(bv) ? bi < ai : is_nan(bv);
  } else {
    take = (REDUCE_KIND == KIND_ARGMAX ? bv > av : bv < av) || (bv == av && bi < ai);
  }
  if (take) {
    av = bv;
    ai = bi;
  }
#endif
}

// Whether a fold in increasing index order can stop: later elements change nothing.
bool settled(ACC_T v, int i) {
#if REDUCE_KIND == KIND_MAX || REDUCE_KIND == KIND_MIN
  return is_nan(v);
#elif REDUCE_KIND == KIND_ARGMAX || REDUCE_KIND == KIND_ARGMIN
  return i >= 0 && is_nan(v);
#elif REDUCE_KIND == KIND_ANY
  return v != ACC_T(0);
#else
  return false;
#endif
}

// The element folded in: the value itself (mode 0), for var its deviation from
// `center` (mode 1) or its squared deviation (mode 2), or its truthiness for any (NaN
// != 0 is true, as in ATen).
ACC_T element(int base, uint r, int mode, float center) {
  const ACC_T v = ACC_T(in_data[reduced_offset(base, r)]);
#if REDUCE_KIND == KIND_VAR
  if (mode != 0) {
    const float dev = float(v) - center;
    return mode == 1 ? dev : dev * dev;
  }
#elif REDUCE_KIND == KIND_ANY
  return v != ACC_T(0) ? ACC_T(1) : ACC_T(0);
#endif
  return v;
}

#ifdef WG_REDUCE
#define STEP (16u * WG_REDUCE)
#define LANE gl_LocalInvocationID.x
#define LANE_STRIDE WG_REDUCE
#else
#define STEP 16u
#define LANE 0u
#define LANE_STRIDE 1u
#endif

// This invocation's fold over its share of the `count` reduced elements: indices
// r0 + j * LANE_STRIDE + LANE, 16 per loop iteration. Each block of 16 is folded apart
// first, which keeps the rounding error of long sums down.
void fold_share(int base, uint count, int mode, float center,
                inout ACC_T acc, inout int index) {
  for (uint r0 = 0u; r0 < count; r0 += STEP) {
    ACC_T block = IDENTITY;
    int block_index = -1;
    [[unroll]] for (uint j = 0u; j < 16u; ++j) {
      const uint r = r0 + j * LANE_STRIDE + LANE;
      if (r < count) {
        combine(block, block_index, element(base, r, mode, center), int(r));
      }
    }
    combine(acc, index, block, block_index);
    if (settled(acc, index)) {
      break;
    }
  }
}

#ifdef WG_REDUCE
shared ACC_T partial[WG_REDUCE];
shared int partial_index[WG_REDUCE];

// Folds every lane's (acc, index) into all lanes' (acc, index) through shared memory.
void fold_workgroup(inout ACC_T acc, inout int index) {
  partial[LANE] = acc;
  partial_index[LANE] = index;
  barrier();
  for (uint s = WG_REDUCE / 2; s > 0u; s >>= 1) {
    if (LANE < s) {
      ACC_T v = partial[LANE];
      int i = partial_index[LANE];
      combine(v, i, partial[LANE + s], partial_index[LANE + s]);
      partial[LANE] = v;
      partial_index[LANE] = i;
    }
    barrier();
  }
  acc = partial[0];
  index = partial_index[0];
  barrier();  // every lane has read the result before shared memory is reused
}

uint output_index() {
  return gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
}
#else
void fold_workgroup(inout ACC_T acc, inout int index) {}

uint output_index() { return linear_id(); }
#endif

void main() {
  const uint o = output_index();
  if (o >= uint(numel_of(out_meta))) {
    return;  // a whole workgroup leaves together in the cooperative form
  }
  uint count;
  const int base = kept_base(o, count);
  ACC_T acc = IDENTITY;
  int index = -1;
  fold_share(base, count, 0, 0.0, acc, index);
  fold_workgroup(acc, index);
#if REDUCE_KIND == KIND_MEAN || REDUCE_KIND == KIND_VAR
  const float mean = count == 0u ? NAN_F : acc / float(count);
#if REDUCE_KIND == KIND_MEAN
  if (LANE == 0u) {
    out_data[o] = OUT_STORE(mean);
  }
#else
  // Three passes: the mean c; the sum S of the deviations x - c; the sum Q of their
  // squares; m2 = Q - S^2 / n ("corrected two-pass", Chan, Golub and LeVeque 1983),
  // exact for any c. c itself is off the true mean by its fp32 rounding (about 5e-4
  // at a mean of 1e4, as large as a spread of 0.01): the S^2 / n term takes that out.
  // No cancellation of sum(x^2) - n*mean^2 either.
  float shift = 0.0;
  fold_share(base, count, 1, mean, shift, index);
  fold_workgroup(shift, index);
  float m2 = 0.0;
  fold_share(base, count, 2, mean, m2, index);
  fold_workgroup(m2, index);
  if (count > 0u) {
    const float corrected = m2 - shift * shift / float(count);
    // rounding may leave -tiny for a constant row; NaN stays NaN (a GPU compiler may
    // turn a compare-select into max(), which drops NaN)
    m2 = isnan(corrected) ? corrected : max(corrected, 0.0);
  }
  const float denom = float(count) - fparams.x;
  // ATen divides by max(0, N - correction): 0/0 is NaN, m2/0 is inf.
  const float var = denom > 0.0 ? m2 / denom : (m2 > 0.0 ? INF_F : NAN_F);
  if (LANE == 0u) {
    out_data[o] = OUT_STORE(var);
  }
#endif
#elif REDUCE_KIND == KIND_ARGMAX || REDUCE_KIND == KIND_ARGMIN
  if (LANE == 0u) {
    out_data[o] = OUT_STORE(max(index, 0));
  }
#elif REDUCE_KIND == KIND_ANY
  if (LANE == 0u) {
    out_data[o] = OUT_STORE(acc != ACC_T(0));
  }
#else
  if (LANE == 0u) {
    out_data[o] = OUT_STORE(acc);
  }
#endif
}
