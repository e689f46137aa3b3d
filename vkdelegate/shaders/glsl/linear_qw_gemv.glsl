#version 450
#extension GL_GOOGLE_include_directive : require
#ifdef INT_DOT
#extension GL_EXT_spirv_intrinsics : require
#endif
#ifdef SUBGROUP
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif
#ifdef HALF_DOT
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#endif
#include "common.h"
#ifndef PROBE
#define PROBE 0
#endif

// Vectorized GEMV of the weight-only quantized linears (LLM decode: one to a few rows):
// out[m, n] = sum_k x[m, k] * dequant(w)[n, k] (+ bias[n]), fp32 accumulation, for
//   W4: et_vk.linear_q4gsw (uint8 [N, >= K/2], two int4 per byte, k even in the low
//       nibble, stored + 8; scales [K / GS, N] (row stride qstrides.x)), GS a multiple
//       of 32: one 16-byte block (32 values) lies in one group, so the block's integer
//       dot product is scaled once (fp16 models: the dequantized weight is not rounded
//       to fp16 first, as eager's dequantize does; at most 2^-12 of each product);
//   W8: aten._weight_int8pack_mm (int8 [N, K], K a multiple of 16; scales [N], applied
//       after the sum as ATen does).
//   DQ8CA (with W4): et_vk.linear_dq8ca_q4gsw (8da4w): x quantized per row as it is
//       staged (quantize_x.h), each block's products summed as integers (INT_DOT: four
//       dotPacked4x8EXT on the nibbles against x packed by k parity; else in fp32 by
//       block_dot: integer sums, exact below 2^24, else rounded by at most 2^-24
//       relative), the zero point's share (z * the group's weight sum) subtracted at
//       the block that starts a group, then * scale_w * scale_x.
//   QX_IN (DQ8CA, the DIRECT and SG_ROWS forms; kernels/quantized_x.py's publishes):
//       x_data is not x but the row already quantized by the qparams' dispatch
//       (choose_qparams.glsl's QX words: 8 a block, k parity-packed as the weight's
//       nibbles), so no value is quantized here and a block's x is 32 bytes, not 64
//       or 128; xs_data / xz_data still give the scale and zero point. The sums are
//       the same integers as the form that quantizes x as it loads it: the same
//       results, bit for bit.
// The weight is streamed in uvec4 (16-byte) blocks: a workgroup of WG invocations
// computes ROWS outputs of row m, invocation t reading blocks t, t + WG, ... of each
// of its ROWS weight rows (adjacent invocations adjacent 16 bytes). Each sweep of WG
// blocks first stages its x values in shared memory (coalesced vec4 loads, or with
// X16 uvec4s of 8 fp16 values, converted once; XOR-swizzled so that the reads, one
// block's KV values per invocation, are free of bank conflicts), read once per block
// for all ROWS rows. DIRECT (the default form): no staging and no barrier before the
// reduction; each invocation loads its blocks' x values itself (L1-cached) and handles
// blocks t, t + WG, ... UNROLL per iteration, all loads of an iteration issued first.
// SVEC: a workgroup's ROWS int4 scales of a group in ROWS / SPL vector loads (SV_HALF:
// stored as fp16, two per 32-bit word; SWIGLU: two runs of ROWS / 2 rows).
// HAS_RESIDUAL (vkdelegate.linear_q4gsw_add): r_data (out's shape, [M, N]) added to
// each output in fp32 after the bias, one rounding at the store. In the workgroup forms
// the plain epilogue's reads (the int8 scale, the bias, the residual: finish_loads) are
// requested by its invocations before the products, so that their latency is not paid
// after the sums (SG_ROWS: after them).
// SWIGLU (W4 or W8, not HAS_RESIDUAL; vkdelegate.linear_q4gsw_swiglu /
// weight_int8pack_mm_swiglu / linear_dq8ca_q4gsw_swiglu, kernels/swiglu.py): w is a
// merged gate/up weight of 2N rows for an output of N columns (qdims.y = N; the scales
// and bias index the merged rows); a workgroup's ROWS rows are the gate rows n0 .. n0 + ROWS/2 - 1 and the up
// rows N + n0 .., so each of its ROWS/2 outputs has its pair (n, N + n) of sums (each
// computed and reduced exactly as the plain GEMV computes that row), finished as the
// plain op finishes them (finish: W8's scale, the bias) and rounded as its store
// rounds them (SWIGLU_HALF: round_to_half, the value an fp16 output keeps); the output
// is CHAIN_BODY (the fused elementwise chain's GLSL) over r0 = gate and r1 = up.
// RMS_NORM (W4 or W8, not DQ8CA or HAS_RESIDUAL; vkdelegate.rms_norm_linear_q4gsw,
// rms_norm_weight_int8pack_mm and their SWIGLU forms): the product's row is
// et_vk.rms_norm(x, n_data, eps) (n_data [K] of x's dtype, eps = qnorm.x), never formed:
// x is multiplied by the norm weight as it is loaded (DIRECT) or staged (each element
// by the one invocation that stages it), and the squares of the raw x values are
// summed there (each of the row's K values once per workgroup); that sum is reduced
// with the rows' sums (one more slot), and each row's sum is scaled by
// 1 / sqrt(sum / K + eps) before finish (W8's scale, the bias) and SWIGLU's chain. fp32
// throughout: the normalized row is not rounded to x's dtype, as et_vk.rms_norm's
// output is.
// ROTARY (W4 or W8, not HAS_RESIDUAL, SWIGLU or SVEC; with RMS_NORM or DQ8CA or
// neither; vkdelegate.rms_norm_linear_q4gsw_rotary_cache,
// rms_norm_weight_int8pack_mm_rotary_cache, linear_dq8ca_q4gsw_rotary_cache,
// kernels/rotary_cache.py): w is a merged q/k/v weight of N = Nq + 2 Nk rows (qdims.y
// = N) whose product y [N] of one row is never stored: a workgroup's ROWS rows are
// ROWS/2 units of two rows (rotary_cache.h's ``rotary_row``: a q or k head's rotary
// pair, or two adjacent v rows), slot r < ROWS/2 the first row of unit n0 + r, slot
// ROWS/2 + r its second; each row's sum is computed and reduced exactly as the plain
// GEMV computes that row, and invocation t < ROWS/2 finishes its unit's two sums as
// the plain op finishes them (finish: W8's scale, the bias), rounds them as its store
// rounds them (ROTARY_ROUND) and rotates or writes them (``rotary_out``: q' into
// out_data, k' and v into their cache rows at the step's position, an index ATen
// rejects flagged and not written). The rows of a unit are not consecutive, so SVEC's
// runs of rows do not apply (the scalar scale loads read each row's own).
// SG_ROWS (subgroup rows; a DIRECT form, with SUBGROUP, without SVEC; every epilogue
// and DQ8CA): each SUBGROUP owns whole units and walks their full K, so that a short
// row (K = 2048: 64 int4 blocks) does not leave half a workgroup idle and no
// shared-memory reduction or barrier is paid per workgroup. A unit is one row (plain,
// HAS_RESIDUAL, W8, DQ8CA) or a row pair (SWIGLU: gate row n and up row N + n;
// ROTARY: rotary_row's pair); ROWS is the workgroup's units (not its weight rows),
// subgroup s taking units s, s + gl_NumSubgroups, ... of them. Lane l reads blocks
// l, l + gl_SubgroupSize, ... of its unit's rows (direct_rows, UNROLL per iteration;
// the subgroup size is the device's, 8 to 128: nothing assumes one; WG a multiple
// of it), each block's math exactly as the DIRECT form's (block_dot, one int4 scale
// per block); the rows' sums are reduced by subgroupAdd alone and the unit is
// finished by one lane (the elected: finish, the residual, SWIGLU's chain, ROTARY's
// rotation and cache writes; ROTARY's loads requested by every lane, before the
// products, at the same addresses). RMS_NORM: each subgroup sums the squares of the
// whole x row itself as it reads it for each unit (subgroupAdd), so every sum of a
// row's squares is the same value. Results differ from the other forms' in
// summation order only.
// HALF_DOT (W4 with X16, not DQ8CA; devices with shaderFloat16): each block's products
// in packed fp16 arithmetic (block_hdot: a nibble pair per 32-bit word, mask-and-OR
// into 1024's fp16 bits, one subtraction or FMA, one FMA for two weights: about half
// the instructions of block_dot's fp32 form), summed in fp16 over HWORDS words (4 to
// 16 products per lane) and then in fp32. x (times the norm weight with RMS_NORM) is
// rounded to fp16 once per block (RMS_NORM: inf where |x * norm weight| > 65504, which
// eager's normalized row never reaches) and the weights taken / 64 (exact), so a
// partial sum overflows only where |x| > 65504 * 64 / (8 * 4 * HWORDS): never for
// HWORDS 1, from 32752 for 4; the products are rounded to fp16 (2^-11 relative, as
// eager's fp16 dequantized weights are; products below 2^-14 keep 2^-24 absolute),
// the partial sums too.
// Values are unpacked in registers without integer-to-float
// conversions (block_dot). Reduction: subgroupAdd, then one shared-memory slot per
// subgroup (SUBGROUP, devices with subgroup arithmetic), else a shared-memory tree.
// Grid: x over ceil(N / ROWS) workgroups (SWIGLU: ceil(N / (ROWS / 2)); ROTARY:
// ceil(N / 2 / (ROWS / 2)); SG_ROWS: ceil(units / ROWS), N / 2 units for ROTARY), y
// the row m (rows past M and columns past N compute the last valid one and store
// nothing; SG_ROWS: computes nothing either).

