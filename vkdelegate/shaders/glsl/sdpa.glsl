#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"

// Fused scaled dot-product attention, flash-attention style (ops/families/sdpa.py):
//   out[b, h, i] = sum_j softmax_j(scale q[b, h, i] . k[b', h', j] + mask[.., i, j]) v[b', h', j]
// (q is multiplied by the scale as it is loaded)
// q [B, Hq, L, E], k [Bk, Hk, S, E], v [Bk, Hk, S, Ev], out [B, Hq, L, Ev] (metadata
// dims 3..0; a rank-3 tensor has B = 1). K/V heads and batch are shared by Hq / Hk
// (B / Bk) consecutive query heads (batches): grouped-query attention, and broadcasting
// when Hk (Bk) is 1.
//
// One workgroup of BLOCK_M invocations per (BLOCK_M query rows, head, batch); each
// invocation owns one query row (q and the output accumulator in registers, fp32).
// The keys are walked in tiles of BLOCK_N: the workgroup stages a tile of K and V in
// shared memory (fp32, zero past S and past E / Ev), every row scores it, and the
// online softmax (running max m, running sum l) rescales the accumulator once per
// tile. The L x S score matrix is never stored.
//
// Exactness of a fully masked tile: its scores are all -inf, so m is unchanged, the
// rescale factor is exactly 1 (taken when m_new == m, never computed with exp) and every
// p is exactly 0 (never exp(-inf)): skipping the tile gives the same bits. The causal
// variant with SKIP_MASKED_TILES ends the tile loop after the workgroup's last row
// (issue 14's block-sparse early exit; other masks may add a per-tile test here).
//
// A row whose scores are all -inf (fully masked) gets FULLY_MASKED: 0 as ATen's SDPA
// gives (math and CPU flash paths), NaN for ET-VK's et_vk.sdpa (its reference is a plain
// softmax, 0 / 0).
//
// Defines: OUT_T, Q_T, K_T, V_T, OUT_STORE(v); D_MAX (a multiple of 4 >= E and Ev);
// BLOCK_M (the local size x), BLOCK_N; CAUSAL (ATen's top-left aligned tril: key j is
// seen by row i when j <= i); MASK_BOOL or MASK_FLOAT with MASK_T (mask broadcast over
// every dim of size 1); FULLY_MASKED; SKIP_MASKED_TILES.
// The loops over E and Ev are [[unroll]]ed; the two loops over a tile's keys are not
// (unrolled, llvmpipe's LLVM took minutes on the float-mask variant), so llvmpipe counts
// 2 * BLOCK_N + 1 iterations per tile against LOOP_LIMIT (sdpa.py checks it).

TENSOR_OUT(out_data, OUT_T)
TENSOR_IN(q_data, Q_T)
TENSOR_IN(k_data, K_T)
TENSOR_IN(v_data, V_T)
#if defined(MASK_BOOL) || defined(MASK_FLOAT)
#define HAS_MASK 1
TENSOR_IN(mask_data, MASK_T)
#endif
TENSOR_META(out_meta)
TENSOR_META(q_meta)
TENSOR_META(k_meta)
TENSOR_META(v_meta)
#ifdef HAS_MASK
TENSOR_META(mask_meta)
#endif
PARAMS(sdpa_block) { vec4 scale; };  // x: the score scale

#define D4 (D_MAX / 4)
// The loops over the head dims: fully unrolled up to D_MAX 64 (q and the accumulator in
// registers); past that D_STEP vec4s per iteration of a loop that is not unrolled, so
// the arrays stay in memory (on llvmpipe, LLVM took minutes to allocate 2 x 64 vec4
// registers per invocation) and llvmpipe counts D4 / D_STEP iterations per use.
#if D_STEP < D4
#define D_LOOP [[dont_unroll]]
#else
#define D_LOOP [[unroll]]
#endif
#define NEG_INF uintBitsToFloat(0xff800000u)

shared vec4 k_tile[BLOCK_N * D4];
shared vec4 v_tile[BLOCK_N * D4];

// Four consecutive elements base + 4c .. base + 4c + 3 of buf, zero past n.
#define LOAD4(buf, base, c, n) vec4(                                 \
    (4 * (c) + 0 < (n)) ? float(buf[(base) + 4 * (c) + 0]) : 0.0,    \
    (4 * (c) + 1 < (n)) ? float(buf[(base) + 4 * (c) + 1]) : 0.0,    \
    (4 * (c) + 2 < (n)) ? float(buf[(base) + 4 * (c) + 2]) : 0.0,    \
    (4 * (c) + 3 < (n)) ? float(buf[(base) + 4 * (c) + 3]) : 0.0)

#ifdef HAS_MASK
// Element stride of mask dim d for the broadcast: 0 where the mask has size 1.
int mask_stride(int d) {
  return size_at(mask_meta, d) == 1 ? 0 : stride_at(mask_meta, d);
}
#endif

