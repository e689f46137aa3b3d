#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"
#include "sdpa.h"

// Fused scaled dot-product attention for prefill, tiled flash attention (FlashAttention-2,
// Dao 2023) on portable Vulkan: the same operation, layouts, masks and positions as
// sdpa.glsl (read its header: q [B, Hq, L, E], k/v [Bk, Hk, S, E|Ev], SEQ_FIRST,
// grouped-query heads h / (Hq / Hk), pos = (query offset, key count, window, -), CAUSAL,
// WINDOW, MASK_BOOL / MASK_FLOAT, FULLY_MASKED, SKIP_MASKED_TILES), without split-K and
// grouped-query packing (decode keeps sdpa.glsl; kernels/attention.py picks).
//
// One workgroup of WG invocations per (BM query rows, head, batch). The BM x E query
// block is staged once in shared memory (fp32, times the scale); the keys are walked in
// tiles of BN. Per tile: (1) the tile's K rows go to shared memory (fp32; zero past S
// and E); (2) S = Q K^T, register-blocked: each invocation computes SR x SC scores (rows
// r0 + 8 ii, keys c0 + 8 jj: strided so that the 8 row / key groups of a subgroup hit
// different banks; the shared rows are padded by one vec4 for the same reason), masks
// them and writes them to shared memory; (3) the V rows replace K in shared memory while
// invocation r < BM runs row r's online softmax (running max m, sum l: p = exp(s - m),
// the row's rescale factor alpha and whether the tile is live for it to shared memory);
// (4) O += P V, register-blocked: each invocation owns PR rows x PC vec4 columns of the
// BM x Ev fp32 accumulator (rows p0 + 8 ii, columns c0 + 8 cc).
//
// Exactness of the block-sparse early exit (issue 14), as in sdpa.glsl: a tile whose
// scores are all -inf for a row leaves that row's m, l and accumulator untouched (no
// multiply by 1, no add of 0), so processing a fully masked tile and skipping it give
// the same bits; SKIP_MASKED_TILES narrows the tile range (CAUSAL, WINDOW) and with
// MASK_BOOL (TILE_MAP) to the first and last tiles the mask's block map (sdpa.h,
// sdpa_tile_map.glsl, made for BM x BN blocks) marks live for the workgroup, and skips
// the dead ones between; a tile the map marks full needs no mask bytes.
//
// Defines: as sdpa.glsl (OUT_T, Q_T, K_T, V_T, OUT_STORE, D_MAX, FULLY_MASKED, CAUSAL,
// WINDOW, MASK_*, MASK_T, SKIP_MASKED_TILES, TILE_MAP, SEQ_FIRST, POS_TENSOR, START_T)
// plus WG (the local size x, 64), BM (32), BN (keys per tile, a multiple of 8, <= 32),
// SR x SC = BM BN / WG scores and PR x PC = BM D_MAX / (4 WG) accumulator vec4s per
// invocation (attention.py: tiled_*).
// Shared memory: (BM + BN) (D_MAX / 4 + 1) vec4 + BM (BN / 4 + 1) vec4 + 2 BM floats.

#define D4 (D_MAX / 4)
#define DP (D4 + 1)       // padded shared row of Q / K / V, in vec4
#define BN4 (BN / 4)
#define PP (BN4 + 1)      // padded shared row of P, in vec4

shared vec4 q_tile[BM * DP];
shared vec4 kv_tile[BN * DP];  // K, then V, of the current tile
shared vec4 p_tile[BM * PP];   // scores, then probabilities
shared float row_alpha[BM];    // the row's rescale factor; < 0: tile dead for the row
shared float row_l[BM];