#ifdef SWIGLU
#ifdef HAS_RESIDUAL
#error "SWIGLU takes no HAS_RESIDUAL"
#endif
#define UNIT_ROWS 2          // weight rows per output: its gate row and its up row
#define SV_RUNS 2            // SVEC: runs of consecutive rows (gate, up)
#ifdef ROTARY
#error "SWIGLU and ROTARY are two epilogues"
#endif
#elif defined(ROTARY)
#if defined(HAS_RESIDUAL) || defined(SVEC)
#error "ROTARY takes neither HAS_RESIDUAL nor SVEC"
#endif
#define UNIT_ROWS 2  // weight rows per unit (rotary_row)
#else
#define UNIT_ROWS 1
#define SV_RUNS 1
#endif
#if defined(HALF_DOT) && (!defined(W4) || !defined(X16) || defined(DQ8CA))
#error "HALF_DOT is a W4 form with X16, without DQ8CA"
#endif
#ifdef SG_ROWS
#if !defined(SUBGROUP) || !defined(DIRECT) || defined(SVEC)
#error "SG_ROWS is a DIRECT form with SUBGROUP, without SVEC"
#endif
#define OUT_ROWS ROWS     // units (outputs; SWIGLU, ROTARY: row pairs) per workgroup
#define LROWS UNIT_ROWS   // weight rows an invocation sums at once: its unit's
#else
#define OUT_ROWS (ROWS / UNIT_ROWS)  // outputs (ROTARY: units) per workgroup
#define LROWS ROWS
#endif
#if defined(QX_IN) && (!defined(DQ8CA) || !defined(DIRECT))
#error "QX_IN is a DQ8CA form of DIRECT (or SG_ROWS)"
#endif
#ifdef RMS_NORM
#if defined(DQ8CA) || defined(HAS_RESIDUAL)
#error "RMS_NORM takes neither DQ8CA nor HAS_RESIDUAL"
#endif
#define SLOTS (ROWS + 1)  // the partial sums' rows: the ROWS rows', then x's squares
#else
#define SLOTS ROWS
#endif

