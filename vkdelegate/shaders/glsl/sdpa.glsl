#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"
#include "sdpa.h"

// Fused scaled dot-product attention, flash-attention style (kernels/attention.py; it
// runs prefill, >= 16 queries at head dims <= 128, on sdpa_tiled.glsl / sdpa_coopmat.glsl
// instead, and this kernel for decode, split-K and head dim 256):
//   out[b, h, i] = sum_j softmax_j(scale q[b, h, i] . k[b', h', j] + mask[.., i, j]) v[b', h', j]
// (q is multiplied by the scale as it is loaded, or the dot by it with Q_HALF)
// q [B, Hq, L, E], k [Bk, Hk, S, E], v [Bk, Hk, S, Ev], out [B, Hq, L, Ev] (metadata
// dims 3..0; a rank-3 tensor has B = 1); with SEQ_FIRST all four are [B, L|S, H, D]
// (ExecuTorch's llama ops). K/V heads and batch are shared by Hq / Hk (B / Bk)
// consecutive query heads (batches): grouped-query attention, and broadcasting when
// Hk (Bk) is 1.
//
// Positions: query row i sits at absolute position pos.x + i (pos.x: start_pos of a KV
// cache, else 0); only keys j < min(S, pos.y) exist. CAUSAL masks keys j > pos.x + i
// (ATen's top-left aligned tril when pos.x is 0), WINDOW masks keys j <= pos.x + i -
// pos.z (sliding window of pos.z keys, Mistral / Gemma: i - window < j). POS_TENSOR
// (vkdelegate.sdpa_at): the offset is start_data[0], a tensor read on the device (an LLM
// decode loop's position), instead of pos.x (sdpa.h's sdpa_offset clamps it).
//
// One workgroup of BLOCK_M invocations per (BLOCK_M query rows, key split, head,
// batch), or with split.y = pack > 1 (grouped-query attention, pack = Hq / Hk) per
// (BLOCK_M / pack positions of the pack query heads that share one K/V head, key
// split, K/V head, batch), so that each K/V tile serves pack heads; each invocation
// owns one query row (q and the output accumulator in
// registers, fp32). The keys are walked in tiles of BLOCK_N: the workgroup stages a
// tile of K and V in shared memory (fp32, zero past S and past E / Ev), every row
// scores it, and the online softmax (running max m, running sum l) rescales the
// accumulator once per tile. The L x S score matrix is never stored. The scores of a
// tile are one loop over its keys, separate from the softmax update, so that a
// cooperative-matrix Q.K^T can replace that loop.
//
// Exactness of the block-sparse early exit (issue 14): a tile whose scores are all
// -inf for a row changes nothing for that row (the update is skipped outright, not
// computed as a multiply by exp(0) and an add of 0), so a fully masked tile processed
// and a fully masked tile skipped give the same bits. SKIP_MASKED_TILES narrows the
// tile range to the tiles some row of the workgroup can see (CAUSAL: up to the last
// row's position; WINDOW: from the first row's window start) and, with MASK_BOOL
// (TILE_MAP), to the first and last tiles the mask's block map (sdpa.h,
// sdpa_tile_map.glsl, made for the workgroup's rows and packed heads) marks live for the
// workgroup, skipping the dead ones between; a row reads no mask bytes of a tile the
// map marks full.
//
// SPLIT_K (flash decoding, for few queries and many keys): pos.w is the number of key
// splits, split.x the tiles per split; workgroup x = query block * splits + split. A
// split writes its unnormalised (acc, m, l) per row to out_data (fp32 rows of D_MAX + 4:
// acc, then m and l) and sdpa_combine.glsl merges the splits.
//
// A row whose scores are all -inf (fully masked) gets FULLY_MASKED: 0 as ATen's SDPA
// gives (math and CPU flash paths), NaN for ET-VK's et_vk.sdpa (its reference is a plain
// softmax, 0 / 0).
//
// Defines: OUT_T, Q_T, K_T, V_T, OUT_STORE(v); D_MAX (a multiple of 4 >= E and Ev);
// D_STEP; BLOCK_M (the local size x), BLOCK_N (<= 32: a tile's mask bits are one uint);
// CAUSAL; WINDOW; MASK_BOOL or MASK_FLOAT with MASK_T (mask broadcast over every dim of
// size 1, rows indexed by i); FULLY_MASKED; SKIP_MASKED_TILES; TILE_MAP; SEQ_FIRST;
// SPLIT_K; POS_TENSOR with START_T (the start_pos tensor's storage type); KV_TEXEL
// (CPU drivers: K and V read as texel buffers, see below);
// Q_HALF (a float16 query kept as packed fp16 pairs, scaled after the dot: for head
// dims >= 128, where q and the accumulator of a row no longer fit a GPU's registers).
// The loops over a tile's keys are not unrolled (unrolled, llvmpipe's LLVM took
// minutes on the float-mask variant), so llvmpipe counts about 3 * BLOCK_N + 1
// iterations per tile against LOOP_LIMIT (attention.py checks it).

