#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_NV_cooperative_matrix2 : require
#extension GL_EXT_shader_explicit_arithmetic_types : require
#include "common.h"
#include "sdpa.h"

// Fused scaled dot-product attention for float16 prefill on workgroup-scope cooperative
// matrices (VK_NV_cooperative_matrix2: workgroup scope, flexible dimensions, tensor
// addressing, reductions and per-element operations; fp16 products accumulated in
// fp32): sdpa_coopmat.glsl's operation (sdpa.glsl's header) for the layout [B, H, L, D],
// no mask tensor and no window, causal or not, with its positions (query row 0 at
// sdpa_offset, at most pos.y keys) and its exact early exit. kernels/attention.py picks
// it (``coop2_fits``).
//
// One workgroup per (BR query rows, head, batch) owns the BR x D_MAX query block (an A
// matrix, loaded once), the BR x D_MAX fp32 output accumulator O and, per row, the
// running max M and sum L of the online softmax, each held as a BR x BC matrix whose
// rows repeat the row's value (the extension reduces rows into such matrices). Per
// tile of BC keys: S = Q K^T (K loaded transposed through a tensor view), times
// scale * log2(e); where the tile reaches past the causal limit or the key count, the
// masked scores become -inf (per element); M' = max(M, rowmax(S)), P = 2^(S - M'),
// eM = 2^(M - M'); L = eM L + rowsum(P) (P as fp16 times a matrix of ones: the sums of
// exactly the P that multiplies V); O = eM O + P V. The driver stages every load
// through shared memory; the shader has no shared memory or barrier of its own.
// At the end O / L (a row with no key: FULLY_MASKED, 0 or NaN) is stored through a
// clamped layout (rows past L, columns past Ev dropped); loads past S rows or E / Ev
// columns read zeros.
//
// M starts at -FLT_MAX / 2 (finite), so a masked score's P is 2^(-inf) = 0 exactly and
// no NaN arises from -inf - -inf. Exactness of the early exit: a tile that no row of
// the workgroup attends has rowmax -inf, so M' = M, eM = 2^0 = 1, L * 1 + 0 = L and O * 1
// + 0 V = O bit for bit (O starts at +0, never -0 for finite V): skipping it gives the
// same bits.
//
// Defines: OUT_T, Q_T = K_T = V_T = float16_t, OUT_STORE (unused); D_MAX (64 or 128:
// the matrices' head dim; E, Ev <= D_MAX, multiples of 8); BR, BC (multiples of the
// flexible granularities for THREADS invocations); THREADS (local size x); UNROLL
// (key tiles per loop iteration); CAUSAL;
// SKIP_MASKED_TILES; HEAVY_FIRST (CAUSAL: the longest rows first); FULLY_MASKED;
// POS_TENSOR with START_T.

#define ACC_BC coopmat<float, gl_ScopeWorkgroup, BR, BC, gl_MatrixUseAccumulator>
#define ACC_D coopmat<float, gl_ScopeWorkgroup, BR, D_MAX, gl_MatrixUseAccumulator>
#define CLAMPED gl_CooperativeMatrixClampModeConstantNV
#define LOG2E 1.4426950408889634
#define NEG_HALF_MAX uintBitsToFloat(0xfeffffffu)  // -FLT_MAX / 2

float max_op(const in float x, const in float y) {
  return max(x, y);
}

float smear_op(const in float x, const in float y) {
  return x;
}

float max_elem(const in uint32_t r, const in uint32_t c, const in float x, const in float y) {
  return max(x, y);
}

float exp2_elem(const in uint32_t r, const in uint32_t c, const in float x) {
  return exp2(x);
}

// Score (r, c) of the tile at key k0 for rows from absolute position p0: -inf where
// the key is past the count S or (CAUSAL) after the row's position.
float mask_elem(const in uint32_t r, const in uint32_t c, const in float v, const in int p0,
                const in int k0, const in int S) {
  const int j = k0 + int(c);
#ifdef CAUSAL
  const bool masked = j >= S || j > p0 + int(r);
#else
  const bool masked = j >= S;
#endif
  return masked ? NEG_INF : v;
}

