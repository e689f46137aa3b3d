#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"

// Normalisation over rows: layer norm, RMS norm, group norm, batch norm with batch
// statistics (instance norm). The contiguous input is viewed as (K, R, S): row r's
// elements are x[k * R * S + r * S + s] for k < K, s < S (n = K * S of them).
//   LAYOUT 0 (layer / RMS norm): K = 1, S = the trailing `dims.x` dims' product;
//            weight and bias index s (normalized_shape's elements).
//   LAYOUT 1 (group norm, (N, C, *) input, G = dims.x groups): K = 1, R = N * G,
//            S = (C / G) * HxW; weight and bias index the channel
//            ((r % G) * S + s) / HxW.
//   LAYOUT 2 (batch statistics, (N, C, *) input): K = N, R = C, S = HxW; weight and
//            bias index r.
// Passes, fp32 accumulation (blocks of 16 summed apart first): the mean, then the
// mean squared deviation from it (two-pass variance, ATen's biased variance), then
// the write, out = (x - mean) * rstd * weight + bias with rstd = 1 / sqrt(var + eps).
// RMS: one pass for mean(x * x), then out = x * rstd * weight (ATen's rms_norm and
// ET-VK's rms_norm: fp32 math, one rounding to the output dtype).
// An empty row (n = 0) gives mean 0 and rstd NaN, as ATen does.
// Defines: OUT_T, IN_T (and W_T, B_T, MEAN_T, RSTD_T with _STORE), LAYOUT, RMS,
// WEIGHT, BIAS, STATS (write mean and rstd, one per row); WG_REDUCE=<n> for the
// cooperative form (one workgroup per row, trees in shared memory), as softmax.glsl.

TENSOR_OUT(out_data, OUT_T)
#ifdef STATS
TENSOR_OUT(mean_data, MEAN_T)
TENSOR_OUT(rstd_data, RSTD_T)
#endif
TENSOR_IN(in_data, IN_T)
#ifdef WEIGHT
TENSOR_IN(w_data, W_T)
#endif
#ifdef BIAS
TENSOR_IN(b_data, B_T)
#endif
TENSOR_META(in_meta)
PARAMS(norm_block) { ivec4 dims; vec4 eps; };

#ifdef WG_REDUCE
#define STEP (16 * WG_REDUCE)
#define LANE int(gl_LocalInvocationID.x)
#define LANE_STRIDE WG_REDUCE
shared float partial[WG_REDUCE];

// The sum of every lane's v, through shared memory; every lane gets it.
float sum_lanes(float v) {
  partial[LANE] = v;
  barrier();
  for (int s = WG_REDUCE / 2; s > 0; s >>= 1) {
    if (LANE < s) {
      partial[LANE] += partial[LANE + s];
    }
    barrier();
  }
  const float result = partial[0];
  barrier();  // every lane has read the result before shared memory is reused
  return result;
}

uint row_index() { return gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x; }
#else
#define STEP 16
#define LANE 0
#define LANE_STRIDE 1
float sum_lanes(float v) { return v; }
uint row_index() { return linear_id(); }
#endif

int R;       // rows
int S;       // elements of a row per chunk
int HW;      // LAYOUT 1: elements per channel
int GROUPS;  // LAYOUT 1: groups

// Offset of row r's element e (0 <= e < K * S).
int at(int r, int e) {
#if LAYOUT == 2
  return (e / S) * (R * S) + r * S + e % S;
#else
  return r * S + e;
#endif
}

#if defined(WEIGHT) || defined(BIAS)
int affine_index(int r, int e) {
#if LAYOUT == 0
  return e;
#elif LAYOUT == 1
  return ((r % GROUPS) * S + e) / HW;
#else
  return r;
#endif
}
#endif

void main() {
  // Sizes from the metadata, with constant indices only (see batch_norm.glsl).
  const int nd = ndim_of(in_meta);
  int K = 1;
#if LAYOUT == 0
  S = 1;
  R = 1;
  [[unroll]] for (int d = 0; d < 8; ++d) {
    if (d < dims.x) {
      S *= size_at(in_meta, d);
    } else {
      R *= size_at(in_meta, d);
    }
  }
#else
  int C = 1;
  int N = 1;
  HW = 1;
  [[unroll]] for (int d = 0; d < 8; ++d) {
    const int size = size_at(in_meta, d);
    if (d < nd - 2) {
      HW *= size;
    } else if (d == nd - 2) {
      C = size;
    } else if (d == nd - 1) {
      N = size;
    }
  }
#if LAYOUT == 1
  GROUPS = dims.x;
  R = N * GROUPS;
  S = (C / GROUPS) * HW;
#else
  K = N;
  R = C;
  S = HW;
#endif
#endif
  const int r = int(row_index());
  if (r >= R) {
    return;  // a whole workgroup leaves together in the cooperative form
  }
  const int n = K * S;
  float mean = 0.0;
  float rstd = NAN_F;
  if (n > 0) {
    // This invocation's elements: e = e0 + j * LANE_STRIDE + LANE, 16 per iteration.
    float sum = 0.0;
    for (int e0 = 0; e0 < n; e0 += STEP) {
      float block = 0.0;
      [[unroll]] for (int j = 0; j < 16; ++j) {
        const int e = e0 + j * LANE_STRIDE + LANE;
        if (e < n) {
          const float v = float(in_data[at(r, e)]);
#ifdef RMS
          block += v * v;
#else
          block += v;
#endif
        }
      }
      sum += block;
    }
    sum = sum_lanes(sum);
#ifdef RMS
    rstd = 1.0 / sqrt(sum / float(n) + eps.x);
#else
    mean = sum / float(n);
    float sq = 0.0;
    for (int e0 = 0; e0 < n; e0 += STEP) {
      float block = 0.0;
      [[unroll]] for (int j = 0; j < 16; ++j) {
        const int e = e0 + j * LANE_STRIDE + LANE;
        if (e < n) {
          const float dev = float(in_data[at(r, e)]) - mean;
          block += dev * dev;
        }
      }
      sq += block;
    }
    sq = sum_lanes(sq);
    rstd = 1.0 / sqrt(sq / float(n) + eps.x);
#endif
  }
#ifdef STATS
  if (LANE == 0) {
    mean_data[r] = MEAN_STORE(mean);
    rstd_data[r] = RSTD_STORE(rstd);
  }
#endif
  for (int e0 = 0; e0 < n; e0 += STEP) {
    [[unroll]] for (int j = 0; j < 16; ++j) {
      const int e = e0 + j * LANE_STRIDE + LANE;
      if (e < n) {
        const int i = at(r, e);
        float y = (float(in_data[i]) - mean) * rstd;
#if defined(WEIGHT) || defined(BIAS)
        const int a = affine_index(r, e);
#endif
#ifdef WEIGHT
        y *= float(w_data[a]);
#endif
#ifdef BIAS
        y += float(b_data[a]);
#endif
        out_data[i] = OUT_STORE(y);
      }
    }
  }
}
