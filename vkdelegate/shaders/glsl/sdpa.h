// What the fused attention shaders (sdpa.glsl, sdpa_tiled.glsl, sdpa_coopmat.glsl)
// share: their bindings (q, k, v, the optional mask, out, their metadata and
// sdpa_block), the sequence / head dims of the two layouts (SEQ_FIRST: [B, L, H, D],
// ExecuTorch's llama ops), -inf, the zero-padded four-element load and the mask's
// broadcast strides. Include after common.h. sdpa.glsl's header documents the operation.
#ifndef VKDELEGATE_SDPA_H
#define VKDELEGATE_SDPA_H

TENSOR_OUT(out_data, OUT_T)
TENSOR_IN(q_data, Q_T)
#ifdef KV_TEXEL
TEXEL_IN(k_data)  // sdpa.glsl's KV_TEXEL (CPU drivers): 4 elements a texel
TEXEL_IN(v_data)
#else
TENSOR_IN(k_data, K_T)
TENSOR_IN(v_data, V_T)
#endif
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
#ifdef POS_TENSOR
// vkdelegate.sdpa_at: start_pos read on the device (an int64[1] stored as int32, or
// int32), in place of pos.x.
TENSOR_IN(start_data, START_T)
#endif
// scale.x: the score scale; pos: (query position offset (unused with POS_TENSOR), key
// count, window, splits);
// split: (tiles per split, query heads packed per workgroup).
PARAMS(sdpa_block) { vec4 scale; ivec4 pos; ivec4 split; };

#define NEG_INF uintBitsToFloat(0xff800000u)

#ifdef SEQ_FIRST
#define SEQ_DIM 2
#define HEAD_DIM 1
#else
#define SEQ_DIM 1
#define HEAD_DIM 2
#endif

// Four consecutive elements base + 4c .. base + 4c + 3 of buf, zero past n.
#define LOAD4(buf, base, c, n) vec4(                                 \
    (4 * (c) + 0 < (n)) ? float(buf[(base) + 4 * (c) + 0]) : 0.0,    \
    (4 * (c) + 1 < (n)) ? float(buf[(base) + 4 * (c) + 1]) : 0.0,    \
    (4 * (c) + 2 < (n)) ? float(buf[(base) + 4 * (c) + 2]) : 0.0,    \
    (4 * (c) + 3 < (n)) ? float(buf[(base) + 4 * (c) + 3]) : 0.0)

// Query row 0's absolute position: pos.x (a start_pos the host knows: 0, or a SymInt),
// or with POS_TENSOR start_data[0] clamped to [-L, S] (WINDOW: [-L, S + pos.z]). The
// clamp changes no output: a row at p < 0 sees no key, one at p >= S (without a window)
// every key, one at p >= S + window none, as at the clamped ends; it keeps every
// position sum within int32 and every tile bound within 0 .. S whatever the value is.
int sdpa_offset(int L, int S) {
#ifdef POS_TENSOR
#ifdef WINDOW
  const int hi = S + max(pos.z, 0);
#else
  const int hi = S;
#endif
  return clamp(int(start_data[0]), -max(L, 0), max(hi, 0));
#else
  return pos.x;
#endif
}

// Element stride of mask dim d for the broadcast: 0 where the mask has size 1.
#ifdef HAS_MASK
int mask_stride(int d) {
  return size_at(mask_meta, d) == 1 ? 0 : stride_at(mask_meta, d);
}
#endif

#ifdef TILE_MAP
// The block map of the boolean mask (MASK_BOOL with SKIP_MASKED_TILES), written by
// sdpa_tile_map.glsl before this dispatch (its header has the layout): per (mask
// plane, query block, key tile) a "live" bit (some row of the workgroup attends some
// key of the tile) and a "full" bit (every row attends every key, so no mask byte need
// be read). It replaces a per-tile vote (every invocation's mask bytes and a barrier
// for every tile, dead or not); skipping a dead tile stays exact (see each kernel).
TENSOR_IN(map_data, uint)
PARAMS(tile_map_block) { ivec4 map_block; ivec4 map_extent; };

// The first word of the map row of the workgroup at query row i0 of batch bq and
// (first) query head h, or -1 when that row would lie outside the map (then every tile
// counts as live and not full: the mask bytes decide, as without the map).
int tile_map_row(int bq, int h, int i0, int nwords) {
  const int hg = max(map_block.z, 1);
  const int hm = size_at(mask_meta, 2);
  const int pb = size_at(mask_meta, 3) == 1 ? 0 : bq;
  const int ph = hm == 1 ? 0 : h / hg;
  const int qb = i0 / max(map_block.x, 1);
  const int row = ((pb * ((hm + hg - 1) / hg) + ph) * map_extent.x + qb)
      * map_extent.y * 2;
  const bool ok = qb < map_extent.x && nwords <= map_extent.y
      && row >= 0 && row + 2 * nwords <= int(map_data.length());
  return ok ? row : -1;
}

