#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#include "common.h"
#include "sdpa.h"

// Decode attention for ONE query row per workgroup, with no barrier in the key loop
// (kernels/attention_decode.py's lanes form; sdpa.glsl's header documents the
// operation: layouts, positions, CAUSAL / WINDOW / masks, FULLY_MASKED, SPLIT_K's
// partial rows for sdpa_combine.glsl).
//
// sdpa_decode.glsl spreads a chunk's keys over the workgroup and then its head dims
// over the workgroup again for P V, through shared memory: three barriers a chunk and a
// final sum over the key groups, a long chain of dependent steps for a decode step's
// few keys. Here a CLUSTER of LANES adjacent invocations owns a key at a time, and
// keeps its own online softmax over the keys it owns:
//   lane i of a cluster holds the vec4s e = i + LANES c (c < DL4 = D_MAX / 4 / LANES)
//   of the query (scaled), of each key's K row and V row and of its output
//   accumulator; a key's score is the lanes' partial dot products added up by
//   subgroupShuffleXor within the cluster (so LANES <= the subgroup size, which the
//   host checks against the device's minimum);
//   the workgroup's NC = WG / LANES clusters take the keys of a chunk of NC * KB keys
//   as key ch * NC * KB + b * NC + cluster (b < KB): the KB keys' K and V loads are
//   issued together, then their scores, then one rescale of the cluster's state
//   (m, l, acc) by the KB keys' max;
//   after the last chunk the clusters' states are merged by the log-sum-exp rule:
//   within a subgroup by subgroupShuffleXor (strides LANES .. subgroup size / 2), then
//   the subgroups' through shared memory (the only barrier) by the first cluster,
//   which writes the row (acc / l) or, with SPLIT_K, the split's (acc, m, l).
// Exactness of the early exit (SKIP_MASKED_TILES: chunks past the row's position
// (CAUSAL) or before its window (WINDOW) are not visited): the keys of a chunk are
// assigned to clusters and batches by their index alone, a masked key is selected away
// (never multiplied in), and a batch with no live key leaves its cluster's state
// untouched, so a fully masked chunk visited and one skipped give the same bits.
// A key masked for the row is not read.
// LAST_MERGE (not with SPLIT_K; pos.w > 1 splits): each split writes its (acc, m, l) to
// part_data (rows of D_MAX + 4, as SPLIT_K's) and counts itself in count_data[b * Hq +
// h] (atomicAdd after a device-scope memory barrier); the split that counts last
// resets the counter to 0 for the next dispatch, merges every split's row in split
// order (so the result does not depend on which split ended last) and writes the
// output row: the flash-decoding merge without sdpa_combine.glsl's second dispatch.
// count_data must hold zeros before the first dispatch.
// Defines: sdpa.glsl's OUT_T, Q_T, K_T, V_T, OUT_STORE(v), D_MAX, CAUSAL, WINDOW,
// MASK_BOOL / MASK_FLOAT (MASK_T), FULLY_MASKED, SKIP_MASKED_TILES, SEQ_FIRST, SPLIT_K,
// POS_TENSOR (START_T); K4_T, V4_T (4-element storage types of K and V); WG (local
// size x, a multiple of the subgroup size); LANES (a power of two, D_MAX / 4 a multiple
// of it); KB (keys per cluster per chunk); MAX_SG (the most subgroups a workgroup can
// have: WG / the device's minimum subgroup size).
// Grid: x = splits * WG (split = workgroup x), y = query heads, z = batch.

#define D4 (D_MAX / 4)
#define DL4 (D4 / LANES)    // vec4s of the head dim per lane
#define NC (WG / LANES)     // clusters per workgroup
#define CHUNK (NC * KB)     // keys per chunk

layout(set = 0, binding = BINDING_k_data) readonly buffer k4_buffer { K4_T k4_data[]; };
layout(set = 0, binding = BINDING_v_data) readonly buffer v4_buffer { V4_T v4_data[]; };

// The subgroups' merged states: acc vec4 e of subgroup s at red_acc[s * D4 + e]; m, l.
shared vec4 red_acc[MAX_SG * D4];
shared vec2 red_ml[MAX_SG];

#ifdef LAST_MERGE
#ifdef SPLIT_K
#error "LAST_MERGE merges the splits itself: not with SPLIT_K"
#endif
#include "last_split.h"
#endif

// A split's row (SPLIT_K, LAST_MERGE) at offset base of buffer buf, this lane's share
// of it: its acc vec4s, and (lane 0) m and l at D_MAX and D_MAX + 1, each stored
// through STORE (the buffer's conversion).
#define STORE_SPLIT_ROW(buf, base, STORE)                                 \
  [[unroll]] for (int c = 0; c < DL4; ++c) {                              \
    [[unroll]] for (int u = 0; u < 4; ++u) {                              \
      buf[(base) + 4 * (lane + LANES * c) + u] = STORE(acc[c][u]);        \
    }                                                                     \
  }                                                                       \
  if (lane == 0) {                                                        \
    buf[(base) + D_MAX] = STORE(m);                                       \
    buf[(base) + D_MAX + 1] = STORE(l);                                   \
  }