void main() {
  const int lane = int(gl_LocalInvocationID.x);
  const int i0 = int(gl_WorkGroupID.x) * BLOCK_M;
  const int h = int(gl_WorkGroupID.y);
  const int bq = int(gl_WorkGroupID.z);
  const int E = size_at(q_meta, 0);
  const int L = size_at(q_meta, 1);
  const int Hq = size_at(q_meta, 2);
  const int B = size_at(q_meta, 3);
  const int S = size_at(k_meta, 1);
  const int Ev = size_at(v_meta, 0);
  if (i0 >= L || h >= Hq || bq >= B) {
    return;  // the whole workgroup leaves together (no barrier is skipped)
  }
  const int hk = h / max(1, Hq / max(1, size_at(k_meta, 2)));
  const int bk = bq / max(1, B / max(1, size_at(k_meta, 3)));
  const int i = i0 + lane;
  const bool row_ok = i < L;
  const int k_base = bk * stride_at(k_meta, 3) + hk * stride_at(k_meta, 2);
  const int v_base = bk * stride_at(v_meta, 3) + hk * stride_at(v_meta, 2);
  const int k_row = stride_at(k_meta, 1);
  const int v_row = stride_at(v_meta, 1);
#ifdef HAS_MASK
  const int m_base = bq * mask_stride(3) + h * mask_stride(2)
      + min(i, L - 1) * mask_stride(1);
  const int m_col = mask_stride(0);
#endif

  vec4 q[D4];
  vec4 acc[D4];
  const int q_base = bq * stride_at(q_meta, 3) + h * stride_at(q_meta, 2)
      + min(i, L - 1) * stride_at(q_meta, 1);
  D_LOOP for (int c0 = 0; c0 < D4; c0 += D_STEP)
  [[unroll]] for (int u4 = 0; u4 < D_STEP; ++u4) {
    const int c = c0 + u4;
    q[c] = LOAD4(q_data, q_base, c, E) * scale.x;
    acc[c] = vec4(0.0);
  }
  float m = NEG_INF;  // running max of the row's scores
  float l = 0.0;      // running sum of exp(score - m)

  int n_tiles = (S + BLOCK_N - 1) / BLOCK_N;
#if defined(CAUSAL) && defined(SKIP_MASKED_TILES)
  // Keys past the workgroup's last row are masked for all of its rows.
  n_tiles = min(n_tiles, (min(i0 + BLOCK_M, L) - 1) / BLOCK_N + 1);
#endif
  for (int t = 0; t < n_tiles; ++t) {
    const int j0 = t * BLOCK_N;
    // Stage the tile: BLOCK_N * D4 vec4s of K and of V, spread over the workgroup.
    [[unroll]] for (int r = 0; r < (BLOCK_N * D4 + BLOCK_M - 1) / BLOCK_M; ++r) {
      const int idx = r * BLOCK_M + lane;
      if (idx < BLOCK_N * D4) {
        const int j = j0 + idx / D4;
        const int c = idx % D4;
        const bool in_s = j < S;
        k_tile[idx] = in_s ? LOAD4(k_data, k_base + j * k_row, c, E) : vec4(0.0);
        v_tile[idx] = in_s ? LOAD4(v_data, v_base + j * v_row, c, Ev) : vec4(0.0);
      }
    }
    barrier();
    if (row_ok) {
      float s[BLOCK_N];
      float tile_max = NEG_INF;
      [[dont_unroll]] for (int jj = 0; jj < BLOCK_N; ++jj) {
        const int j = j0 + jj;
        float sc = NEG_INF;
        if (j < S) {
          float d = 0.0;
          D_LOOP for (int c0 = 0; c0 < D4; c0 += D_STEP)
  [[unroll]] for (int u4 = 0; u4 < D_STEP; ++u4) {
    const int c = c0 + u4;
            d += dot(q[c], k_tile[jj * D4 + c]);
          }
          sc = d;
#ifdef CAUSAL
          if (j > i) {
            sc = NEG_INF;
          }
#endif
#ifdef MASK_BOOL
          if (int(mask_data[m_base + j * m_col]) == 0) {
            sc = NEG_INF;
          }
#endif
#ifdef MASK_FLOAT
          sc += float(mask_data[m_base + j * m_col]);
#endif
        }
        s[jj] = sc;
        tile_max = max(tile_max, sc);
      }
      const float m_new = max(m, tile_max);
      if (m_new != NEG_INF) {  // else every score so far is -inf: nothing to add
        // m == -inf: acc and l are 0, any finite factor keeps them so.
        const float alpha = (m_new == m) ? 1.0 : (m == NEG_INF ? 0.0 : exp(m - m_new));
        l *= alpha;
        D_LOOP for (int c0 = 0; c0 < D4; c0 += D_STEP)
  [[unroll]] for (int u4 = 0; u4 < D_STEP; ++u4) {
    const int c = c0 + u4;
          acc[c] *= alpha;
        }
        [[dont_unroll]] for (int jj = 0; jj < BLOCK_N; ++jj) {
          const float p = (s[jj] == NEG_INF) ? 0.0 : exp(s[jj] - m_new);
          l += p;
          D_LOOP for (int c0 = 0; c0 < D4; c0 += D_STEP)
  [[unroll]] for (int u4 = 0; u4 < D_STEP; ++u4) {
    const int c = c0 + u4;
            acc[c] += p * v_tile[jj * D4 + c];
          }
        }
        m = m_new;
      }
    }
    barrier();  // every row has read the tile before the next one overwrites it
  }

  if (!row_ok) {
    return;
  }
  const int o_base = bq * stride_at(out_meta, 3) + h * stride_at(out_meta, 2)
      + i * stride_at(out_meta, 1);
  D_LOOP for (int c0 = 0; c0 < D4; c0 += D_STEP)
  [[unroll]] for (int u4 = 0; u4 < D_STEP; ++u4) {
    const int c = c0 + u4;
    [[unroll]] for (int u = 0; u < 4; ++u) {
      const int e = 4 * c + u;
      if (e < Ev) {
        out_data[o_base + e] = OUT_STORE(l > 0.0 ? acc[c][u] / l : FULLY_MASKED);
      }
    }
  }
}
