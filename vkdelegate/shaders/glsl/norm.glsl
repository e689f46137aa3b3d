#version 450
#extension GL_GOOGLE_include_directive : require
#ifdef SUBGROUP
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif
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
// ROW_VEC (LAYOUT 0 only, GPUs: the few-row form of LLM decode): one workgroup of any
// power-of-two size up to ROW_WG per row, the row read once into registers, VEC_PER
// vec4s per invocation (rows up to 4 * VEC_PER * the workgroup size); ROW_VEC=4: the
// row, weight, bias and output are accessed as 4-element vectors (IN4_T, ...,
// OUT4_STORE(v); the row length a multiple of 4, so every row starts 4-aligned),
// ROW_VEC=1: scalar accesses (any length). Lane sums: subgroupAdd and one shared slot per subgroup (SUBGROUP),
// else a shared-memory tree.

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

#ifdef ROW_VEC
#define LANE int(gl_LocalInvocationID.x)
#define LANES int(gl_WorkGroupSize.x)
shared float partial[ROW_WG];

// The sum of every lane's v; every lane gets the same value (same order everywhere).
float sum_lanes(float v) {
#ifdef SUBGROUP
  const float s = subgroupAdd(v);
  if (subgroupElect()) {
    partial[gl_SubgroupID] = s;
  }
  barrier();
  float result = 0.0;
  for (uint i = 0u; i < gl_NumSubgroups; ++i) {
    result += partial[i];
  }
#else
  partial[LANE] = v;
  barrier();
  for (int s = LANES / 2; s > 0; s >>= 1) {
    if (LANE < s) {
      partial[LANE] += partial[LANE + s];
    }
    barrier();
  }
  const float result = partial[0];
#endif
  barrier();  // every lane has read the result before shared memory is reused
  return result;
}

uint row_index() { return gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x; }
#elif defined(WG_REDUCE)
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

#ifdef ROW_VEC
#if ROW_VEC == 4
// 4-element views of the same buffers (aliased bindings; offsets in vec4s).
#define VEC_VIEW(name, T4, access) layout(set = 0, binding = BINDING_##name) \
  access buffer name##4_buffer { T4 name##4[]; };
VEC_VIEW(out_data, OUT4_T, writeonly)
VEC_VIEW(in_data, IN4_T, readonly)
#ifdef WEIGHT
VEC_VIEW(w_data, W4_T, readonly)
#endif
#ifdef BIAS
VEC_VIEW(b_data, B4_T, readonly)
#endif
#define LOAD4(buf, base, c) vec4(buf##4[(base) / 4 + (c)])
#else
#define LOAD4(buf, base, c) vec4(                                       \
    4 * (c) + 0 < S ? float(buf[(base) + 4 * (c) + 0]) : 0.0,           \
    4 * (c) + 1 < S ? float(buf[(base) + 4 * (c) + 1]) : 0.0,           \
    4 * (c) + 2 < S ? float(buf[(base) + 4 * (c) + 2]) : 0.0,           \
    4 * (c) + 3 < S ? float(buf[(base) + 4 * (c) + 3]) : 0.0)
#endif

// Row r of S elements (LAYOUT 0): vec4 c = LANE + k * LANES of it in x[k].
void row_vec(int r) {
  const int n4 = (S + 3) / 4;
  const int base = r * S;
  vec4 x[VEC_PER];
  float sum = 0.0;
  [[unroll]] for (int k = 0; k < VEC_PER; ++k) {
    const int c = LANE + k * LANES;
    x[k] = c < n4 ? LOAD4(in_data, base, c) : vec4(0.0);  // zero past S
#ifdef RMS
    sum += dot(x[k], x[k]);
#else
    sum += (x[k].x + x[k].y) + (x[k].z + x[k].w);
#endif
  }
  sum = sum_lanes(sum);
  float mean = 0.0;
  float rstd = NAN_F;
  if (S > 0) {
#ifdef RMS
    rstd = 1.0 / sqrt(sum / float(S) + eps.x);
#else
    mean = sum / float(S);
    float sq = 0.0;
    [[unroll]] for (int k = 0; k < VEC_PER; ++k) {
      const int c = LANE + k * LANES;
      // Elements past S are not part of the row: no deviation.
      const vec4 dev = (x[k] - mean) * vec4(lessThan(4 * c + ivec4(0, 1, 2, 3), ivec4(S)));
      sq += dot(dev, dev);
    }
    rstd = 1.0 / sqrt(sum_lanes(sq) / float(S) + eps.x);
#endif
  }
#ifdef STATS
  if (LANE == 0) {
    mean_data[r] = MEAN_STORE(mean);
    rstd_data[r] = RSTD_STORE(rstd);
  }
#endif
  [[unroll]] for (int k = 0; k < VEC_PER; ++k) {
    const int c = LANE + k * LANES;
    if (c < n4) {
      vec4 y = (x[k] - mean) * rstd;
#ifdef WEIGHT
      y *= LOAD4(w_data, 0, c);
#endif
#ifdef BIAS
      y += LOAD4(b_data, 0, c);
#endif
#if ROW_VEC == 4
      out_data4[base / 4 + c] = OUT4_STORE(y);
#else
      [[unroll]] for (int u = 0; u < 4; ++u) {
        if (4 * c + u < S) {
          out_data[base + 4 * c + u] = OUT_STORE(y[u]);
        }
      }
#endif
    }
  }
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
#ifdef ROW_VEC
  row_vec(r);
#else
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
#endif
}