TENSOR_OUT(out_data, OUT_T)
#if defined(X16) || defined(QX_IN)
TENSOR_IN(x_data, uvec4)
#else
TENSOR_IN(x_data, vec4)
#endif
TENSOR_IN(w_data, uvec4)
#ifdef SVEC
TENSOR_IN(s_data, SV_T)  // SPL scales per load: vec4 (fp32) or uvec4 (8 fp16)
#else
TENSOR_IN(s_data, S_T)
#endif
#ifdef HAS_BIAS
TENSOR_IN(c_data, C_T)
#endif
#ifdef DQ8CA
TENSOR_IN(xs_data, XS_T)
TENSOR_IN(xz_data, XZ_T)
TENSOR_IN(sum_data, int)
#endif
#ifdef HAS_RESIDUAL
TENSOR_IN(r_data, R_T)
#endif
#ifdef RMS_NORM
#ifdef X16
TENSOR_IN(n_data, uvec4)  // the norm weight [K], read as x is
#else
TENSOR_IN(n_data, vec4)
#endif
#endif
TENSOR_META(out_meta)
// qdims: K, N, group size, weight uvec4 blocks per row used (K / KV); qstrides: the
// scales' row stride (W4), the weight sums' row stride (DQ8CA), the weight's row
// stride in uvec4 blocks, -.
PARAMS(qlinear_block) { ivec4 qdims; ivec4 qstrides; };
#ifdef RMS_NORM
PARAMS(qnorm_block) { vec4 qnorm; };  // RMS_NORM: eps, -, -, -
#endif
#include "qlinear.h"

#ifdef W4
#define KV 32  // k values per weight block
#else
#define KV 16
#endif
#define XV (KV / 4)  // vec4s of x per block

const float MAGIC = 8388608.0;  // 2^23: uintBitsToFloat(0x4B000000u)

#ifdef SG_ROWS
// no shared memory: subgroupAdd only
#elif defined(DIRECT)
shared vec4 xs[(SLOTS * WG + 3) / 4];  // the partial sums only
#else
// Shared x of one sweep: block j's vec4 e at j * XV + (e ^ swizzle(j)), so that the 8
// invocations of a 128-byte shared-memory phase (j .. j + 7, one vec4 e each) hit 8
// different 16-byte bank groups. Reused after the last sweep for the partial sums
// (SLOTS * WG floats: more than a sweep's x only for W8 with RMS_NORM and ROWS = 16).
#if (SLOTS * WG + 3) / 4 > WG * XV
shared vec4 xs[(SLOTS * WG + 3) / 4];
#else
shared vec4 xs[WG * XV];
#endif
#endif

#ifdef RMS_NORM
// x's values v (raw) -> v * the norm weight's nv, their squares added to ss.
vec4 norm_x(vec4 v, vec4 nv, inout float ss) {
  ss += dot(v, v);
  return v * nv;
}
#define NORM_X(v, nv) norm_x(v, nv, ss)
// A row's sum times 1 / sqrt(mean(x^2) + eps), ss_total the row's sum of squares.
#define NORM_SCALE(v) ((v) * (1.0 / sqrt(ss_total / float(K) + qnorm.x)))
#else
#define NORM_X(v, nv) (v)
#define NORM_SCALE(v) (v)
#endif

#ifndef DIRECT
int swizzle(int j) { return (j / (8 / XV)) & (XV - 1); }
#endif

#ifdef DQ8CA
#define QX(v) vec4(quantize_x(v.x, inv, z), quantize_x(v.y, inv, z), \
                   quantize_x(v.z, inv, z), quantize_x(v.w, inv, z))
#else
#define QX(v) (v)
#endif

#ifndef DIRECT
// Stage x[m, KV b0 .. ) (the sweep from block b0; zeros past the row) in xs; DQ8CA:
// quantized with (1 / scale, zero point) (inv, z), as exact small integers; RMS_NORM:
// times the norm weight, the squares of the staged values added to ss.
void stage_x(int m, int b0, int K, int blocks, float inv, int z, inout float ss) {
#ifdef X16
  [[unroll]] for (int i = 0; i < XV / 2; ++i) {
    const int u = i * WG + int(gl_LocalInvocationID.x);  // uvec4 u of the sweep
    const int j = u / (XV / 2), e = 2 * (u % (XV / 2));
    uvec4 h = uvec4(0u);
    uvec4 nh = uvec4(0u);
    if (b0 + j < blocks) {
      h = x_data[(m * K + b0 * KV) / 8 + u];
#ifdef RMS_NORM
      nh = n_data[(b0 * KV) / 8 + u];
#endif
    }
    xs[j * XV + (e ^ swizzle(j))] = QX(NORM_X(
        vec4(unpackHalf2x16(h.x), unpackHalf2x16(h.y)),
        vec4(unpackHalf2x16(nh.x), unpackHalf2x16(nh.y))));
    xs[j * XV + ((e + 1) ^ swizzle(j))] = QX(NORM_X(
        vec4(unpackHalf2x16(h.z), unpackHalf2x16(h.w)),
        vec4(unpackHalf2x16(nh.z), unpackHalf2x16(nh.w))));
  }
#else
  [[unroll]] for (int i = 0; i < XV; ++i) {
    const int v = i * WG + int(gl_LocalInvocationID.x);  // vec4 v of the sweep
    const int j = v / XV, e = v % XV;
    vec4 x = vec4(0.0);
    vec4 nv = vec4(0.0);
    if (b0 + j < blocks) {
      x = x_data[(m * K + b0 * KV) / 4 + v];
#ifdef RMS_NORM
      nv = n_data[(b0 * KV) / 4 + v];
#endif
    }
    xs[j * XV + (e ^ swizzle(j))] = QX(NORM_X(x, nv));
  }
#endif
}
#endif

