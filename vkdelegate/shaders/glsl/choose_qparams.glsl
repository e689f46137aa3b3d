#version 450
#extension GL_GOOGLE_include_directive : require
#ifdef SUBGROUP
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif
#include "common.h"

// vkdelegate.choose_qparams_per_token (ops/families/choose_qparams.py): per row of x
// [rows, K] (fp32, or fp16 with F16), torchao's asymmetric int8 per-token qparams, op
// for op as its decomposition computes them (custom_ops._choose_qparams_per_token):
//   lo = min(amin(x), 0), hi = max(amax(x), 0) (a NaN in the row: both NaN),
//   scale = max((hi - lo) / 255, eps) (NaN handled before: torch.clamp keeps it),
//   zp = int8(clamp(-128 - roundEven(lo / scale), -128, 127)) (NaN, from a NaN or
//   a -inf in the row: 0, as eager's cast gives on the CPU),
// both divisions correctly rounded (div_rn), as the CPU's are. F16: each of the
// difference and the two quotients rounded to fp16 (round_to_half) as eager's fp16
// ops round their fp32 results (hi - lo may overflow to inf there: scale inf).
// NORM (vkdelegate.rms_norm_choose_qparams): the row is first RMS-normalized as
// et_vk.rms_norm does (ops/families/norm.py's norm.glsl: fp32, x * rstd * weight with
// rstd = 1 / sqrt(mean(x * x) + eps), one rounding to x's dtype), written to y_data,
// and the qparams are those of y as stored (so bit for bit choose_qparams_per_token of
// the y written). The row is read once (main), the sum of squares, y and its
// min / max computed from the values held.
// QX (GPUs, rows for the products' GEMV: kernels/quantized_x.py's publishes): the row
// quantized with those qparams is written too, as the products would quantize each
// value (quantize_x.h: the same float operations, so the same int8 values), for
// linear_qw_gemv.glsl's QX_IN form, which then reads 1 byte a value and quantizes
// nothing: qx_data [rows, W] 32-bit words, W = 8 * ceil(K / 32); the 8 values k = 8g ..
// 8g + 7 are words 2g (k = 8g, 8g + 2, 8g + 4, 8g + 6, in bytes 0 .. 3) and 2g + 1 (the
// odd k): the k parity of an int4 weight word's low and high nibbles; past K, 0. A
// row holding a NaN gets zeros (its scale is NaN: the product's sums are NaN anyway).
// Workgroup r (of WG invocations, linear_id() / WG) reduces row r; workgroups past
// the current rows (params.info.x; the grid is sized for the most) write nothing.
// Defines: WG (a power of two), X_T, SCALE_T / SCALE_STORE(v), ZP_T / ZP_STORE(v), F16;
// NORM: Y_T / Y_STORE(v), W_T; SUBGROUP (the reductions by subgroup operations); QX;
// GPI (groups of 8 values an invocation holds: ops/families/choose_qparams.layout).

#ifdef NORM
TENSOR_OUT(y_data, Y_T)
#endif
TENSOR_OUT(scale_data, SCALE_T)
TENSOR_OUT(zp_data, ZP_T)
#ifdef QX
TENSOR_OUT(qx_data, uint)
#endif
TENSOR_IN(x_data, X_T)
#ifdef NORM
TENSOR_IN(w_data, W_T)
#endif
PARAMS(qparams_block) {
  ivec4 info;     // x: rows now, y: K, z: QX's words per row
  vec4 fparams;   // x: 255 (quant_max - quant_min), y: eps (x's dtype's least normal),
                  // z: NORM's eps
};

#ifdef F16
#define ROUND_X(v) round_to_half(v)  // the value an fp16 op stores
#else
#define ROUND_X(v) (v)
#endif

#ifdef F16
#define XQ16  // quantize_x.h: x's chain in fp16
#endif
#include "quantize_x.h"

shared float s_lo[WG];
shared float s_hi[WG];
shared float s_nan[WG];  // 1.0 where the invocation (SUBGROUP: the subgroup) saw a NaN
shared float r_lo, r_hi, r_nan;  // reduce's results