void main() {
  SDPA_QUERY_BLOCK(BR);  // sdpa.h: i0, h (HEAVY_FIRST: the longest rows first)
  const int bq = int(gl_WorkGroupID.z);
  SDPA_SIZES();  // sdpa.h: E, L, Hq, B, S, Ev, qoff
  if (i0 >= L || h >= Hq || bq >= B) {
    return;  // uniform in the workgroup
  }
  SDPA_BASES(h, bq, Hq, B);  // q_base, k_base, v_base and the row strides

  // 2-D layouts (rows, head dims) of this head's q, k and v, clamped: zeros past L, S,
  // E and Ev. The bases and row strides are multiples of 8 elements (16 bytes; the
  // host checks E and Ev, the tensors are contiguous), which the masks tell the driver.
  tensorLayoutNV<2, CLAMPED> lq = createTensorLayoutNV(2, CLAMPED);
  lq = setTensorLayoutDimensionNV(lq, L, E);
  lq = setTensorLayoutStrideNV(lq, q_row & ~7, 1);
  tensorLayoutNV<2, CLAMPED> lk = createTensorLayoutNV(2, CLAMPED);
  lk = setTensorLayoutDimensionNV(lk, S, E);
  lk = setTensorLayoutStrideNV(lk, k_row & ~7, 1);
  tensorLayoutNV<2, CLAMPED> lv = createTensorLayoutNV(2, CLAMPED);
  lv = setTensorLayoutDimensionNV(lv, S, Ev);
  lv = setTensorLayoutStrideNV(lv, v_row & ~7, 1);
  tensorViewNV<2, false, 1, 0> transposed = createTensorViewNV(2, false, 1, 0);

  coopmat<float16_t, gl_ScopeWorkgroup, BR, D_MAX, gl_MatrixUseA> q;
  coopMatLoadTensorNV(q, q_data, uint(q_base & ~7), sliceTensorLayoutNV(lq, i0, BR, 0, D_MAX));
  coopmat<float16_t, gl_ScopeWorkgroup, BC, BC, gl_MatrixUseB> ones =
      coopmat<float16_t, gl_ScopeWorkgroup, BC, BC, gl_MatrixUseB>(1.0);

  ACC_D o = ACC_D(0.0);
  ACC_BC m = ACC_BC(NEG_HALF_MAX);
  ACC_BC l = ACC_BC(0.0);
  const float score_scale = scale.x * float(LOG2E);
  const int p0 = qoff + i0;  // row 0's absolute position

  int t_hi = (S + BC - 1) / BC;
#if defined(SKIP_MASKED_TILES) && defined(CAUSAL)
  t_hi = min(t_hi, (max(-1, p0 + min(BR, L - i0) - 1) + BC) / BC);
#endif
  // One tile of BC keys from key k0 (the loop bodies below).
#ifdef CAUSAL
#define EDGE(k0) ((k0) + BC > S || (k0) + BC - 1 > p0)
#else
#define EDGE(k0) ((k0) + BC > S)
#endif
#define TILE(k0_) {                                                                      \
    const int k0 = (k0_);                                                                \
    coopmat<float16_t, gl_ScopeWorkgroup, D_MAX, BC, gl_MatrixUseB> kt;                 \
    coopMatLoadTensorNV(kt, k_data, uint(k_base & ~7),                                  \
                        sliceTensorLayoutNV(lk, k0, BC, 0, D_MAX), transposed);         \
    ACC_BC s = ACC_BC(0.0);                                                              \
    s = coopMatMulAdd(q, kt, s);                                                         \
    s = s * score_scale;                                                                 \
    if (EDGE(k0)) { /* uniform: past the causal limit or the key count */               \
      coopMatPerElementNV(s, s, mask_elem, p0, k0, S);                                   \
    }                                                                                    \
    ACC_BC rowmax;                                                                       \
    coopMatReduceNV(rowmax, s, gl_CooperativeMatrixReduceRowNV, max_op);                 \
    const ACC_BC m_old = m;                                                              \
    coopMatPerElementNV(m, rowmax, max_elem, m_old);                                     \
    ACC_BC p;                                                                            \
    coopMatPerElementNV(p, s - m, exp2_elem);                                            \
    ACC_BC e_m;                                                                          \
    coopMatPerElementNV(e_m, m_old - m, exp2_elem);                                      \
    coopmat<float16_t, gl_ScopeWorkgroup, BR, BC, gl_MatrixUseA> p16 =                   \
        coopmat<float16_t, gl_ScopeWorkgroup, BR, BC, gl_MatrixUseA>(p);                 \
    ACC_BC rowsum = ACC_BC(0.0);                                                         \
    rowsum = coopMatMulAdd(p16, ones, rowsum);                                           \
    l = e_m * l + rowsum;                                                                \
    coopmat<float16_t, gl_ScopeWorkgroup, BC, D_MAX, gl_MatrixUseB> vt;                 \
    coopMatLoadTensorNV(vt, v_data, uint(v_base & ~7),                                  \
                        sliceTensorLayoutNV(lv, k0, BC, 0, D_MAX));                     \
    ACC_D e_md;                                                                          \
    coopMatReduceNV(e_md, e_m, gl_CooperativeMatrixReduceRowNV, smear_op);               \
    o = o * e_md;                                                                        \
    o = coopMatMulAdd(p16, vt, o);                                                       \
  }
  // UNROLL tiles per iteration (the driver may overlap a tile's loads with the
  // previous one's products), then single tiles.
  int t = 0;
  for (; t + UNROLL <= t_hi; t += UNROLL) {
    [[unroll]] for (int u = 0; u < UNROLL; ++u) TILE((t + u) * BC)
  }
  for (; t < t_hi; ++t) TILE(t * BC)
#undef TILE
#undef EDGE

  ACC_D inv;
  coopMatReduceNV(inv, l, gl_CooperativeMatrixReduceRowNV, smear_op);
  [[unroll]] for (int i = 0; i < inv.length(); ++i) {
    inv[i] = inv[i] == 0.0 ? float(FULLY_MASKED) : 1.0 / inv[i];
  }
  o = o * inv;
  coopmat<OUT_T, gl_ScopeWorkgroup, BR, D_MAX, gl_MatrixUseAccumulator> result =
      coopmat<OUT_T, gl_ScopeWorkgroup, BR, D_MAX, gl_MatrixUseAccumulator>(o);
  // out [B, Hq, L, Ev], contiguous.
  tensorLayoutNV<2, CLAMPED> lo = createTensorLayoutNV(2, CLAMPED);
  lo = setTensorLayoutDimensionNV(lo, L, Ev);
  const int o_base = (bq * Hq + h) * L * Ev;
  coopMatStoreTensorNV(result, out_data, uint(o_base),
                       sliceTensorLayoutNV(lo, i0, BR, 0, D_MAX));
}