// Narrows the tile range [t_lo, t_hi) to its first and last live tiles (map row
// `row`, uniform in the workgroup); no change without a map row.
void tile_map_range(int row, inout int t_lo, inout int t_hi) {
  if (row < 0 || t_lo >= t_hi) {
    return;
  }
  int first = t_hi;
  int last = t_lo - 1;
  for (int w = t_lo >> 5; w <= (t_hi - 1) >> 5; ++w) {
    uint live = map_data[row + 2 * w];
    if (w == t_lo >> 5) {
      live &= ~0u << uint(t_lo & 31);
    }
    if (w == (t_hi - 1) >> 5) {
      live &= ~0u >> uint(31 - ((t_hi - 1) & 31));
    }
    if (live != 0u) {
      first = min(first, 32 * w + findLSB(live));
      last = 32 * w + findMSB(live);
    }
  }
  t_lo = first;
  t_hi = max(last + 1, first);
}

// Tile t's bits: x = live, y = full (live and not full without a map row).
uvec2 tile_map_bits(int row, int t) {
  if (row < 0) {
    return uvec2(1u, 0u);
  }
  const uint s = uint(t & 31);
  return uvec2((map_data[row + 2 * (t >> 5)] >> s) & 1u,
               (map_data[row + 2 * (t >> 5) + 1] >> s) & 1u);
}
#endif

// The sizes every attention kernel reads: head dims E (queries, keys) and Ev (values),
// query rows L, query heads Hq, batches B, keys S (at most pos.y, the live cache
// length), and qoff, query row 0's absolute position (sdpa_offset).
#define SDPA_SIZES() \
  const int E = size_at(q_meta, 0); \
  const int L = size_at(q_meta, SEQ_DIM); \
  const int Hq = size_at(q_meta, HEAD_DIM); \
  const int B = size_at(q_meta, 3); \
  const int S = min(size_at(k_meta, SEQ_DIM), pos.y); \
  const int Ev = size_at(v_meta, 0); \
  const int qoff = sdpa_offset(L, S)

// The query block of the prefill kernels' workgroup (sdpa_coopmat.glsl,
// sdpa_coopmat_wg.glsl: grid x over blocks of `rows` query rows, y over the heads):
// declares i0, its first query row, and h, its head. HEAVY_FIRST (causal): the
// workgroups of one batch in order of decreasing work (the last query block of every
// head first), so that the dispatch's tail is the light blocks.
#ifdef HEAVY_FIRST
#define SDPA_QUERY_BLOCK(rows) \
  const int nb = int(gl_NumWorkGroups.x), nh = int(gl_NumWorkGroups.y); \
  const int lin = int(gl_WorkGroupID.x) + nb * int(gl_WorkGroupID.y); \
  const int i0 = (nb - 1 - lin / nh) * (rows); \
  const int h = lin % nh
#else
#define SDPA_QUERY_BLOCK(rows) \
  const int i0 = int(gl_WorkGroupID.x) * (rows); \
  const int h = int(gl_WorkGroupID.y)
#endif

// The element offsets of query head h of batch bq (of Hq heads, B batches) and of the
// K/V head and batch it reads (grouped-query heads h / (Hq / Hk), broadcast batches),
// and the row strides: declares hk, bk, q_base, k_base, v_base, q_row, k_row, v_row.
#define SDPA_BASES(h, bq, Hq, B) \
  const int hk = (h) / max(1, (Hq) / max(1, size_at(k_meta, HEAD_DIM))); \
  const int bk = (bq) / max(1, (B) / max(1, size_at(k_meta, 3))); \
  const int k_base = bk * stride_at(k_meta, 3) + hk * stride_at(k_meta, HEAD_DIM); \
  const int v_base = bk * stride_at(v_meta, 3) + hk * stride_at(v_meta, HEAD_DIM); \
  const int k_row = stride_at(k_meta, SEQ_DIM); \
  const int v_row = stride_at(v_meta, SEQ_DIM); \
  const int q_base = (bq) * stride_at(q_meta, 3) + (h) * stride_at(q_meta, HEAD_DIM); \
  const int q_row = stride_at(q_meta, SEQ_DIM)

#endif