#define AS_FLOAT(v) (v)

// Merges state (m2, l2, acc2) into (m, l, acc) by the log-sum-exp rule; a state with
// m = -inf (no key seen) has l = 0 and acc = 0 and contributes nothing.
void merge(inout float m, inout float l, inout vec4 acc[DL4], float m2, float l2,
           vec4 acc2[DL4]) {
  const float big = max(m, m2);
  if (big == NEG_INF) {
    return;  // neither has seen a key
  }
  const float a = m == big ? 1.0 : (m == NEG_INF ? 0.0 : exp(m - big));
  const float b = m2 == big ? 1.0 : (m2 == NEG_INF ? 0.0 : exp(m2 - big));
  [[unroll]] for (int c = 0; c < DL4; ++c) {
    acc[c] = acc[c] * a + acc2[c] * b;
  }
  l = l * a + l2 * b;
  m = big;
}

void main() {
  const int t = int(gl_LocalInvocationID.x);
  const int lane = t % LANES;
  const int cl = t / LANES;
  const int splits = max(1, pos.w);
  const int split_id = int(gl_WorkGroupID.x);
  const int h = int(gl_WorkGroupID.y);
  const int bq = int(gl_WorkGroupID.z);
  SDPA_SIZES();  // sdpa.h: E, L, Hq, B, S, Ev, qoff
  if (h >= Hq || bq >= B || L != 1) {
    return;  // the whole workgroup leaves together (no barrier is skipped)
  }
  SDPA_BASES(h, bq, Hq, B);
  const bool vec = E % 4 == 0 && Ev % 4 == 0 && k_base % 4 == 0 && v_base % 4 == 0
      && k_row % 4 == 0 && v_row % 4 == 0;  // uniform
#ifdef HAS_MASK
  const int m_base = bq * mask_stride(3) + h * mask_stride(2);
  const int m_col = mask_stride(0);
#endif

  vec4 q[DL4];  // this lane's vec4s of the query, scaled
  [[unroll]] for (int c = 0; c < DL4; ++c) {
    q[c] = LOAD4(q_data, q_base, lane + LANES * c, E) * scale.x;
  }
  float m = NEG_INF;  // the cluster's running max (the same in its lanes)
  float l = 0.0;      // its running sum of p
  vec4 acc[DL4];      // its sum of p * v over this lane's vec4s
  [[unroll]] for (int c = 0; c < DL4; ++c) {
    acc[c] = vec4(0.0);
  }

  const int chunks = (S + CHUNK - 1) / CHUNK;
  int ch_lo = splits > 1 ? split_id * split.x : 0;
  int ch_hi = splits > 1 ? min(chunks, ch_lo + split.x) : chunks;
#ifdef SKIP_MASKED_TILES
#ifdef CAUSAL
  ch_hi = min(ch_hi, (max(-1, qoff) + CHUNK) / CHUNK);  // keys past the row's position
#endif
#ifdef WINDOW
  ch_lo = max(ch_lo, max(0, qoff - pos.z + 1) / CHUNK);  // before the row's window
#endif
#endif
  for (int ch = ch_lo; ch < ch_hi; ++ch) {
    bool live[KB];
    vec4 kv[KB][DL4];
    vec4 vv[KB][DL4];
    [[unroll]] for (int b = 0; b < KB; ++b) {
      const int j = ch * CHUNK + b * NC + cl;
      bool on = j < S;
#ifdef CAUSAL
      on = on && j <= qoff;
#endif
#ifdef WINDOW
      on = on && j > qoff - pos.z;
#endif
#ifdef MASK_BOOL
      if (on) {
        on = int(mask_data[m_base + j * m_col]) != 0;
      }
#endif
      live[b] = on;
      const int kb = k_base + j * k_row;
      const int vb = v_base + j * v_row;
      [[unroll]] for (int c = 0; c < DL4; ++c) {
        const int e = lane + LANES * c;
        kv[b][c] = vec4(0.0);
        vv[b][c] = vec4(0.0);
        if (on) {  // a masked key is not read
          if (vec) {
            kv[b][c] = 4 * e < E ? vec4(k4_data[kb / 4 + e]) : vec4(0.0);
            vv[b][c] = 4 * e < Ev ? vec4(v4_data[vb / 4 + e]) : vec4(0.0);
          } else {
            kv[b][c] = LOAD4(k_data, kb, e, E);
            vv[b][c] = LOAD4(v_data, vb, e, Ev);
          }
        }
      }
    }
    float s[KB];
    [[unroll]] for (int b = 0; b < KB; ++b) {
      float d = 0.0;
      [[unroll]] for (int c = 0; c < DL4; ++c) {
        d += dot(q[c], kv[b][c]);
      }
      // The cluster's sum, in uniform control flow (every lane takes part).
      [[unroll]] for (int o = 1; o < LANES; o <<= 1) {
        d += subgroupShuffleXor(d, uint(o));
      }
#ifdef MASK_FLOAT
      if (live[b]) {
        d += float(mask_data[m_base + (ch * CHUNK + b * NC + cl) * m_col]);
      }
#endif
      s[b] = live[b] ? d : NEG_INF;
    }
    float top = NEG_INF;
    [[unroll]] for (int b = 0; b < KB; ++b) {
      top = max(top, s[b]);
    }
    if (top != NEG_INF) {  // some key of the batch is live: else the state is kept
      const float m_new = max(m, top);
      // m == -inf: acc and l are 0, any finite factor keeps them so.
      const float alpha = m_new == m ? 1.0 : (m == NEG_INF ? 0.0 : exp(m - m_new));
      [[unroll]] for (int c = 0; c < DL4; ++c) {
        acc[c] *= alpha;
      }
      l *= alpha;
      [[unroll]] for (int b = 0; b < KB; ++b) {
        if (s[b] != NEG_INF) {  // a masked key is selected away, not multiplied in
          const float p = exp(s[b] - m_new);
          [[unroll]] for (int c = 0; c < DL4; ++c) {
            acc[c] += p * vv[b][c];
          }
          l += p;
        }
      }
      m = m_new;
    }
  }

  // The clusters of a subgroup merged (lanes at the same place in their clusters).
  for (uint o = uint(LANES); o < gl_SubgroupSize; o <<= 1) {
    const float m2 = subgroupShuffleXor(m, o);
    const float l2 = subgroupShuffleXor(l, o);
    vec4 acc2[DL4];
    [[unroll]] for (int c = 0; c < DL4; ++c) {
      acc2[c] = subgroupShuffleXor(acc[c], o);
    }
    merge(m, l, acc, m2, l2, acc2);
  }
  // Then the subgroups', in the order of the subgroups, by the first cluster.
  const int sg = int(gl_SubgroupID);
  if (gl_SubgroupInvocationID < uint(LANES)) {
    [[unroll]] for (int c = 0; c < DL4; ++c) {
      red_acc[sg * D4 + lane + LANES * c] = acc[c];
    }
    if (lane == 0) {
      red_ml[sg] = vec2(m, l);
    }
  }
  barrier();
  if (t < LANES) {
    for (int s2 = 1; s2 < int(gl_NumSubgroups); ++s2) {
      vec4 acc2[DL4];
      [[unroll]] for (int c = 0; c < DL4; ++c) {
        acc2[c] = red_acc[s2 * D4 + lane + LANES * c];
      }
      const vec2 ml = red_ml[s2];
      merge(m, l, acc, ml.x, ml.y, acc2);
    }
  }
#ifdef LAST_MERGE
  if (splits > 1) {  // uniform: every barrier below is reached by the whole workgroup
    const int row = bq * Hq + h;
    if (t < LANES) {
      STORE_SPLIT_ROW(part_data, (row * splits + split_id) * (D_MAX + 4), AS_FLOAT);
    }
    LAST_SPLIT_COUNT(row, t == 0, splits)
    if (t < LANES) {
      m = NEG_INF;
      l = 0.0;
      [[unroll]] for (int c = 0; c < DL4; ++c) {
        acc[c] = vec4(0.0);
      }
      for (int s2 = 0; s2 < splits; ++s2) {
        const int base = (row * splits + s2) * (D_MAX + 4);
        vec4 acc2[DL4];
        [[unroll]] for (int c = 0; c < DL4; ++c) {
          const int e = lane + LANES * c;
          acc2[c] = vec4(part_data[base + 4 * e], part_data[base + 4 * e + 1],
                         part_data[base + 4 * e + 2], part_data[base + 4 * e + 3]);
        }
        merge(m, l, acc, part_data[base + D_MAX], part_data[base + D_MAX + 1], acc2);
      }
    }
  }
#endif
  if (t >= LANES) {
    return;  // after the last barrier
  }
#ifdef SPLIT_K
  STORE_SPLIT_ROW(out_data, ((bq * Hq + h) * splits + split_id) * (D_MAX + 4), OUT_STORE);
#else
  const int o_base = bq * stride_at(out_meta, 3) + h * stride_at(out_meta, HEAD_DIM);
  [[unroll]] for (int c = 0; c < DL4; ++c) {
    const int e = lane + LANES * c;
    [[unroll]] for (int u = 0; u < 4; ++u) {
      if (4 * e + u < Ev) {
        out_data[o_base + 4 * e + u] = OUT_STORE(l > 0.0 ? acc[c][u] / l : FULLY_MASKED);
      }
    }
  }
#endif
}