void main() {
  const int lane = int(gl_LocalInvocationID.x);
  const int i0 = int(gl_WorkGroupID.x) * BM;
  const int h = int(gl_WorkGroupID.y);
  const int bq = int(gl_WorkGroupID.z);
  SDPA_SIZES();  // sdpa.h: E, L, Hq, B, S, Ev, qoff
  if (i0 >= L || h >= Hq || bq >= B) {
    return;  // the whole workgroup leaves together
  }
  SDPA_BASES(h, bq, Hq, B);

  // Stage the query block, scaled (rows past L repeat row L - 1; never stored).
  [[unroll]] for (int u = 0; u < BM * D4 / WG; ++u) {
    const int idx = u * WG + lane;
    const int r = idx / D4, c = idx % D4;
    q_tile[r * DP + c] = LOAD4(q_data, q_base + min(i0 + r, L - 1) * q_row, c, E) * scale.x;
  }

  // Score block of this invocation: rows s_r + 8 ii, keys s_c + 8 jj of the tile.
  const int s_r = lane / 8, s_c = lane % 8;
  // Accumulator block: rows a_r + 8 ii, vec4 columns a_c + 8 cc.
  const int a_r = lane / 8, a_c = lane % 8;
  vec4 acc[PR][PC];
  [[unroll]] for (int ii = 0; ii < PR; ++ii) {
    [[unroll]] for (int cc = 0; cc < PC; ++cc) {
      acc[ii][cc] = vec4(0.0);
    }
  }
  // Row lane's softmax state (lanes < BM).
  float m = NEG_INF;
  float l = 0.0;
#ifdef HAS_MASK
  const int m_col = mask_stride(0);
  int m_base[SR];
  [[unroll]] for (int ii = 0; ii < SR; ++ii) {
    m_base[ii] = bq * mask_stride(3) + h * mask_stride(2)
        + min(i0 + s_r + 8 * ii, L - 1) * mask_stride(1);
  }
#endif

  int t_lo = 0;
  int t_hi = (S + BN - 1) / BN;
#ifdef SKIP_MASKED_TILES
#ifdef CAUSAL
  t_hi = min(t_hi, (max(-1, qoff + min(i0 + BM, L) - 1) + BN) / BN);
#endif
#ifdef WINDOW
  t_lo = max(t_lo, max(0, qoff + i0 - pos.z + 1) / BN);
#endif
#endif
#ifdef TILE_MAP
  const int map_row = tile_map_row(bq, h, i0, ((S + BN - 1) / BN + 31) / 32);
  tile_map_range(map_row, t_lo, t_hi);
#endif
  barrier();  // q_tile written

  for (int t = t_lo; t < t_hi; ++t) {
    const int j0 = t * BN;
#ifdef MASK_BOOL
    uint bits = 0u;  // bit ii * SC + jj: (row s_r + 8 ii, key s_c + 8 jj) attended
#ifdef TILE_MAP
    const uvec2 tile = tile_map_bits(map_row, t);  // uniform in the workgroup
    if (tile.x == 0u) {
      continue;  // no row of the workgroup attends a key of the tile
    }
    if (tile.y != 0u) {
      bits = (1u << (SR * SC)) - 1u;  // every key attended (keys past S: -inf below)
    } else
#endif
    {
      [[unroll]] for (int ii = 0; ii < SR; ++ii) {
        [[unroll]] for (int jj = 0; jj < SC; ++jj) {
          const int j = j0 + s_c + 8 * jj;
          if (j < S && int(mask_data[m_base[ii] + j * m_col]) != 0) {
            bits |= 1u << (ii * SC + jj);
          }
        }
      }
    }
#endif
    // (1) K rows of the tile.
    [[unroll]] for (int r = 0; r < (BN * D4 + WG - 1) / WG; ++r) {
      const int idx = r * WG + lane;
      const int jj = min(idx / D4, BN - 1), c = idx % D4;
      const int j = j0 + jj;
      if (idx < BN * D4) {
        kv_tile[jj * DP + c] = j < S ? LOAD4(k_data, k_base + j * k_row, c, E) : vec4(0.0);
      }
    }
    barrier();
    // (2) Scores.
    float s[SR][SC];
    [[unroll]] for (int ii = 0; ii < SR; ++ii) {
      [[unroll]] for (int jj = 0; jj < SC; ++jj) {
        s[ii][jj] = 0.0;
      }
    }
    [[dont_unroll]] for (int c = 0; c < D4; ++c) {
      vec4 qv[SR];
      [[unroll]] for (int ii = 0; ii < SR; ++ii) {
        qv[ii] = q_tile[(s_r + 8 * ii) * DP + c];
      }
      [[unroll]] for (int jj = 0; jj < SC; ++jj) {
        const vec4 kv = kv_tile[(s_c + 8 * jj) * DP + c];
        [[unroll]] for (int ii = 0; ii < SR; ++ii) {
          s[ii][jj] += dot(qv[ii], kv);
        }
      }
    }
    [[unroll]] for (int ii = 0; ii < SR; ++ii) {
      const int qpos = qoff + i0 + s_r + 8 * ii;
      [[unroll]] for (int jj = 0; jj < SC; ++jj) {
        const int j = j0 + s_c + 8 * jj;
        float sc = j < S ? s[ii][jj] : NEG_INF;
#ifdef CAUSAL
        if (j > qpos) {
          sc = NEG_INF;
        }
#endif
#ifdef WINDOW
        if (j <= qpos - pos.z) {
          sc = NEG_INF;
        }
#endif
#ifdef MASK_BOOL
        if ((bits & (1u << (ii * SC + jj))) == 0u) {
          sc = NEG_INF;
        }
#endif
#ifdef MASK_FLOAT
        if (j < S) {
          sc += float(mask_data[m_base[ii] + j * m_col]);
        }
#endif
        const int kk = s_c + 8 * jj;
        p_tile[(s_r + 8 * ii) * PP + kk / 4][kk % 4] = sc;
      }
    }
    barrier();  // scores written, K read
    // (3) V rows of the tile; row lane's online softmax.
    [[unroll]] for (int r = 0; r < (BN * D4 + WG - 1) / WG; ++r) {
      const int idx = r * WG + lane;
      const int jj = min(idx / D4, BN - 1), c = idx % D4;
      const int j = j0 + jj;
      if (idx < BN * D4) {
        kv_tile[jj * DP + c] = j < S ? LOAD4(v_data, v_base + j * v_row, c, Ev) : vec4(0.0);
      }
    }
    if (lane < BM) {
      float tile_max = NEG_INF;
      [[dont_unroll]] for (int q4 = 0; q4 < BN4; ++q4) {
        const vec4 x = p_tile[lane * PP + q4];
        tile_max = max(tile_max, max(max(x.x, x.y), max(x.z, x.w)));
      }
      float alpha = -1.0;  // dead: the tile changes nothing for this row
      if (tile_max != NEG_INF) {
        const float m_new = max(m, tile_max);
        alpha = (m_new == m) ? 1.0 : (m == NEG_INF ? 0.0 : exp(m - m_new));
        l *= alpha;
        [[dont_unroll]] for (int q4 = 0; q4 < BN4; ++q4) {
          const vec4 x = p_tile[lane * PP + q4];
          vec4 p;
          [[unroll]] for (int u = 0; u < 4; ++u) {
            p[u] = (x[u] == NEG_INF) ? 0.0 : exp(x[u] - m_new);
            l += p[u];
          }
          p_tile[lane * PP + q4] = p;
        }
        m = m_new;
      }
      row_alpha[lane] = alpha;
    }
    barrier();  // V and the probabilities written
    // (4) O += P V.
    float alpha[PR];
    [[unroll]] for (int ii = 0; ii < PR; ++ii) {
      alpha[ii] = row_alpha[a_r + 8 * ii];
      if (alpha[ii] >= 0.0 && alpha[ii] != 1.0) {
        [[unroll]] for (int cc = 0; cc < PC; ++cc) {
          acc[ii][cc] *= alpha[ii];
        }
      }
    }
    [[dont_unroll]] for (int q4 = 0; q4 < BN4; ++q4) {
      vec4 p[PR];
      [[unroll]] for (int ii = 0; ii < PR; ++ii) {
        p[ii] = p_tile[(a_r + 8 * ii) * PP + q4];
      }
      [[unroll]] for (int u = 0; u < 4; ++u) {
        [[unroll]] for (int cc = 0; cc < PC; ++cc) {
          const vec4 vv = kv_tile[(4 * q4 + u) * DP + a_c + 8 * cc];
          [[unroll]] for (int ii = 0; ii < PR; ++ii) {
            if (alpha[ii] >= 0.0) {
              acc[ii][cc] += p[ii][u] * vv;
            }
          }
        }
      }
    }
    barrier();  // V and P read before the next tile overwrites them
  }

  if (lane < BM) {
    row_l[lane] = l;
  }
  barrier();
  const int o_base = bq * stride_at(out_meta, 3) + h * stride_at(out_meta, HEAD_DIM);
  const int o_row = stride_at(out_meta, SEQ_DIM);
  [[unroll]] for (int ii = 0; ii < PR; ++ii) {
    const int r = a_r + 8 * ii;
    const int i = i0 + r;
    const float lr = row_l[r];
    if (i < L) {
      [[unroll]] for (int cc = 0; cc < PC; ++cc) {
        [[unroll]] for (int u = 0; u < 4; ++u) {
          const int e = 4 * (a_c + 8 * cc) + u;
          if (e < Ev) {
            out_data[o_base + i * o_row + e] = OUT_STORE(lr > 0.0 ? acc[ii][cc][u] / lr
                                                                   : FULLY_MASKED);
          }
        }
      }
    }
  }
}