// The workgroup's sum (NORM's squares), minimum, maximum and NaN flag of each
// invocation's (s, lo, hi, nan), into r_lo (the sum when ``sum``), r_hi, r_nan, with a
// barrier after, so that they may be read. SUBGROUP (GPUs with subgroup arithmetic):
// a subgroup reduction, one shared slot per subgroup, the slots reduced by the first
// subgroup (each lane folding slots lane, lane + its size, ...); else a shared-memory
// tree.
void reduce(bool sum, float lo, float hi, float nan) {
  const int t = int(gl_LocalInvocationID.x);
#ifdef SUBGROUP
  lo = sum ? subgroupAdd(lo) : subgroupMin(lo);
  hi = subgroupMax(hi);
  nan = subgroupMax(nan);
  if (subgroupElect()) {
    s_lo[gl_SubgroupID] = lo;
    s_hi[gl_SubgroupID] = hi;
    s_nan[gl_SubgroupID] = nan;
  }
  barrier();
  if (gl_SubgroupID == 0u) {
    // Lanes past the slots: the sum's 0, slot 0's minimum and maximum (no change). The
    // loop's trip count is the subgroup's, so that its lanes reach the reductions
    // together.
    float a = sum ? 0.0 : s_lo[0], b = s_hi[0], c = 0.0;
    for (uint i0 = 0u; i0 < gl_NumSubgroups; i0 += gl_SubgroupSize) {
      const uint i = i0 + gl_SubgroupInvocationID;
      if (i < gl_NumSubgroups) {
        a = sum ? a + s_lo[i] : min(a, s_lo[i]);
        b = max(b, s_hi[i]);
        c = max(c, s_nan[i]);
      }
    }
    a = sum ? subgroupAdd(a) : subgroupMin(a);
    b = subgroupMax(b);
    c = subgroupMax(c);
    if (subgroupElect()) {
      r_lo = a;
      r_hi = b;
      r_nan = c;
    }
  }
  barrier();
#else
  s_lo[t] = lo;
  s_hi[t] = hi;
  s_nan[t] = nan;
  barrier();
  for (int s = WG / 2; s > 0; s >>= 1) {
    if (t < s) {
      s_lo[t] = sum ? s_lo[t] + s_lo[t + s] : min(s_lo[t], s_lo[t + s]);
      s_hi[t] = max(s_hi[t], s_hi[t + s]);
      s_nan[t] = max(s_nan[t], s_nan[t + s]);
    }
    barrier();
  }
  if (t == 0) {
    r_lo = s_lo[0];
    r_hi = s_hi[0];
    r_nan = s_nan[0];
  }
  barrier();
#endif
}

// The row's values are read once, GPI groups of 8 consecutive values an invocation
// (group g = t + i WG holds k = 8g .. 8g + 7; 0 past K), and kept in registers for
// every pass (NORM: the sum of squares, then y; the min / max; QX's quantization).
void main() {
  const int t = int(gl_LocalInvocationID.x);
  const int row = int(linear_id()) / WG;  // the grid may fold into y (linear_id)
  if (row >= info.x) {
    return;  // the whole workgroup leaves together
  }
  const int K = info.y;
  float v[8 * GPI];
  [[unroll]] for (int i = 0; i < GPI; ++i) {
    [[unroll]] for (int j = 0; j < 8; ++j) {
      const int k = 8 * (t + i * WG) + j;
      v[8 * i + j] = k < K ? float(x_data[row * K + k]) : 0.0;
    }
  }
#ifdef NORM
  float ss = 0.0;
  [[unroll]] for (int e = 0; e < 8 * GPI; ++e) {
    ss += v[e] * v[e];  // 0 past K
  }
  reduce(true, ss, 0.0, 0.0);
  // r_lo is written again only after every invocation passed the next reduce's first
  // barrier, so after this read.
  const float rstd = 1.0 / sqrt(r_lo / float(K) + fparams.z);
#endif
  float lo = 0.0, hi = 0.0;  // min(., 0) and max(., 0) of the row: start at 0
  float nan = 0.0;
  [[unroll]] for (int i = 0; i < GPI; ++i) {
    [[unroll]] for (int j = 0; j < 8; ++j) {
      const int k = 8 * (t + i * WG) + j;
      if (k < K) {
#ifdef NORM
        v[8 * i + j] = ROUND_X(v[8 * i + j] * rstd * float(w_data[k]));
        y_data[row * K + k] = Y_STORE(v[8 * i + j]);
#endif
        const float x = v[8 * i + j];
        if (isnan(x)) {
          nan = 1.0;
        } else {
          lo = min(lo, x);
          hi = max(hi, x);
        }
      }
    }
  }
  reduce(false, lo, hi, nan);
  // Every invocation computes the row's qparams (the same operations on the same
  // values: the same bits); the first stores them.
  const bool has_nan = r_nan != 0.0;
  // lo may be -0.0 or +0.0 where eager's is the other (min(+0, -0) may give
  // either): hi - lo and lo / scale are then the same or +-0, and -128 - round(+-0)
  // is -128 either way.
  const float scale = max(ROUND_X(div_rn(ROUND_X(r_hi - r_lo), fparams.x)), fparams.y);
  // lo = -inf gives inf / inf = NaN here (GLSL's clamp of NaN is undefined): 0, as
  // eager's cast of the NaN gives.
  const float zpf = -128.0 - roundEven(ROUND_X(div_rn(r_lo, scale)));
  const int zp = has_nan || isnan(zpf) ? 0 : int(clamp(zpf, -128.0, 127.0));
  if (t == 0) {
    scale_data[row] = SCALE_STORE(has_nan ? NAN_F : scale);
    zp_data[row] = ZP_STORE(zp);
  }
#ifdef QX
  const int words = info.z;
  const float inv = inverse_scale(scale);
  [[unroll]] for (int i = 0; i < GPI; ++i) {
    const int g = t + i * WG;
    if (g < words / 2) {
      uint even = 0u, odd = 0u;
      [[unroll]] for (int j = 0; j < 8; ++j) {
        const int q = 8 * g + j < K && !has_nan
            ? int(quantize_x(v[8 * i + j], inv, zp)) : 0;
        const uint byte = (uint(q) & 0xFFu) << (8 * (j / 2));
        if (j % 2 == 0) {
          even |= byte;
        } else {
          odd |= byte;
        }
      }
      qx_data[row * words + 2 * g] = even;
      qx_data[row * words + 2 * g + 1] = odd;
    }
  }
#endif
}