// The sum over a block of x * (signed weight value). A field of 4 (W4) or 8 bits at
// bit p < 20 of a word, masked in place and ORed into 2^23's bits, is the float
// 2^23 + v * 2^p exactly; subtracting 2^23 + bias * 2^p leaves (v - bias) * 2^p, so
// each weight costs one LOP3 (mask and OR), one subtraction and one FMA. Products are
// summed per bit position p (one accumulator each) and scaled by 2^-p (exact) at
// the end; fields above bit 15 are shifted down once per word.
float block_dot(vec4 xv[XV], uvec4 w) {
  vec4 acc = vec4(0.0);  // by bit position: W4 0, 4, 8, 12; W8 0, 8
#ifdef W4
  [[unroll]] for (int i = 0; i < 4; ++i) {
    [[unroll]] for (int h = 0; h < 2; ++h) {  // nibbles 4h .. 4h + 3: k = 8 i + 4 h + j
      const uint half_word = h == 0 ? w[i] : w[i] >> 16;
      const vec4 x = xv[2 * i + h];
      [[unroll]] for (int j = 0; j < 4; ++j) {
        const float q = uintBitsToFloat((half_word & (0xFu << (4 * j))) | 0x4B000000u)
            - (MAGIC + 8.0 * float(1 << (4 * j)));
        acc[j] = fma(x[j], q, acc[j]);
      }
    }
  }
  return acc.x + acc.y * (1.0 / 16.0) + acc.z * (1.0 / 256.0) + acc.w * (1.0 / 4096.0);
#else
  [[unroll]] for (int i = 0; i < 4; ++i) {
    const uint word = w[i] ^ 0x80808080u;  // k = 4 i + t in byte t, now + 128
    [[unroll]] for (int h = 0; h < 2; ++h) {  // bytes 2h, 2h + 1
      const uint half_word = h == 0 ? word : word >> 16;
      [[unroll]] for (int j = 0; j < 2; ++j) {
        const float q = uintBitsToFloat((half_word & (0xFFu << (8 * j))) | 0x4B000000u)
            - (MAGIC + 128.0 * float(1 << (8 * j)));
        acc[j] = fma(xv[i][2 * h + j], q, acc[j]);
      }
    }
  }
  return acc.x + acc.y * (1.0 / 256.0);
#endif
}

#ifdef HALF_DOT
#ifndef HWORDS
#define HWORDS 1
#endif
#if HWORDS != 1 && HWORDS != 2 && HWORDS != 4
#error "HWORDS (words per fp16 partial sum) is 1, 2 or 4"
#endif
// x of a block for block_hdot as fp16 pairs (k, k + 4) of each word's 8 values
// (xh[4 i + j] = (x[8 i + j], x[8 i + 4 + j]): the lanes of a word's nibble pairs).
void half_x(vec4 xv[XV], out f16vec2 xh[16]) {
  [[unroll]] for (int i = 0; i < 4; ++i) {
    [[unroll]] for (int j = 0; j < 4; ++j) {
      xh[4 * i + j] = f16vec2(xv[2 * i][j], xv[2 * i + 1][j]);
    }
  }
}

// block_dot in packed fp16, / 64: word i's nibbles at bits 4j and 16 + 4j are k = 8 i
// + j and 8 i + 4 + j. Masked pairs ORed into 0x6400 (1024.0) are 1024 + v (bits 0-3)
// or 1024 + 16 v (bits 4-7), exactly; one FMA (times 1/64 minus 16.125, or times
// 1/1024 minus 1.125) makes either (v - 8) / 64, exactly; the upper two pairs after one
// shift by 8. The weights / 64 keep a partial sum of 4 products (HWORDS 1) under
// 4 * 8 / 64 * 65504 = 32752: no finite fp16 x overflows it.
float block_hdot(f16vec2 xh[16], uvec4 w) {
  float total = 0.0;
  f16vec2 acc = f16vec2(0.0hf);
  [[unroll]] for (int i = 0; i < 4; ++i) {
    const uint lo = w[i], hi = w[i] >> 8;
    const f16vec2 q0 = fma(unpackFloat2x16((lo & 0x000F000Fu) | 0x64006400u),
                           f16vec2(0.015625hf), f16vec2(-16.125hf));
    const f16vec2 q1 = fma(unpackFloat2x16((lo & 0x00F000F0u) | 0x64006400u),
                           f16vec2(0.0009765625hf), f16vec2(-1.125hf));
    const f16vec2 q2 = fma(unpackFloat2x16((hi & 0x000F000Fu) | 0x64006400u),
                           f16vec2(0.015625hf), f16vec2(-16.125hf));
    const f16vec2 q3 = fma(unpackFloat2x16((hi & 0x00F000F0u) | 0x64006400u),
                           f16vec2(0.0009765625hf), f16vec2(-1.125hf));
    acc = fma(xh[4 * i], q0, acc);
    acc = fma(xh[4 * i + 1], q1, acc);
    acc = fma(xh[4 * i + 2], q2, acc);
    acc = fma(xh[4 * i + 3], q3, acc);
    if ((i + 1) % HWORDS == 0) {
      const vec2 f = vec2(acc);
      total += f.x + f.y;
      acc = f16vec2(0.0hf);
    }
  }
  return total * 64.0;
}
#endif

#ifdef INT_DOT
// The integer sum of xq * stored nibble (value + 8) over one weight word's 8 values:
// ``even`` / ``odd`` the int8 xq of its even / odd k (the low / high nibbles).
int nibble_dot(uint even, uint odd, uint word) {
  return dotPacked4x8EXT(even, word & 0x0F0F0F0Fu)
      + dotPacked4x8EXT(odd, (word >> 4) & 0x0F0F0F0Fu);
}

// The block's integer sum of xq * (nibble - 8): x packed by k parity (the low nibbles
// of a word hold k even), against the stored nibbles (value + 8), minus 8 * sum(xq).
float block_idot(vec4 xv[XV], uvec4 w) {
  int isum = 0;
  [[unroll]] for (int i = 0; i < 4; ++i) {
    const ivec4 a = ivec4(xv[2 * i]), b = ivec4(xv[2 * i + 1]);  // k = 8 i .. 8 i + 7
    isum += nibble_dot(packed_bytes(ivec4(a.x, a.z, b.x, b.z)),
                       packed_bytes(ivec4(a.y, a.w, b.y, b.w)), w[i])
        - 8 * (a.x + a.y + a.z + a.w + b.x + b.y + b.z + b.w);
  }
  return float(isum);
}
#endif

