#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#include "common.h"
#include "sdpa.h"

// Fused scaled dot-product attention for float16 prefill with cooperative matrices
// (VK_KHR_cooperative_matrix, 16 x 16 x 16 fp16 products accumulated in fp32): the
// operation, layouts, masks, positions and the exact block-sparse early exit of
// sdpa_tiled.glsl (read its header and sdpa.glsl's), on devices with 32-invocation
// subgroups (kernels/attention.py checks).
//
// One workgroup of NSG = 4 subgroups per (BM = 64 query rows, head, batch); subgroup g
// owns rows 16 g .. 16 g + 15: their query block as D_MAX / 16 A matrices (loaded once)
// and their output block as D_MAX / 16 fp32 accumulators. Per tile of BN = 32 keys:
// the K rows go to shared memory as fp16; S = Q K^T (two 16 x 16 accumulators per
// subgroup, times the scale) to shared memory as fp32; then V replaces nothing (its own
// tile) while two invocations per row run the row's online softmax (masks applied
// there; the pair shares its max through a subgroup shuffle) and write P as fp16; a
// subgroup whose rows' running max moved rescales its accumulators through shared
// memory (no per-row access to a cooperative matrix in the KHR extension); O += P V.
//
// Exactness of the early exit: a row that sees no key of a tile gets P = 0 there and
// its rescale factor stays 1, so its accumulator gets + 0 (unchanged: an accumulator
// starts at +0 and never becomes -0, for finite V); a skipped tile is one that no row
// of the workgroup sees, so skipping it gives the same bits.
//
// Defines: OUT_T, Q_T, K_T, V_T, OUT_STORE(v); D_MAX (32, 64 or 128); FULLY_MASKED;
// CAUSAL; WINDOW; MASK_BOOL / MASK_FLOAT with MASK_T; SKIP_MASKED_TILES; SEQ_FIRST.
// Local size 128.

#define NSG 4
#define WG (32 * NSG)
#define BM (16 * NSG)
#define BN 32
#define DF (D_MAX / 16)   // 16-wide fragments of a head dim
#define KS (D_MAX + 8)    // padded shared row of K / V / Q, in halves
#define SS (BN + 4)       // padded shared row of S, in floats
#define PS (BN + 8)       // padded shared row of P, in halves
#define OS 20             // padded shared row of one accumulator, in floats

#define A_T coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define B_T coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#define C_T coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>

shared float16_t k_sh[BN * KS];  // K of the tile (query rows 0..31 at the start)
shared float16_t v_sh[BN * KS];  // V of the tile (query rows 32..63 at the start)
shared float s_sh[BM * SS];
shared float16_t p_sh[BM * PS];
shared float o_sh[NSG * 16 * OS];
shared float row_alpha[BM];
shared float row_l[BM];
shared uint sg_rescale[NSG];
#if defined(MASK_BOOL) && defined(SKIP_MASKED_TILES)
shared uint tile_live[3];
#endif