#define D4 (D_MAX / 4)
// The loops over the head dims: fully unrolled when D_STEP == D4 (q and the
// accumulator in registers); else D_STEP vec4s per iteration of a loop that is not
// unrolled, so the arrays stay in memory (on llvmpipe, LLVM took minutes to allocate
// 2 x 64 vec4 registers per invocation).
#if D_STEP < D4
#define D_LOOP [[dont_unroll]]
#else
#define D_LOOP [[unroll]]
#endif
#define FOR_D(c) D_LOOP for (int c##0 = 0; c##0 < D4; c##0 += D_STEP) \
  [[unroll]] for (int c = c##0; c < c##0 + D_STEP; ++c)

#ifdef KV_TEXEL
// KV_TEXEL (CPU drivers): K and V are uniform texel buffers (rgba16f / rgba32f, 4
// elements a texel), read by each row where the staged form reads its shared tile: no
// shared memory and no barrier (on llvmpipe a shared-memory access is a loop over the
// SIMD lanes and a barrier a coroutine switch). The same values in the same order: the
// same bits as the staged form. Needs E, Ev and the K/V strides multiples of 4.
#define K_AT(jj, c) ((4 * (c) < E) ? texelFetch(k_data, (k_base + (j0 + (jj)) * k_row) / 4 + (c)) \
                                   : vec4(0.0))
#define V_AT(jj, c) ((4 * (c) < Ev && j0 + (jj) < S)                                      \
                     ? texelFetch(v_data, (v_base + (j0 + (jj)) * v_row) / 4 + (c)) : vec4(0.0))
#else
shared vec4 k_tile[BLOCK_N * D4];
shared vec4 v_tile[BLOCK_N * D4];
#define K_AT(jj, c) k_tile[(jj) * D4 + (c)]
#define V_AT(jj, c) v_tile[(jj) * D4 + (c)]
#endif