#ifdef W8
#define SCALE_LAST  // the int8 scale once per output, after the sum
#endif
#include "qlinear_out.h"
#ifdef ROTARY
// out_data is q' (q's elements in order); out_meta describes the product y [1, N].
#define ROTARY_FINISH(s, m, n) finish(s, m, n)
#include "rotary_cache.h"
#endif

// Row m's 8da4w activation parameters (DQ8CA: row_qparams where ``live``), else
// (0, 1, 0): 1 / scale, scale, zero point.
void row_params(bool live, int m, out float inv, out float xscale, out int z) {
  inv = 0.0;
  xscale = 1.0;
  z = 0;
#ifdef DQ8CA
  if (live) {
    row_qparams(m, inv, xscale, z);
  }
#endif
}

// Requests block bc's weight blocks (wv), W4 scales (sv, times 8da4w's x scale) and
// DQ8CA zero-point shares (zs: z * the group's weight sum where bc starts a group)
// of the LROWS rows w_row (the workgroup's ROWS; SG_ROWS: a unit's).
void load_block(int bc, int w_row[LROWS], int z, float xscale, out uvec4 wv[LROWS],
                out float sv[LROWS], out int zs[LROWS]) {
#ifdef W4
  const int g = (bc * KV) / qdims.z;
#endif
#ifdef SVEC
  // The ROWS rows' scales of group g in ROWS / SPL vector loads, SV_RUNS runs of
  // consecutive rows (N, ROWS / SV_RUNS and the scales' row stride are multiples of
  // SPL, N one of ROWS / SV_RUNS: the op checks).
  [[unroll]] for (int h = 0; h < SV_RUNS; ++h) {
    [[unroll]] for (int i = 0; i < ROWS / SV_RUNS / SPL; ++i) {
      const int first = h * (ROWS / SV_RUNS) + SPL * i;  // the load's first row
      const SV_T v = s_data[(g * qstrides.x + w_row[h * (ROWS / SV_RUNS)]) / SPL + i];
#ifdef SV_HALF
      [[unroll]] for (int j = 0; j < SPL / 2; ++j) {
        const vec2 f = unpackHalf2x16(v[j]);
        sv[first + 2 * j] = f.x * xscale;
        sv[first + 2 * j + 1] = f.y * xscale;
      }
#else
      [[unroll]] for (int j = 0; j < SPL; ++j) {
        sv[first + j] = v[j] * xscale;
      }
#endif
    }
  }
#endif
  [[unroll]] for (int r = 0; r < LROWS; ++r) {
#if PROBE == 2
    wv[r] = uvec4(uint(w_row[r]) * 2654435761u + uint(bc)) * uvec4(1u, 3u, 5u, 7u);
#else
    wv[r] = w_data[w_row[r] * qstrides.z + bc];
#endif
#ifndef SVEC
    sv[r] = 1.0;
#endif
    zs[r] = 0;
#if defined(W4) && !defined(SVEC)
    sv[r] = float(s_data[g * qstrides.x + w_row[r]]) * xscale;
#endif
#ifdef DQ8CA
    zs[r] = (bc * KV) % qdims.z == 0 ? z * sum_data[g * qstrides.y + w_row[r]] : 0;
#endif
  }
}

#ifdef HALF_DOT
// acc[r] += the block's products with row r in HALF_DOT (x as half_x's pairs xh).
void add_hblock(inout float acc[LROWS], f16vec2 xh[16], uvec4 wv[LROWS],
                float sv[LROWS]) {
  [[unroll]] for (int r = 0; r < LROWS; ++r) {
    acc[r] = fma(block_hdot(xh, wv[r]), sv[r], acc[r]);
  }
}
#endif

// acc[r] += block's products with row r (x values xv; loads from load_block).
// PROBE (benchmarks/quant_gemv.py --probe only; wrong results): 1 = every load as in
// the real form, no unpacking (one XOR-fold of the weight block and one add of the x
// block per row); 2 = the real arithmetic on the loaded x and a weight block made
// from the row and block numbers (no weight load): memory against arithmetic; 3 (the
// workgroup forms' main): no block loop at all.
void add_block(inout float acc[LROWS], vec4 xv[XV], uvec4 wv[LROWS], float sv[LROWS],
               int zs[LROWS]) {
#if PROBE == 1
  vec4 xsum = vec4(0.0);
  [[unroll]] for (int e = 0; e < XV; ++e) {
    xsum += xv[e];
  }
  const float xt = xsum.x + xsum.y + xsum.z + xsum.w;
  [[unroll]] for (int r = 0; r < LROWS; ++r) {
    const uint f = wv[r].x ^ wv[r].y ^ wv[r].z ^ wv[r].w;
    acc[r] += float(f & 0xFFu) * sv[r] + xt;
  }
  return;
#endif
#ifdef HALF_DOT
  f16vec2 xh[16];
  half_x(xv, xh);  // once for the rows
  add_hblock(acc, xh, wv, sv);
#else
  [[unroll]] for (int r = 0; r < LROWS; ++r) {
#ifdef INT_DOT
    float d = block_idot(xv, wv[r]);
#else
    float d = block_dot(xv, wv[r]);
#endif
#ifdef DQ8CA
    d -= float(zs[r]);
#endif
#ifdef W4
    acc[r] = fma(d, sv[r], acc[r]);
#else
    acc[r] += d;
#endif
  }
#endif
}

#ifdef DIRECT
// DIRECT: each invocation loads its blocks' x values from global memory (XR raw
// vectors; unpacked, and quantized for DQ8CA, by unpack_x; QX_IN: 2 uvec4s of int8
// values, summed by add_qblock).
#ifdef QX_IN
#define XRAW uvec4
#define XR 2  // a block's 32 quantized values: 8 words
#elif defined(X16)
#define XRAW uvec4
#define XR (XV / 2)
#else
#define XRAW vec4
#define XR XV
#endif

