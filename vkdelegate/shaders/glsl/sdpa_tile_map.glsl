#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"

// The block map of a boolean attention mask (issue 14; kernels/attention_map.py), made
// once per run by this dispatch before the attention kernel that reads it, in place of
// that kernel's per-tile vote over the mask bytes: for each block of (map_block.x query
// rows, map_block.y keys) and each mask plane, a "live" bit (some element is true) and
// a "full" bit (every element is true), over exactly the rows, keys and heads one
// workgroup of the consuming kernel (sdpa_tiled.glsl, sdpa_coopmat.glsl, sdpa.glsl)
// covers, so the bits are exact: "live" false means every score of the tile is masked
// for every row of that workgroup; "full" that the kernel need read no mask byte.
//
// Planes: the mask's own batch and head dims (metadata dims 3 and 2; a dim of size 1 is
// broadcast, so a [1, 1, L, S] mask has one plane whatever the query's batch and heads
// are), its heads grouped map_block.z at a time (sdpa.glsl packs Hq / Hk query heads per
// workgroup). Rows: the query's L (q_meta), rows i0 .. min(i0 + map_block.x, L) - 1 of
// query block qb (row i reads mask row i, or row 0 where the mask's row dim is 1); keys:
// j < S = min(key count of k_meta, pos.y), as the consumer reads them.
//
// Layout (uint words, sized at load for the upper-bound shapes; after a resize this
// dispatch fills the part the kernel reads): word ((plane * map_extent.x + qb) *
// map_extent.y + w) * 2 holds the live bits of key tiles 32 w .. 32 w + 31 (bit b: tile
// 32 w + b), the next word their full bits (full implies live); plane = mask batch *
// ceil(Hm / map_block.z) + head group; map_extent.x is the largest query-block count,
// map_extent.y the largest word count of a map row (sdpa.h's tile_map_row reads it).
//
// One workgroup of WG invocations per (map word w, query block qb, plane): the word's 32
// tiles of map_block.y keys (a multiple of 4, <= 32) as 8 map_block.y groups of 4
// consecutive keys, 32 / map_block.y invocations per group taking every (32 /
// map_block.y)-th row (and head) of the block, so that a subgroup reads consecutive mask
// bytes; the bits are ORed together in shared memory.
//
// Defines: MASK_T (the boolean mask's storage type), SEQ_FIRST ([B, L, H, D] query and
// key layout, ExecuTorch's llama ops).

#define WG 256
#define RU 4  // rows per iteration of an invocation's row loop

TENSOR_OUT(map_data, uint)
TENSOR_IN(mask_data, MASK_T)
TENSOR_META(mask_meta)
TENSOR_META(q_meta)
TENSOR_META(k_meta)
// The attention node's parameters (sdpa.h): pos.y is the key count.
PARAMS(sdpa_block) { vec4 scale; ivec4 pos; ivec4 split; };
// block: (query rows, keys, heads per group, -) of a block; extent: (query blocks,
// words per map row) at the upper-bound shapes (the layout's strides).
PARAMS(tile_map_block) { ivec4 map_block; ivec4 map_extent; };

#ifdef SEQ_FIRST
#define SEQ_DIM 2
#else
#define SEQ_DIM 1
#endif

shared uint live_bits;  // tiles with some element true
shared uint part_bits;  // tiles with some element false

int mask_stride(int d) {
  return size_at(mask_meta, d) == 1 ? 0 : stride_at(mask_meta, d);
}

void main() {
  const int lane = int(gl_LocalInvocationID.x);
  const int w = int(gl_WorkGroupID.x);
  const int qb = int(gl_WorkGroupID.y);
  const int plane = int(gl_WorkGroupID.z);
  const int BR = max(map_block.x, 1);
  const int BK = clamp(map_block.y, 4, 32) & ~3;
  const int HG = max(map_block.z, 1);
  const int L = size_at(q_meta, SEQ_DIM);
  const int S = min(size_at(k_meta, SEQ_DIM), pos.y);
  const int Hm = size_at(mask_meta, 2);
  const int PH = (Hm + HG - 1) / HG;
  const int T = (S + BK - 1) / BK;
  const int o = ((plane * map_extent.x + qb) * map_extent.y + w) * 2;
  if (32 * w >= T || qb * BR >= L || plane >= size_at(mask_meta, 3) * PH
      || qb >= map_extent.x || w >= map_extent.y || o + 1 >= int(map_data.length())) {
    return;  // the whole workgroup leaves together; the consumer reads no such word
  }
  const int pb = plane / PH;
  const int h0 = (plane % PH) * HG;
  const int nh = min(h0 + HG, Hm) - h0;
  const int i0 = qb * BR;
  const int nr = min(i0 + BR, L) - i0;
  if (lane == 0) {
    live_bits = 0u;
    part_bits = 0u;
  }
  barrier();

  // Invocation lane: key group g (keys j .. j + 3), rows and heads r = sub, sub + step..
  const int step = 32 / BK;           // invocations per group: 1, 2 or 4 (BK 32, 16, 8)
  const int g = lane / step;          // 0 .. 8 BK - 1
  const int sub = lane % step;
  const int j = 32 * w * BK + 4 * g;
  const int m_col = mask_stride(0);
  const int m_row = mask_stride(1);
  const int m_plane = pb * mask_stride(3);
  if (g < 8 * BK && j < S) {
    const int nk = min(4, S - j);
    bool any = false;
    bool all = true;
    const int n = nr * nh;
    // RU rows an iteration: their loads are independent (in flight together on a GPU);
    // the loop ends early once both bits are known.
    for (int r0 = sub; r0 < n; r0 += RU * step) {
      [[unroll]] for (int ru = 0; ru < RU; ++ru) {
        const int r = r0 + ru * step;
        if (r < n) {
          const int base = m_plane + (h0 + r / nr) * mask_stride(2) + (i0 + r % nr) * m_row
              + j * m_col;
          [[unroll]] for (int u = 0; u < 4; ++u) {
            if (u < nk) {
              const bool on = int(mask_data[base + u * m_col]) != 0;
              any = any || on;
              all = all && on;
            }
          }
        }
      }
      if (any && !all) {
        break;
      }
    }
    const uint bit = 1u << uint(4 * g / BK);
    if (any) {
      atomicOr(live_bits, bit);
    }
    if (!all) {
      atomicOr(part_bits, bit);
    }
  }
  barrier();
  if (lane == 0) {
    map_data[o] = live_bits;
    map_data[o + 1] = live_bits & ~part_bits;
  }
}