void main() {
  const int lane = int(gl_LocalInvocationID.x);
  const int splits = max(1, pos.w);
  const int split_id = int(gl_WorkGroupID.x) % splits;
  // pack > 1: the workgroup's rows are the pack query heads of K/V head
  // gl_WorkGroupID.y (lane % pack) times BLOCK_M / pack query positions.
  const int pack = max(1, split.y);
  const int rows = BLOCK_M / pack;
  const int i0 = int(gl_WorkGroupID.x) / splits * rows;
  const int wy = int(gl_WorkGroupID.y);
  const int h = pack > 1 ? wy * pack + lane % pack : wy;
  const int bq = int(gl_WorkGroupID.z);
  SDPA_SIZES();  // sdpa.h: E, L, Hq, B, S, Ev, qoff
  if (i0 >= L || wy >= (pack > 1 ? Hq / pack : Hq) || bq >= B) {
    return;  // the whole workgroup leaves together (no barrier is skipped)
  }
  const int hk = pack > 1 ? wy : h / max(1, Hq / max(1, size_at(k_meta, HEAD_DIM)));
  const int bk = bq / max(1, B / max(1, size_at(k_meta, 3)));
  const int i = i0 + lane / pack;
  const bool row_ok = i < L;
  const int qpos = qoff + i;  // the row's absolute position
  const int k_base = bk * stride_at(k_meta, 3) + hk * stride_at(k_meta, HEAD_DIM);
  const int v_base = bk * stride_at(v_meta, 3) + hk * stride_at(v_meta, HEAD_DIM);
  const int k_row = stride_at(k_meta, SEQ_DIM);
  const int v_row = stride_at(v_meta, SEQ_DIM);
#ifdef HAS_MASK
  const int m_base = bq * mask_stride(3) + h * mask_stride(2)
      + min(i, L - 1) * mask_stride(1);
  const int m_col = mask_stride(0);
#endif

#ifdef Q_HALF
  uvec2 q[D4];  // fp16 pairs (packHalf2x16): exact for a float16 query, half the registers
#else
  vec4 q[D4];
#endif
  vec4 acc[D4];
  const int q_base = bq * stride_at(q_meta, 3) + h * stride_at(q_meta, HEAD_DIM)
      + min(i, L - 1) * stride_at(q_meta, SEQ_DIM);
  FOR_D(c) {
#ifdef Q_HALF
    const vec4 x = LOAD4(q_data, q_base, c, E);  // unscaled: the scale goes on the dot
    q[c] = uvec2(packHalf2x16(x.xy), packHalf2x16(x.zw));
#else
    q[c] = LOAD4(q_data, q_base, c, E) * scale.x;
#endif
    acc[c] = vec4(0.0);
  }
  float m = NEG_INF;  // running max of the row's scores
  float l = 0.0;      // running sum of exp(score - m)

  // This workgroup's tiles: its split's share of the keys.
  int t_lo = split_id * split.x;
  int t_hi = min((S + BLOCK_N - 1) / BLOCK_N, splits > 1 ? t_lo + split.x : 1 << 30);
#ifdef SKIP_MASKED_TILES
#ifdef CAUSAL
  // Keys past the workgroup's last row's position are masked for all of its rows.
  t_hi = min(t_hi, (max(-1, qoff + min(i0 + rows, L) - 1) + BLOCK_N) / BLOCK_N);
#endif
#ifdef WINDOW
  // Keys at or before the first row's position - window are masked for all rows.
  t_lo = max(t_lo, max(0, qoff + i0 - pos.z + 1) / BLOCK_N);
#endif
#endif
#ifdef TILE_MAP
  // The map's blocks are this workgroup's: rows i0 .. i0 + rows - 1 of the pack heads
  // from wy * pack (map_block is (rows, BLOCK_N, pack, -)).
  const int map_row = tile_map_row(bq, pack > 1 ? wy * pack : wy, i0,
                                   ((S + BLOCK_N - 1) / BLOCK_N + 31) / 32);
  tile_map_range(map_row, t_lo, t_hi);
#endif
  for (int t = t_lo; t < t_hi; ++t) {
    const int j0 = t * BLOCK_N;
#ifdef MASK_BOOL
    // The row's mask bits for this tile (bit jj: key j0 + jj is attended).
    uint bits = 0u;
#ifdef TILE_MAP
    const uvec2 tile = tile_map_bits(map_row, t);  // uniform in the workgroup
    if (tile.x == 0u) {
      continue;  // no row of the workgroup attends a key of the tile
    }
    if (tile.y != 0u) {
      bits = ~0u >> (32 - BLOCK_N);  // every key attended (keys past S: -inf below)
    } else
#endif
    if (row_ok) {
      [[dont_unroll]] for (int jj = 0; jj < BLOCK_N; ++jj) {
        const int j = j0 + jj;
        if (j < S && int(mask_data[m_base + j * m_col]) != 0) {
          bits |= 1u << jj;
        }
      }
    }
#endif
#ifndef KV_TEXEL
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
#endif
    if (row_ok) {
      float s[BLOCK_N];
      float tile_max = NEG_INF;
      [[dont_unroll]] for (int jj = 0; jj < BLOCK_N; ++jj) {
        const int j = j0 + jj;
        float sc = NEG_INF;
        if (j < S) {
          float d = 0.0;
          FOR_D(c) {
#ifdef Q_HALF
            d += dot(vec4(unpackHalf2x16(q[c].x), unpackHalf2x16(q[c].y)),
                     K_AT(jj, c));
#else
            d += dot(q[c], K_AT(jj, c));
#endif
          }
#ifdef Q_HALF
          sc = d * scale.x;
#else
          sc = d;
#endif
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
          if ((bits & (1u << jj)) == 0u) {
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
      // A tile fully masked for this row changes nothing (see the top): skipped.
      if (tile_max != NEG_INF) {
        const float m_new = max(m, tile_max);
        // m == -inf: acc and l are 0, any finite factor keeps them so.
        const float alpha = (m_new == m) ? 1.0 : (m == NEG_INF ? 0.0 : exp(m - m_new));
        l *= alpha;
        FOR_D(c) {
          acc[c] *= alpha;
        }
        [[dont_unroll]] for (int jj = 0; jj < BLOCK_N; ++jj) {
          const float p = (s[jj] == NEG_INF) ? 0.0 : exp(s[jj] - m_new);
          l += p;
          FOR_D(c) {
            acc[c] += p * V_AT(jj, c);
          }
        }
        m = m_new;
      }
    }
#ifndef KV_TEXEL
    barrier();  // every row has read the tile before the next one overwrites it
#endif
  }

  if (!row_ok) {
    return;
  }
#ifdef SPLIT_K
  // Partial row ((bq * Hq + h) * L + i) * splits + split_id of D_MAX + 4 floats.
  const int p_base = (((bq * Hq + h) * L + i) * splits + split_id) * (D_MAX + 4);
  FOR_D(c) {
    [[unroll]] for (int u = 0; u < 4; ++u) {
      out_data[p_base + 4 * c + u] = OUT_STORE(acc[c][u]);
    }
  }
  out_data[p_base + D_MAX] = OUT_STORE(m);
  out_data[p_base + D_MAX + 1] = OUT_STORE(l);
#else
  const int o_base = bq * stride_at(out_meta, 3) + h * stride_at(out_meta, HEAD_DIM)
      + i * stride_at(out_meta, SEQ_DIM);
  FOR_D(c) {
    [[unroll]] for (int u = 0; u < 4; ++u) {
      const int e = 4 * c + u;
      if (e < Ev) {
        out_data[o_base + e] = OUT_STORE(l > 0.0 ? acc[c][u] / l : FULLY_MASKED);
      }
    }
  }
#endif
}