void load_x(int m, int K, int bc, out XRAW xr[XR]) {
  [[unroll]] for (int i = 0; i < XR; ++i) {
#ifdef QX_IN
    xr[i] = x_data[(m * qdims.w + bc) * XR + i];  // rows of qdims.w blocks
#else
    xr[i] = x_data[(m * K + bc * KV) / (4 * XV / XR) + i];
#endif
  }
}

#ifdef QX_IN
// Word i (0 .. 7) of a block's QX words: 2j holds k = 8j, 8j + 2, 8j + 4, 8j + 6 of the
// block, 2j + 1 the odd k.
uint qword(uvec4 xq[XR], int i) {
  return xq[i / 4][i % 4];
}

// acc[r] += the block's products with row r, x already quantized (QX_IN): the integer
// sum of xq * (nibble - 8), as block_idot's (INT_DOT: the word's low nibbles against
// the even k, the high against the odd; 8 * sum(xq) once for the rows), minus the
// zero point's share, times the scales; else the values unpacked for add_block.
void add_qblock(inout float acc[LROWS], uvec4 xq[XR], uvec4 wv[LROWS], float sv[LROWS],
                int zs[LROWS]) {
#ifdef INT_DOT
  int xsum = 0;
  [[unroll]] for (int i = 0; i < 8; ++i) {
    xsum += dotPacked4x8EXT(qword(xq, i), 0x01010101u);
  }
  [[unroll]] for (int r = 0; r < LROWS; ++r) {
    int isum = -8 * xsum;
    [[unroll]] for (int i = 0; i < 4; ++i) {
      isum += nibble_dot(qword(xq, 2 * i), qword(xq, 2 * i + 1), wv[r][i]);
    }
    acc[r] = fma(float(isum) - float(zs[r]), sv[r], acc[r]);
  }
#else
  vec4 xv[XV];
  [[unroll]] for (int i = 0; i < 4; ++i) {  // k = 8 i .. 8 i + 7
    const int e = int(qword(xq, 2 * i)), o = int(qword(xq, 2 * i + 1));
    xv[2 * i] = vec4(bitfieldExtract(e, 0, 8), bitfieldExtract(o, 0, 8),
                     bitfieldExtract(e, 8, 8), bitfieldExtract(o, 8, 8));
    xv[2 * i + 1] = vec4(bitfieldExtract(e, 16, 8), bitfieldExtract(o, 16, 8),
                         bitfieldExtract(e, 24, 8), bitfieldExtract(o, 24, 8));
  }
  add_block(acc, xv, wv, sv, zs);
#endif
}
#endif

#ifdef RMS_NORM
// The norm weight's values of block bc (as load_x's of x).
void load_n(int bc, out XRAW nr[XR]) {
  [[unroll]] for (int i = 0; i < XR; ++i) {
    nr[i] = n_data[(bc * KV) / (4 * XV / XR) + i];
  }
}
#endif