void main() {
  const int lane = int(gl_LocalInvocationID.x);
  const int sg = int(gl_SubgroupID);
  const int sl = int(gl_SubgroupInvocationID);
  const int i0 = int(gl_WorkGroupID.x) * BM;
  const int h = int(gl_WorkGroupID.y);
  const int bq = int(gl_WorkGroupID.z);
  const int E = size_at(q_meta, 0);
  const int L = size_at(q_meta, SEQ_DIM);
  const int Hq = size_at(q_meta, HEAD_DIM);
  const int B = size_at(q_meta, 3);
  const int S = min(size_at(k_meta, SEQ_DIM), pos.y);
  const int Ev = size_at(v_meta, 0);
  if (i0 >= L || h >= Hq || bq >= B) {
    return;
  }
  SDPA_BASES(h, bq, Hq, B);

  // Stage the query block as fp16 (rows past L repeat row L - 1, never stored).
  [[unroll]] for (int u = 0; u < BM * D_MAX / WG; ++u) {
    const int idx = u * WG + lane;
    const int r = idx / D_MAX, e = idx % D_MAX;
    const float x = e < E ? float(q_data[q_base + min(i0 + r, L - 1) * q_row + e]) : 0.0;
    if (r < BN) {
      k_sh[r * KS + e] = float16_t(x);
    } else {
      v_sh[(r - BN) * KS + e] = float16_t(x);
    }
  }
  barrier();
  A_T qf[DF];
  [[unroll]] for (int f = 0; f < DF; ++f) {
    if (sg < 2) {
      coopMatLoad(qf[f], k_sh, 16 * sg * KS + 16 * f, KS, gl_CooperativeMatrixLayoutRowMajor);
    } else {
      coopMatLoad(qf[f], v_sh, 16 * (sg - 2) * KS + 16 * f, KS,
                  gl_CooperativeMatrixLayoutRowMajor);
    }
  }
  C_T of[DF];
  [[unroll]] for (int f = 0; f < DF; ++f) {
    of[f] = C_T(0.0);
  }

  // Softmax: invocation pair (2 r, 2 r + 1) owns row r, keys 16 * (lane % 2) + 0..15.
  const int row = lane / 2;
  const int half_ = lane % 2;
  const int qpos = pos.x + i0 + row;
  float m = NEG_INF;
  float l = 0.0;  // this invocation's part of the row's sum
#ifdef HAS_MASK
  const int m_col = mask_stride(0);
  const int m_base = bq * mask_stride(3) + h * mask_stride(2)
      + min(i0 + row, L - 1) * mask_stride(1);
#endif

  int t_lo = 0;
  int t_hi = (S + BN - 1) / BN;
#ifdef SKIP_MASKED_TILES
#ifdef CAUSAL
  t_hi = min(t_hi, (pos.x + min(i0 + BM, L) - 1) / BN + 1);
#endif
#ifdef WINDOW
  t_lo = max(t_lo, max(0, pos.x + i0 - pos.z + 1) / BN);
#endif
#endif
  if (lane < NSG) {
    sg_rescale[lane] = 0u;
  }
#if defined(MASK_BOOL) && defined(SKIP_MASKED_TILES)
  if (lane == 0) {
    tile_live[t_lo % 3] = 0u;
  }
#endif
  barrier();  // q fragments loaded before k_sh / v_sh are overwritten

  for (int t = t_lo; t < t_hi; ++t) {
    const int j0 = t * BN;
    const int jh = j0 + 16 * half_;  // this invocation's first key
#ifdef MASK_BOOL
    uint bits = 0u;
    [[unroll]] for (int u = 0; u < 16; ++u) {
      const int j = jh + u;
      if (j < S && int(mask_data[m_base + j * m_col]) != 0) {
        bits |= 1u << u;
      }
    }
#ifdef SKIP_MASKED_TILES
    if (bits != 0u) {
      atomicOr(tile_live[t % 3], 1u);
    }
    if (lane == 0) {
      tile_live[(t + 1) % 3] = 0u;
    }
    barrier();
    if (tile_live[t % 3] == 0u) {
      continue;
    }
#endif
#endif
    [[unroll]] for (int u = 0; u < BN * D_MAX / WG; ++u) {
      const int idx = u * WG + lane;
      const int jj = idx / D_MAX, e = idx % D_MAX;
      const int j = j0 + jj;
      k_sh[jj * KS + e] = float16_t((j < S && e < E) ? float(k_data[k_base + j * k_row + e])
                                                     : 0.0);
    }
    barrier();
    [[unroll]] for (int n = 0; n < BN / 16; ++n) {
      C_T sf = C_T(0.0);
      [[unroll]] for (int f = 0; f < DF; ++f) {
        B_T kb;
        coopMatLoad(kb, k_sh, 16 * n * KS + 16 * f, KS, gl_CooperativeMatrixLayoutColumnMajor);
        sf = coopMatMulAdd(qf[f], kb, sf);
      }
      sf = sf * scale.x;
      coopMatStore(sf, s_sh, 16 * sg * SS + 16 * n, SS, gl_CooperativeMatrixLayoutRowMajor);
    }
    barrier();  // S written, K read
    [[unroll]] for (int u = 0; u < BN * D_MAX / WG; ++u) {
      const int idx = u * WG + lane;
      const int jj = idx / D_MAX, e = idx % D_MAX;
      const int j = j0 + jj;
      v_sh[jj * KS + e] = float16_t((j < S && e < Ev) ? float(v_data[v_base + j * v_row + e])
                                                      : 0.0);
    }
    float sc[16];
    float tmax = NEG_INF;
    [[unroll]] for (int u = 0; u < 16; ++u) {
      const int j = jh + u;
      float x = j < S ? s_sh[row * SS + 16 * half_ + u] : NEG_INF;
#ifdef CAUSAL
      if (j > qpos) {
        x = NEG_INF;
      }
#endif
#ifdef WINDOW
      if (j <= qpos - pos.z) {
        x = NEG_INF;
      }
#endif
#ifdef MASK_BOOL
      if ((bits & (1u << u)) == 0u) {
        x = NEG_INF;
      }
#endif
#ifdef MASK_FLOAT
      if (j < S) {
        x += float(mask_data[m_base + j * m_col]);
      }
#endif
      sc[u] = x;
      tmax = max(tmax, x);
    }
    tmax = max(tmax, subgroupShuffleXor(tmax, 1u));
    float alpha = 1.0;
    if (tmax != NEG_INF) {
      const float m_new = max(m, tmax);
      alpha = (m_new == m) ? 1.0 : (m == NEG_INF ? 0.0 : exp(m - m_new));
      l *= alpha;
      [[unroll]] for (int u = 0; u < 16; ++u) {
        const float p = (sc[u] == NEG_INF) ? 0.0 : exp(sc[u] - m_new);
        l += p;
        p_sh[row * PS + 16 * half_ + u] = float16_t(p);
      }
      m = m_new;
    } else {
      [[unroll]] for (int u = 0; u < 16; ++u) {
        p_sh[row * PS + 16 * half_ + u] = float16_t(0.0);
      }
    }
    if (half_ == 0) {
      row_alpha[row] = alpha;
      if (alpha != 1.0) {
        atomicOr(sg_rescale[row / 16], 1u);
      }
    }
    barrier();  // V, P, the factors written
    if (sg_rescale[sg] != 0u) {  // uniform in the subgroup
      [[unroll]] for (int f = 0; f < DF; ++f) {
        coopMatStore(of[f], o_sh, 16 * sg * OS, OS, gl_CooperativeMatrixLayoutRowMajor);
        subgroupMemoryBarrierShared();
        subgroupBarrier();
        [[unroll]] for (int u = 0; u < 8; ++u) {
          const int e = sl + 32 * u;
          o_sh[(16 * sg + e / 16) * OS + e % 16] *= row_alpha[16 * sg + e / 16];
        }
        subgroupMemoryBarrierShared();
        subgroupBarrier();
        coopMatLoad(of[f], o_sh, 16 * sg * OS, OS, gl_CooperativeMatrixLayoutRowMajor);
        subgroupBarrier();
      }
    }
    A_T pf[BN / 16];
    [[unroll]] for (int n = 0; n < BN / 16; ++n) {
      coopMatLoad(pf[n], p_sh, 16 * sg * PS + 16 * n, PS, gl_CooperativeMatrixLayoutRowMajor);
    }
    [[unroll]] for (int f = 0; f < DF; ++f) {
      [[unroll]] for (int n = 0; n < BN / 16; ++n) {
        B_T vb;
        coopMatLoad(vb, v_sh, 16 * n * KS + 16 * f, KS, gl_CooperativeMatrixLayoutRowMajor);
        of[f] = coopMatMulAdd(pf[n], vb, of[f]);
      }
    }
    barrier();  // the flags read before the next tile's softmax clears and sets them
    if (lane < NSG) {
      sg_rescale[lane] = 0u;
    }
  }

  l += subgroupShuffleXor(l, 1u);
  if (half_ == 0) {
    row_l[row] = l;
  }
  barrier();
  const int o_base = bq * stride_at(out_meta, 3) + h * stride_at(out_meta, HEAD_DIM);
  const int o_row = stride_at(out_meta, SEQ_DIM);
  [[unroll]] for (int f = 0; f < DF; ++f) {
    coopMatStore(of[f], o_sh, 16 * sg * OS, OS, gl_CooperativeMatrixLayoutRowMajor);
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    [[unroll]] for (int u = 0; u < 8; ++u) {
      const int e = sl + 32 * u;
      const int r = 16 * sg + e / 16;
      const int i = i0 + r;
      const int c = 16 * f + e % 16;
      const float lr = row_l[r];
      if (i < L && c < Ev) {
        out_data[o_base + i * o_row + c] =
            OUT_STORE(lr > 0.0 ? o_sh[r * OS + e % 16] / lr : FULLY_MASKED);
      }
    }
    subgroupBarrier();
  }
}
