#version 450
#extension GL_GOOGLE_include_directive : require
#ifdef SUBGROUP
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif
#include "common.h"
#include "sdpa.h"

// Decode attention on GPUs (kernels/attention_decode.py): the operation of sdpa.glsl
// (its header documents it: layouts, positions pos, CAUSAL / WINDOW / masks,
// FULLY_MASKED, SPLIT_K's partial rows for sdpa_combine.glsl) for few query rows, with
// the keys spread over the workgroup instead of the query rows.
//
// One workgroup of WG invocations per (key split, query-head group wy, batch): its
// R = L * pack rows (R <= R_MAX) are row r = query position r / pack of query head
// wy * pack + r % pack (pack = split.y: Hq / Hk heads sharing one K/V head, or 1).
// The rows' queries (scaled) sit in shared memory. Keys are walked in chunks of WG:
//   scores: invocation t scores key j0 + t against every row (its K row read once, as
//     4-element vectors where the head dims and strides allow), masked keys -inf
//     without reading K; the chunk's max per row (subgroupMax and one shared slot per
//     subgroup with SUBGROUP, else a shared-memory tree); p = exp(score - new max)
//     into shared memory;
//   P V: invocation t = c + D4 * g owns vec4 c of the output of every row for the D4
//     keys g * D4 .. of the chunk (V read once per workgroup, adjacent invocations
//     adjacent vec4s): acc[r] += p[r][key] * v, the running sum l[r] += p alike;
//   the online softmax rescales acc and l by exp(m - new max) per chunk.
// The D4 x (WG / D4) partial sums are added up per row at the end (in the order of g),
// then written (acc / l), or with SPLIT_K as the split's (acc, m, l) row.
// Exactness of the early exit (SKIP_MASKED_TILES: chunks past the last row's position
// (CAUSAL) or before the first row's window start (WINDOW) are not visited): a key
// masked for a row adds nothing to it (p = 0 is selected away, not multiplied), and a
// row with no key in a chunk is left as it was, so a fully masked chunk visited and
// one skipped give the same bits.
// Defines: sdpa.glsl's OUT_T, Q_T, K_T, V_T, OUT_STORE(v), D_MAX, CAUSAL, WINDOW,
// MASK_BOOL / MASK_FLOAT (MASK_T), FULLY_MASKED, SKIP_MASKED_TILES, SEQ_FIRST, SPLIT_K,
// POS_TENSOR (START_T);
// K4_T, V4_T (4-element storage types of K and V); WG (the local size x, a power of
// two >= D4); R_MAX; SUBGROUP. PROBE (benchmarks/dispatch_floor.py only, wrong results
// on purpose): 1 no key chunks, 2 no P V step, 3 no K / V loads, 4 no row max, 5 chunks
// of three barriers alone.

#define D4 (D_MAX / 4)
#define G (WG / D4)  // key groups of the P V step
// The scores' loop over the head dim: K_STEP vec4s a step (loaded together), rolled
// unless one step covers it.
#ifndef K_STEP
#if D_MAX < 32
#define K_STEP D4
#else
#define K_STEP 8
#endif
#endif
#if K_STEP >= D4
#define K_LOOP [[unroll]]
#else
#define K_LOOP [[dont_unroll]]
#endif

layout(set = 0, binding = BINDING_k_data) readonly buffer k4_buffer { K4_T k4_data[]; };
layout(set = 0, binding = BINDING_v_data) readonly buffer v4_buffer { V4_T v4_data[]; };

shared vec4 q_s[R_MAX * D4];    // row r's query, scaled: q_s[r * D4 + c]
shared float p_s[R_MAX * WG];   // row r's probability of chunk key k: p_s[r * WG + k]
// The max reduction; the final sums (4 floats an invocation).
shared float red_s[(R_MAX < 4 ? 4 : R_MAX) * WG];

// The max over the workgroup of each row's v[r] (every invocation gets the same).
void row_max(inout float v[R_MAX], int t, int R) {
#ifdef SUBGROUP
  [[unroll]] for (int r = 0; r < R_MAX; ++r) {
    if (r < R) {  // uniform
      const float m = subgroupMax(v[r]);
      if (subgroupElect()) {
        red_s[r * WG + int(gl_SubgroupID)] = m;
      }
    }
  }
  barrier();
  [[unroll]] for (int r = 0; r < R_MAX; ++r) {
    float m = NEG_INF;
    if (r < R) {
      for (uint s = 0u; s < gl_NumSubgroups; ++s) {
        m = max(m, red_s[r * WG + int(s)]);
      }
    }
    v[r] = m;
  }
#else
  [[unroll]] for (int r = 0; r < R_MAX; ++r) {
    red_s[r * WG + t] = v[r];
  }
  barrier();
  for (int s = WG / 2; s > 0; s >>= 1) {
    if (t < s) {
      [[unroll]] for (int r = 0; r < R_MAX; ++r) {
        red_s[r * WG + t] = max(red_s[r * WG + t], red_s[r * WG + t + s]);
      }
    }
    barrier();
  }
  [[unroll]] for (int r = 0; r < R_MAX; ++r) {
    v[r] = red_s[r * WG];
  }
#endif
}