#ifndef QX_IN
// RMS_NORM: times the norm weight's values nr, the squares of xr's values added to ss.
#ifdef RMS_NORM
void unpack_x(XRAW xr[XR], XRAW nr[XR], float inv, int z, out vec4 xv[XV],
              inout float ss) {
#else
void unpack_x(XRAW xr[XR], float inv, int z, out vec4 xv[XV]) {
#endif
  [[unroll]] for (int i = 0; i < XR; ++i) {
#ifdef X16
    xv[2 * i] = QX(NORM_X(vec4(unpackHalf2x16(xr[i].x), unpackHalf2x16(xr[i].y)),
                          vec4(unpackHalf2x16(nr[i].x), unpackHalf2x16(nr[i].y))));
    xv[2 * i + 1] = QX(NORM_X(vec4(unpackHalf2x16(xr[i].z), unpackHalf2x16(xr[i].w)),
                              vec4(unpackHalf2x16(nr[i].z), unpackHalf2x16(nr[i].w))));
#else
    xv[i] = QX(NORM_X(xr[i], nr[i]));
#endif
  }
}
#endif

// The DIRECT loop over row m: acc[r] += the products of weight row w_row[r] with x
// over blocks first, first + stride, ... (the workgroup forms: the invocation, WG;
// SG_ROWS: the lane, gl_SubgroupSize), UNROLL per iteration: x's, the weights' and
// the scales' loads of UNROLL blocks first (indices clamped in bounds), then the
// products. RMS_NORM: the squares of the raw x values read added to ss.
void direct_rows(int m, int K, int blocks, int first, int stride, int w_row[LROWS],
                 float inv, int z, float xscale, inout float acc[LROWS], inout float ss) {
  for (int b0 = first; b0 < blocks; b0 += UNROLL * stride) {
    XRAW xr[UNROLL][XR];
#ifdef RMS_NORM
    XRAW nr[UNROLL][XR];  // the norm weight's values of the blocks
#endif
    uvec4 wv[UNROLL][LROWS];
    float sv[UNROLL][LROWS];
    int zs[UNROLL][LROWS];
    [[unroll]] for (int u = 0; u < UNROLL; ++u) {
      const int bc = min(b0 + u * stride, blocks - 1);
      load_x(m, K, bc, xr[u]);
#ifdef RMS_NORM
      load_n(bc, nr[u]);
#endif
      load_block(bc, w_row, z, xscale, wv[u], sv[u], zs[u]);
    }
    [[unroll]] for (int u = 0; u < UNROLL; ++u) {
      if (b0 + u * stride < blocks) {
#ifdef QX_IN
        add_qblock(acc, xr[u], wv[u], sv[u], zs[u]);
#else
        vec4 xv[XV];
#ifdef RMS_NORM
        unpack_x(xr[u], nr[u], inv, z, xv, ss);
#else
        unpack_x(xr[u], inv, z, xv);
#endif
        add_block(acc, xv, wv[u], sv[u], zs[u]);
#endif
      }
    }
  }
}
#endif

#ifdef SG_ROWS
// SG_ROWS: subgroup s of the workgroup computes units n0 + s, n0 + s + gl_NumSubgroups,
// ... of its ROWS (n0 = ROWS * the workgroup), each over its whole K (direct_rows: lane
// l reads blocks l, l + gl_SubgroupSize, ... of the unit's rows), reduced by
// subgroupAdd, finished by one lane; no shared memory, no barrier.
void main() {
  const int K = qdims.x;
  const int N = qdims.y;
  const int blocks = qdims.w;
  const int M = N > 0 ? numel_of(out_meta) / N : 0;
#ifdef ROTARY
  const int units = N / 2;  // row pairs (rotary_row)
#else
  const int units = N;
#endif
  const int m = int(gl_WorkGroupID.y);
  if (m >= M) {
    return;  // uniform in the workgroup, and no barrier follows
  }
  float inv, xscale;
  int z;
  row_params(true, m, inv, xscale, z);
  for (int u = int(gl_SubgroupID); u < ROWS; u += int(gl_NumSubgroups)) {
    const int n = int(gl_WorkGroupID.x) * ROWS + u;  // the unit (uniform in the subgroup)
    if (n >= units) {
      break;
    }
    int w_row[LROWS];
#ifdef SWIGLU
    w_row[0] = n;
    w_row[1] = N + n;
#elif defined(ROTARY)
    w_row[0] = rotary_row(n, false);
    w_row[1] = rotary_row(n, true);
    // What the epilogue reads besides the sums, requested before the products (the
    // same addresses in every lane).
    const RotaryLoads loads = rotary_loads(n);
#else
    w_row[0] = n;
#endif
    float acc[LROWS];
    [[unroll]] for (int r = 0; r < LROWS; ++r) {
      acc[r] = 0.0;
    }
    float ss = 0.0;  // RMS_NORM: the sum of squares of the x values this lane read
    direct_rows(m, K, blocks, int(gl_SubgroupInvocationID), int(gl_SubgroupSize), w_row,
                inv, z, xscale, acc, ss);
    float sums[LROWS];
    [[unroll]] for (int r = 0; r < LROWS; ++r) {
      sums[r] = subgroupAdd(acc[r]);
    }
#ifdef RMS_NORM
    const float ss_total = subgroupAdd(ss);  // the whole row's, as every subgroup's
#endif
    if (subgroupElect()) {
#ifdef SWIGLU
      out_data[m * N + n] = OUT_STORE(swiglu_out(NORM_SCALE(sums[0]), NORM_SCALE(sums[1]),
                                                 m, n));
#elif defined(ROTARY)
      rotary_out(NORM_SCALE(sums[0]), NORM_SCALE(sums[1]), m, n, loads);
#else
      out_data[m * N + n] = OUT_STORE(finish(NORM_SCALE(sums[0]), m, n));
#endif
    }
  }
}
#else
// The partial sums, in xs after the sweeps: row r's slot i (SUBGROUP: i the subgroup
// id, else the invocation) is float r * WG + i, r < SLOTS (RMS_NORM: row ROWS holds
// the sums of squares).
#define PARTIAL(r, i) xs[((r) * WG + (i)) / 4][((r) * WG + (i)) % 4]

// What the epilogue reads besides the sums, requested by its invocations before the
// products: ROTARY's cos / sin and positions, the plain epilogue's finish_loads
// (SWIGLU: nothing early).
#ifdef ROTARY
#define EPI_LOADS RotaryLoads
#define EPI_NONE RotaryLoads(0.0, 0.0, 0.0, 0.0, 0, 0)
#define EPI_LOAD(m, u) rotary_loads(u)
#elif !defined(SWIGLU)
#define EPI_LOADS FinishLoads
#define EPI_NONE FinishLoads(1.0, 0.0, 0.0)
#define EPI_LOAD(m, n) finish_loads(m, n)
#else
#define EPI_LOADS int
#define EPI_NONE 0
#define EPI_LOAD(m, n) 0
#endif

// The weight rows of the workgroup's ROWS slots for outputs (ROTARY: units) n0 ..
// (past the last: the last valid one's, computed and not stored).
void tile_rows(int n0, int N, int units, out int w_row[ROWS]) {
  [[unroll]] for (int r = 0; r < ROWS; ++r) {
#ifdef SWIGLU
    w_row[r] = r < OUT_ROWS ? min(n0 + r, N - 1) : N + min(n0 + r - OUT_ROWS, N - 1);
#elif defined(ROTARY)
    w_row[r] = rotary_row(min(n0 + r % OUT_ROWS, units - 1), r >= OUT_ROWS);
#else
    w_row[r] = min(n0 + r, N - 1);
#endif
  }
}

// The epilogue's loads of invocation t for outputs n0 .. (EPI_NONE past them or where
// the workgroup is not live).
EPI_LOADS tile_loads(bool live, int m, int n0, int N, int units) {
  const int t = int(gl_LocalInvocationID.x);
#ifdef ROTARY
  if (live && t < OUT_ROWS && n0 + t < units) {
#else
  if (live && t < OUT_ROWS && n0 + t < N) {
#endif
    return EPI_LOAD(m, n0 + t);
  }
  return EPI_NONE;
}

// The workgroup's partial sums acc (and RMS_NORM's ss) reduced over its invocations,
// finished and stored for outputs (ROTARY: units) n0 .. of row m by invocations t <
// OUT_ROWS (nothing stored where not live). Begins with a barrier (xs free for the
// partial sums); called in uniform control flow.
void reduce_store(int m, int n0, int N, int units, bool live, float acc[ROWS], float ss,
                  EPI_LOADS epi) {
  const int K = qdims.x;
  const int t = int(gl_LocalInvocationID.x);
  barrier();  // xs is free for the partial sums
#ifdef SUBGROUP
  [[unroll]] for (int r = 0; r < ROWS; ++r) {
    const float s = subgroupAdd(acc[r]);
    if (subgroupElect()) {
      PARTIAL(r, int(gl_SubgroupID)) = s;
    }
  }
#ifdef RMS_NORM
  {
    const float s = subgroupAdd(ss);
    if (subgroupElect()) {
      PARTIAL(ROWS, int(gl_SubgroupID)) = s;
    }
  }
#endif
  barrier();
  float ss_total = 0.0;
#ifdef RMS_NORM
  for (uint i = 0u; i < gl_NumSubgroups; ++i) {
    ss_total += PARTIAL(ROWS, int(i));
  }
#endif
#ifdef SWIGLU
  if (live && t < OUT_ROWS && n0 + t < N) {
    float gate = 0.0, up = 0.0;
    for (uint i = 0u; i < gl_NumSubgroups; ++i) {
      gate += PARTIAL(t, int(i));
      up += PARTIAL(t + OUT_ROWS, int(i));
    }
    out_data[m * N + n0 + t] = OUT_STORE(swiglu_out(NORM_SCALE(gate), NORM_SCALE(up), m,
                                                    n0 + t));
  }
#elif defined(ROTARY)
  if (live && t < OUT_ROWS && n0 + t < units) {
    float first = 0.0, second = 0.0;
    for (uint i = 0u; i < gl_NumSubgroups; ++i) {
      first += PARTIAL(t, int(i));
      second += PARTIAL(t + OUT_ROWS, int(i));
    }
    rotary_out(NORM_SCALE(first), NORM_SCALE(second), m, n0 + t, epi);
  }
#else
  if (live && t < ROWS && n0 + t < N) {
    float total = 0.0;
    for (uint i = 0u; i < gl_NumSubgroups; ++i) {
      total += PARTIAL(t, int(i));
    }
    out_data[m * N + n0 + t] = OUT_STORE(finish_loaded(NORM_SCALE(total), epi));
  }
#endif
#else
  [[unroll]] for (int r = 0; r < ROWS; ++r) {
    PARTIAL(r, t) = acc[r];
  }
#ifdef RMS_NORM
  PARTIAL(ROWS, t) = ss;
#endif
  barrier();
  [[unroll]] for (int s = WG / 2; s > 0; s >>= 1) {
    if (t < s) {
      [[unroll]] for (int r = 0; r < SLOTS; ++r) {
        PARTIAL(r, t) += PARTIAL(r, t + s);
      }
    }
    barrier();
  }
#ifdef RMS_NORM
  const float ss_total = PARTIAL(ROWS, 0);
#endif
#ifdef SWIGLU
  if (live && t < OUT_ROWS && n0 + t < N) {
    out_data[m * N + n0 + t] = OUT_STORE(swiglu_out(NORM_SCALE(PARTIAL(t, 0)),
                                                    NORM_SCALE(PARTIAL(t + OUT_ROWS, 0)),
                                                    m, n0 + t));
  }
#elif defined(ROTARY)
  if (live && t < OUT_ROWS && n0 + t < units) {
    rotary_out(NORM_SCALE(PARTIAL(t, 0)), NORM_SCALE(PARTIAL(t + OUT_ROWS, 0)), m, n0 + t,
               epi);
  }
#else
  if (live && t < ROWS && n0 + t < N) {
    out_data[m * N + n0 + t] = OUT_STORE(finish_loaded(NORM_SCALE(PARTIAL(t, 0)), epi));
  }
#endif
#endif
}

void main() {
  const int K = qdims.x;
  const int N = qdims.y;
  const int blocks = qdims.w;
  const int M = N > 0 ? numel_of(out_meta) / N : 0;
  const int t = int(gl_LocalInvocationID.x);
  const int n0 = int(gl_WorkGroupID.x) * OUT_ROWS;
#ifdef ROTARY
  const int units = N / 2;  // the outputs: row pairs (rotary_row)
#else
  const int units = N;
#endif
  const int m = min(int(gl_WorkGroupID.y), max(M - 1, 0));
  const bool live = int(gl_WorkGroupID.y) < M && n0 < units;  // uniform in the workgroup
  float inv, xscale;
  int z;
  row_params(live, m, inv, xscale, z);
  int w_row[ROWS];
  float acc[ROWS];
  float ss = 0.0;  // RMS_NORM: the sum of squares of the x values this invocation read
  tile_rows(n0, N, units, w_row);
  [[unroll]] for (int r = 0; r < ROWS; ++r) {
    acc[r] = 0.0;
  }
  // The epilogue's invocations (t < OUT_ROWS, an output or unit each) request what it
  // reads now.
  const EPI_LOADS epi = tile_loads(live, m, n0, N, units);
#if PROBE == 3
  // PROBE 3 (benchmarks only, wrong results): no block loop (no weight, scale or x
  // loads, no products): the workgroup's launch, epilogue loads, reduction and stores.
  [[unroll]] for (int r = 0; r < ROWS; ++r) {
    acc[r] = float(r + t);
  }
  if (false) {
#else
  if (live) {
#endif
#ifdef DIRECT
    direct_rows(m, K, blocks, t, WG, w_row, inv, z, xscale, acc, ss);
#else
    for (int b0 = 0; b0 < blocks; b0 += WG) {
      // The sweep's weight blocks and scales are requested first, so that their
      // latency overlaps the staging of x and its barriers.
      const int b = b0 + t;
      uvec4 wv[ROWS];
      float sv[ROWS];
      int zs[ROWS];
      load_block(min(b, blocks - 1), w_row, z, xscale, wv, sv, zs);
      if (b0 > 0) {
        barrier();  // the previous sweep's reads of xs are done
      }
      stage_x(m, b0, K, blocks, inv, z, ss);
      barrier();
      if (b < blocks) {
        vec4 xv[XV];
        [[unroll]] for (int e = 0; e < XV; ++e) {
          xv[e] = xs[t * XV + (e ^ swizzle(t))];
        }
        add_block(acc, xv, wv, sv, zs);
      }
    }
#endif
  }
  reduce_store(m, n0, N, units, live, acc, ss, epi);
}
#endif  // SG_ROWS