void main() {
  const int t = int(gl_LocalInvocationID.x);
  const int splits = max(1, pos.w);
  const int split_id = int(gl_WorkGroupID.x);
  const int pack = max(1, split.y);
  const int wy = int(gl_WorkGroupID.y);
  const int bq = int(gl_WorkGroupID.z);
  SDPA_SIZES();  // sdpa.h: E, L, Hq, B, S, Ev, qoff
  const int R = L * pack;
  if (wy * pack >= Hq || bq >= B || R > R_MAX) {
    return;  // the whole workgroup leaves together (no barrier is skipped)
  }
  SDPA_BASES(wy * pack, bq, Hq, B);
  const int q_head = stride_at(q_meta, HEAD_DIM);
  const bool vec = E % 4 == 0 && Ev % 4 == 0 && k_base % 4 == 0 && v_base % 4 == 0
      && k_row % 4 == 0 && v_row % 4 == 0;  // uniform
#ifdef HAS_MASK
  int m_base[R_MAX];
  [[unroll]] for (int r = 0; r < R_MAX; ++r) {
    m_base[r] = bq * mask_stride(3) + (wy * pack + r % pack) * mask_stride(2)
        + min(r / pack, L - 1) * mask_stride(1);
  }
  const int m_col = mask_stride(0);
#endif
  for (int idx = t; idx < R_MAX * D4; idx += WG) {
    const int r = idx / D4;
    const int base = q_base + (r % pack) * q_head + min(r / pack, L - 1) * q_row;
    q_s[idx] = r < R ? LOAD4(q_data, base, idx % D4, E) * scale.x : vec4(0.0);
  }

  float m[R_MAX];    // running max of each row's scores (the same in every invocation)
  vec4 acc[R_MAX];   // vec4 c of each row's output, over this invocation's keys
  float l[R_MAX];    // each row's running sum of p over this invocation's keys
  [[unroll]] for (int r = 0; r < R_MAX; ++r) {
    m[r] = NEG_INF;
    acc[r] = vec4(0.0);
    l[r] = 0.0;
  }
  const int c = t % D4;
  const int g = t / D4;

  const int chunks = (S + WG - 1) / WG;
  int ch_lo = splits > 1 ? split_id * split.x : 0;
  int ch_hi = splits > 1 ? min(chunks, ch_lo + split.x) : chunks;
#ifdef SKIP_MASKED_TILES
#ifdef CAUSAL
  ch_hi = min(ch_hi, (max(-1, qoff + L - 1) + WG) / WG);  // keys past the last row's position
#endif
#ifdef WINDOW
  ch_lo = max(ch_lo, max(0, qoff - pos.z + 1) / WG);  // before the first row's window
#endif
#endif
#if PROBE == 1
  ch_hi = ch_lo;
#endif
  barrier();  // q_s is written
  for (int ch = ch_lo; ch < ch_hi; ++ch) {
    const int j = ch * WG + t;
#if PROBE == 5
    barrier();
    barrier();
    barrier();
    continue;
#endif
    float s[R_MAX];
    bool any = false;
    [[unroll]] for (int r = 0; r < R_MAX; ++r) {
      bool live = r < R && j < S;
      const int qpos = qoff + r / pack;
#ifdef CAUSAL
      live = live && j <= qpos;
#endif
#ifdef WINDOW
      live = live && j > qpos - pos.z;
#endif
#ifdef MASK_BOOL
      if (live) {
        live = int(mask_data[m_base[r] + j * m_col]) != 0;
      }
#endif
      s[r] = live ? 0.0 : NEG_INF;
      any = any || live;
    }
    if (any) {  // a key masked for every row: its K row is not read
      float d[R_MAX];
      [[unroll]] for (int r = 0; r < R_MAX; ++r) {
        d[r] = 0.0;
      }
      const int kb = k_base + j * k_row;
      // Vector loads (uniform); the scalar form in a rolled loop: unrolled, its code
      // doubled the kernel, and a decode step runs each instruction about once, so the
      // instruction fetches were most of the time (docs/PERF.md).
      if (vec) {
        K_LOOP for (int c0 = 0; c0 < D4; c0 += K_STEP) {
          vec4 kv[K_STEP];
          [[unroll]] for (int u = 0; u < K_STEP; ++u) {
#if PROBE == 3
            kv[u] = q_s[c0 + u] * float(j);
#else
            kv[u] = 4 * (c0 + u) >= E ? vec4(0.0) : vec4(k4_data[kb / 4 + c0 + u]);
#endif
          }
          [[unroll]] for (int u = 0; u < K_STEP; ++u) {
            [[unroll]] for (int r = 0; r < R_MAX; ++r) {
              if (r < R) {  // uniform: the rows past R are not computed
                d[r] += dot(q_s[r * D4 + c0 + u], kv[u]);
              }
            }
          }
        }
      } else {
        [[dont_unroll]] for (int cc = 0; cc < D4; ++cc) {
          const vec4 kv = LOAD4(k_data, kb, cc, E);
          [[unroll]] for (int r = 0; r < R_MAX; ++r) {
            if (r < R) {
              d[r] += dot(q_s[r * D4 + cc], kv);
            }
          }
        }
      }
      [[unroll]] for (int r = 0; r < R_MAX; ++r) {
#ifdef MASK_FLOAT
        if (s[r] == 0.0) {
          d[r] += float(mask_data[m_base[r] + j * m_col]);
        }
#endif
        s[r] = s[r] == 0.0 ? d[r] : NEG_INF;
      }
    }
    float top[R_MAX];
    [[unroll]] for (int r = 0; r < R_MAX; ++r) {
      top[r] = s[r];
    }
#if PROBE != 4
    row_max(top, t, R);
#endif
    bool seen = false;  // uniform: some row has a key in this chunk
    [[unroll]] for (int r = 0; r < R_MAX; ++r) {
      if (r < R) {
        const float m_new = max(m[r], top[r]);
        p_s[r * WG + t] = s[r] == NEG_INF ? 0.0 : exp(s[r] - m_new);
        if (top[r] != NEG_INF) {
          // m == -inf: acc and l are 0, any finite factor keeps them so.
          const float alpha = (m_new == m[r]) ? 1.0
              : (m[r] == NEG_INF ? 0.0 : exp(m[r] - m_new));
          acc[r] *= alpha;
          l[r] *= alpha;
          m[r] = m_new;
          seen = true;
        }
      }
    }
    barrier();  // p_s is written (and red_s read)
#if PROBE == 2
    seen = false;
#endif
    if (seen) {
      const int k0 = g * D4;
      for (int kk = k0; kk < k0 + D4; kk += 4) {  // 4 V rows loaded per step
        vec4 vv[4];
        [[unroll]] for (int u = 0; u < 4; ++u) {
          // Clamped: a key past S has p = 0 for every row (its V is not used).
          const int vb = v_base + min(ch * WG + kk + u, S - 1) * v_row;
#if PROBE == 3
          vv[u] = vec4(float(vb));
#else
          vv[u] = 4 * c >= Ev ? vec4(0.0) : vec ? vec4(v4_data[vb / 4 + c]) : LOAD4(v_data, vb, c, Ev);
#endif
        }
        [[unroll]] for (int u = 0; u < 4; ++u) {
          [[unroll]] for (int r = 0; r < R_MAX; ++r) {
            if (r < R) {
              const float p = p_s[r * WG + kk + u];
              acc[r] = p != 0.0 ? acc[r] + p * vv[u] : acc[r];
              l[r] += p;
            }
          }
        }
      }
    }
    barrier();  // every invocation has read p_s before the next chunk writes it
  }

  // Row r's sums over the G key groups, in the order of g, by the invocations of g 0.
  [[unroll]] for (int r = 0; r < R_MAX; ++r) {
    if (r < R) {
      [[unroll]] for (int u = 0; u < 4; ++u) {
        red_s[4 * t + u] = acc[r][u];
      }
      p_s[t] = l[r];
      barrier();
      if (g == 0) {
        vec4 a = vec4(0.0);
        float total = 0.0;
        for (int gg = 0; gg < G; ++gg) {
          const int i4 = 4 * (gg * D4 + c);
          a += vec4(red_s[i4], red_s[i4 + 1], red_s[i4 + 2], red_s[i4 + 3]);
          total += p_s[gg * D4 + c];
        }
        const int h = wy * pack + r % pack;
        const int i = r / pack;
#ifdef SPLIT_K
        const int p_base = (((bq * Hq + h) * L + i) * splits + split_id) * (D_MAX + 4);
        [[unroll]] for (int u = 0; u < 4; ++u) {
          out_data[p_base + 4 * c + u] = OUT_STORE(a[u]);
        }
        if (c == 0) {
          out_data[p_base + D_MAX] = OUT_STORE(m[r]);
          out_data[p_base + D_MAX + 1] = OUT_STORE(total);
        }
#else
        const int o_base = bq * stride_at(out_meta, 3) + h * stride_at(out_meta, HEAD_DIM)
            + i * stride_at(out_meta, SEQ_DIM);
        [[unroll]] for (int u = 0; u < 4; ++u) {
          if (4 * c + u < Ev) {
            out_data[o_base + 4 * c + u] = OUT_STORE(total > 0.0 ? a[u] / total : FULLY_MASKED);
          }
        }
#endif
      }
      barrier();  // red_s and p_s are read before the next row's sums
    }
  }
}
