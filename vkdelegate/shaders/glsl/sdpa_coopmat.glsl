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
// the K and V rows go to shared memory as uvec4s of 8 fp16 (one 16-byte global load
// each where the rows are 8-element aligned, else 8 scalar loads); with STAGES = 2 the
// next tile's loads go to registers while the current tile's products run and the two
// tiles alternate between two shared buffers (one workgroup barrier per tile; STAGES =
// 1: one buffer, two). Everything after the K / V tile is the subgroup's own, synced
// with subgroup barriers only: S = Q K^T (two 16 x 16 accumulators, times scale *
// log2(e)) to its rows of s_sh as fp32; two invocations per row run the row's online
// softmax in base 2 (masks applied there; the pair shares its max through a subgroup
// shuffle) and write P as fp16 over the row's scores (read first) and the row's
// rescale factor; the subgroup multiplies its accumulators by the factors in
// registers: a row-index matrix (an accumulator loaded from r at row r, built once)
// says which row each element an invocation holds belongs to, as the KHR extension
// fixes one element layout per matrix type; then O += P V.
//
// Exactness of the early exit: a row that sees no key of a tile gets P = 0 there and
// its rescale factor stays 1 (x * 1 keeps every bit), so its accumulator gets + 0
// (unchanged: an accumulator starts at +0 and never becomes -0, for finite V); a skipped
// tile is one that no row of the workgroup sees, so skipping it gives the same bits.
// With a boolean mask (TILE_MAP) the tiles that are dead for the workgroup come from
// the mask's block map (sdpa.h, sdpa_tile_map.glsl, made for 64 x 32 blocks): the range
// is narrowed to the first and last live tiles, dead tiles between are skipped with one
// uniform branch, and a tile the map marks full reads no mask bytes.
//
// Defines: OUT_T, Q_T, K_T, V_T, OUT_STORE(v); D_MAX (32, 64 or 128); STAGES (1 or 2);
// HEAVY_FIRST (CAUSAL: workgroup order); FULLY_MASKED;
// CAUSAL; WINDOW; MASK_BOOL / MASK_FLOAT with MASK_T (MASK_WORDS: boolean bytes);
// SKIP_MASKED_TILES; TILE_MAP (MASK_BOOL with SKIP_MASKED_TILES); SEQ_FIRST; POS_TENSOR
// with START_T.
// Local size 128.

#define NSG 4
#define WG (32 * NSG)
#define BM (16 * NSG)
#define BN 32
#define DF (D_MAX / 16)   // 16-wide fragments of a head dim
#define D8 (D_MAX / 8)    // uvec4s of a head dim
#define KS (D8 + 1)       // padded shared row of K / V / Q, in uvec4s
#define SS (BN + 4)       // padded shared row of S (and of an output fragment), in words
                          // (P: the row's first BN / 2 words, fp16 pairs)
#define KV_LOADS (BN * D8 / WG)  // uvec4s of K (and of V) each invocation loads per tile
#define LOG2E 1.4426950408889634

#define A_T coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define B_T coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#define C_T coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>

// The q, k and v buffers as uvec4s: 8 fp16 elements each.
layout(set = 0, binding = BINDING_q_data) readonly buffer q_vec_buffer { uvec4 q_vec[]; };
layout(set = 0, binding = BINDING_k_data) readonly buffer k_vec_buffer { uvec4 k_vec[]; };
layout(set = 0, binding = BINDING_v_data) readonly buffer v_vec_buffer { uvec4 v_vec[]; };

// Elements off .. off + 7 of buf (vec: the same buffer as uvec4s) as 8 packed fp16,
// zero from element n of the row on (e0: the first one's index in the row); one load
// where ok (off a multiple of 8, n too).
#define H2(buf, off, e0, n, i) packFloat2x16(f16vec2(                         \
    (e0) + (i) < (n) ? float16_t(buf[(off) + (i)]) : float16_t(0.0),          \
    (e0) + (i) + 1 < (n) ? float16_t(buf[(off) + (i) + 1]) : float16_t(0.0)))
#define LOAD8(vec, buf, off, e0, n, ok) ((e0) >= (n) ? uvec4(0u) : (ok) ? vec[(off) / 8] : \
    uvec4(H2(buf, off, e0, n, 0), H2(buf, off, e0, n, 2), H2(buf, off, e0, n, 4),      \
          H2(buf, off, e0, n, 6)))

// A boolean mask of bytes (MASK_WORDS) is read as the 32-bit words holding them. Byte
// loads were first suspected of the wrong boolean-mask outputs on the H200; the cause
// was tile_live's size (below), and word loads are what was checked there since.
#ifdef MASK_WORDS
layout(set = 0, binding = BINDING_mask_data) readonly buffer mask_word_buffer {
  uint mask_words[];
};
// (the last bytes, past the buffer's last whole word, one at a time)
#define MASK_ON(i) (((((i) >> 2) < mask_words.length())                            \
    ? ((mask_words[(i) >> 2] >> (8 * ((i) & 3))) & 0xffu) : uint(mask_data[i])) != 0u)
#else
#define MASK_ON(i) (int(mask_data[i]) != 0)
#endif

// Every shared array is a whole number of 16-byte units: coopMatLoad / coopMatStore
// need 16-byte aligned addresses (k_sh, v_sh, s_sh), and where the driver places
// each array is its own choice (glslang emits them in the order of first use). A
// 12-byte vote array tile_live[3] of the boolean forms with the early exit (before the
// block map replaced the vote) put the arrays after it off that alignment: wrong
// outputs on the H200, driver 580.159 (docs/PERF.md). A test checks every form.
// At D_MAX 128 with STAGES = 2: 2 stages x (K, V) x 8.5 KiB + 9 KiB of scores, within
// the 48 KiB NVIDIA offers (P shares the scores' rows for that).
shared uvec4 k_sh[STAGES * BN * KS];  // K of the tiles (query rows 0..31 at the start)
shared uvec4 v_sh[STAGES * BN * KS];  // V of the tiles (query rows 32..63 at the start)
shared uint s_sh[BM * SS];  // fp32 S (bits), then fp16 P pairs; the output's fragments
shared float row_alpha[BM];
shared float row_l[BM];

// Subgroup-scope sync of the subgroup's own shared rows (s_sh, row_alpha).
#define SG_SYNC() subgroupMemoryBarrierShared(); subgroupBarrier()

void main() {
  const int lane = int(gl_LocalInvocationID.x);
  const int sg = int(gl_SubgroupID);
  const int sl = int(gl_SubgroupInvocationID);
  SDPA_QUERY_BLOCK(BM);  // sdpa.h: i0, h (HEAVY_FIRST: the longest rows first)
  const int bq = int(gl_WorkGroupID.z);
  SDPA_SIZES();  // sdpa.h: E, L, Hq, B, S, Ev, qoff
  if (i0 >= L || h >= Hq || bq >= B) {
    return;
  }
  SDPA_BASES(h, bq, Hq, B);
  // 16-byte loads where every row starts on 8 elements (uniform in the workgroup).
  const bool q_ok = E % 8 == 0 && q_row % 8 == 0 && q_base % 8 == 0;
  const bool k_ok = E % 8 == 0 && k_row % 8 == 0 && k_base % 8 == 0;
  const bool v_ok = Ev % 8 == 0 && v_row % 8 == 0 && v_base % 8 == 0;

  // Stage the query block (rows past L repeat row L - 1, never stored).
  [[unroll]] for (int u = 0; u < BM * D8 / WG; ++u) {
    const int idx = u * WG + lane;
    const int r = idx / D8, c = idx % D8;
    const int off = q_base + min(i0 + r, L - 1) * q_row + 8 * c;
    const uvec4 x = LOAD8(q_vec, q_data, off, 8 * c, E, q_ok);
    if (r < BN) {
      k_sh[r * KS + c] = x;
    } else {
      v_sh[(r - BN) * KS + c] = x;
    }
  }
  // The row-index matrix: element (r, c) = r, from this subgroup's part of s_sh.
  [[unroll]] for (int u = 0; u < 8; ++u) {
    const int e = sl + 32 * u;
    s_sh[(16 * sg + e / 16) * SS + e % 16] = floatBitsToUint(float(e / 16));
  }
  barrier();
  A_T qf[DF];
  [[unroll]] for (int f = 0; f < DF; ++f) {
    if (sg < 2) {
      coopMatLoad(qf[f], k_sh, 16 * sg * KS + 2 * f, KS, gl_CooperativeMatrixLayoutRowMajor);
    } else {
      coopMatLoad(qf[f], v_sh, 16 * (sg - 2) * KS + 2 * f, KS,
                  gl_CooperativeMatrixLayoutRowMajor);
    }
  }
  C_T rows_m;
  coopMatLoad(rows_m, s_sh, 16 * sg * SS, SS, gl_CooperativeMatrixLayoutRowMajor);
  C_T of[DF];
  [[unroll]] for (int f = 0; f < DF; ++f) {
    of[f] = C_T(0.0);
  }

  // Softmax: the pair (2 r, 2 r + 1) of subgroup sg owns row 16 sg + r, keys
  // 16 * (sl % 2) + 0..15 of a tile.
  const int row = 16 * sg + sl / 2;
  const int half_ = sl % 2;
  const int qpos = qoff + i0 + row;
  const float score_scale = scale.x * LOG2E;
  float m = NEG_INF;  // the row's running max, in base-2 units
  float l = 0.0;      // this invocation's part of the row's sum
#ifdef HAS_MASK
  const int m_col = mask_stride(0);
  const int m_base = bq * mask_stride(3) + h * mask_stride(2)
      + min(i0 + row, L - 1) * mask_stride(1);
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
  barrier();  // q fragments and the row-index matrix loaded before k_sh, v_sh, s_sh change

  // K and V of a tile (zero past S and the head dims), this invocation's share.
  uvec4 kr[KV_LOADS];
  uvec4 vr[KV_LOADS];
#define LOAD_KV(t)                                                                      \
  [[unroll]] for (int u = 0; u < KV_LOADS; ++u) {                                      \
    const int idx = u * WG + lane;                                                     \
    const int j = (t) * BN + idx / D8, c = idx % D8;                                   \
    kr[u] = j < S ? LOAD8(k_vec, k_data, k_base + j * k_row + 8 * c, 8 * c, E, k_ok)   \
                  : uvec4(0u);                                                         \
    vr[u] = j < S ? LOAD8(v_vec, v_data, v_base + j * v_row + 8 * c, 8 * c, Ev, v_ok)  \
                  : uvec4(0u);                                                         \
  }
#define STORE_KV(stage)                                                                 \
  [[unroll]] for (int u = 0; u < KV_LOADS; ++u) {                                      \
    const int idx = u * WG + lane;                                                     \
    k_sh[(stage) * BN * KS + (idx / D8) * KS + idx % D8] = kr[u];                      \
    v_sh[(stage) * BN * KS + (idx / D8) * KS + idx % D8] = vr[u];                      \
  }
#if STAGES == 2
  if (t_lo < t_hi) {
    LOAD_KV(t_lo);
    STORE_KV(0);
  }
  barrier();
#endif

  for (int t = t_lo; t < t_hi; ++t) {
    const int j0 = t * BN;
    const int jh = j0 + 16 * half_;  // this invocation's first key
#if STAGES == 2
    const int kv0 = ((t - t_lo) & 1) * BN * KS;  // the tile's buffer
#ifdef TILE_MAP
    const bool load_next = t + 1 < t_hi && tile_map_bits(map_row, t + 1).x != 0u;
#else
    const bool load_next = t + 1 < t_hi;
#endif
    if (load_next) {
      LOAD_KV(t + 1);  // to registers; stored after this tile's products
    }
#else
    const int kv0 = 0;
#endif
    bool live = true;
#ifdef MASK_BOOL
    uint bits = 0u;
#ifdef TILE_MAP
    const uvec2 tile = tile_map_bits(map_row, t);  // uniform in the workgroup
    live = tile.x != 0u;  // else no row of the workgroup attends a key of the tile
    if (tile.y != 0u) {
      bits = 0xffffu;  // every key attended (keys past S: -inf below)
    } else
#endif
    if (live) {
      [[unroll]] for (int u = 0; u < 16; ++u) {
        const int j = jh + u;
        if (j < S && MASK_ON(m_base + j * m_col)) {
          bits |= 1u << u;
        }
      }
    }
#endif
#if STAGES == 1
    if (live) {
      LOAD_KV(t);
      STORE_KV(0);
    }
    barrier();
#endif
    if (live) {
      [[unroll]] for (int n = 0; n < BN / 16; ++n) {
        C_T sf = C_T(0.0);
        [[unroll]] for (int f = 0; f < DF; ++f) {
          B_T kb;
          coopMatLoad(kb, k_sh, kv0 + 16 * n * KS + 2 * f, KS,
                      gl_CooperativeMatrixLayoutColumnMajor);
          sf = coopMatMulAdd(qf[f], kb, sf);
        }
        sf = sf * score_scale;
        coopMatStore(sf, s_sh, 16 * sg * SS + 16 * n, SS, gl_CooperativeMatrixLayoutRowMajor);
      }
      SG_SYNC();  // S written
      float sc[16];  // the row's scores of the tile, then (in place) its P
      float tmax = NEG_INF;
      [[unroll]] for (int u = 0; u < 16; ++u) {
        const int j = jh + u;
        float x = j < S ? uintBitsToFloat(s_sh[row * SS + 16 * half_ + u]) : NEG_INF;
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
          x += float(mask_data[m_base + j * m_col]) * LOG2E;
        }
#endif
        sc[u] = x;
        tmax = max(tmax, x);
      }
      tmax = max(tmax, subgroupShuffleXor(tmax, 1u));
      float alpha = 1.0;
      if (tmax != NEG_INF) {
        const float m_new = max(m, tmax);
        alpha = (m_new == m) ? 1.0 : (m == NEG_INF ? 0.0 : exp2(m - m_new));
        l *= alpha;
        [[unroll]] for (int u = 0; u < 16; ++u) {
          sc[u] = (sc[u] == NEG_INF) ? 0.0 : exp2(sc[u] - m_new);
          l += sc[u];
        }
        m = m_new;
      } else {
        [[unroll]] for (int u = 0; u < 16; ++u) {
          sc[u] = 0.0;
        }
      }
      SG_SYNC();  // the row's scores read before P overwrites them
      [[unroll]] for (int c = 0; c < 8; ++c) {
        s_sh[row * SS + 8 * half_ + c] = packFloat2x16(f16vec2(sc[2 * c], sc[2 * c + 1]));
      }
      if (half_ == 0) {
        row_alpha[row] = alpha;
      }
      SG_SYNC();  // P and the factors written
      C_T am;
      [[unroll]] for (int i = 0; i < am.length(); ++i) {
        am[i] = row_alpha[16 * sg + int(rows_m[i])];
      }
      [[unroll]] for (int f = 0; f < DF; ++f) {
        [[unroll]] for (int i = 0; i < am.length(); ++i) {
          of[f][i] *= am[i];
        }
      }
      A_T pf[BN / 16];
      [[unroll]] for (int n = 0; n < BN / 16; ++n) {
        coopMatLoad(pf[n], s_sh, 16 * sg * SS + 8 * n, SS, gl_CooperativeMatrixLayoutRowMajor);
      }
      [[unroll]] for (int f = 0; f < DF; ++f) {
        [[unroll]] for (int n = 0; n < BN / 16; ++n) {
          B_T vb;
          coopMatLoad(vb, v_sh, kv0 + 16 * n * KS + 2 * f, KS,
                      gl_CooperativeMatrixLayoutRowMajor);
          of[f] = coopMatMulAdd(pf[n], vb, of[f]);
        }
      }
      SG_SYNC();  // P and the factors read before the next tile's S
    }
#if STAGES == 2
    if (load_next) {
      STORE_KV((t + 1 - t_lo) & 1);
    }
#endif
    barrier();  // the next tile's K, V stored; this tile's read before it is overwritten
  }

  l += subgroupShuffleXor(l, 1u);
  if (half_ == 0) {
    row_l[row] = l;
  }
  barrier();
  const int o_base = bq * stride_at(out_meta, 3) + h * stride_at(out_meta, HEAD_DIM);
  const int o_row = stride_at(out_meta, SEQ_DIM);
  [[unroll]] for (int f = 0; f < DF; ++f) {
    coopMatStore(of[f], s_sh, 16 * sg * SS, SS, gl_CooperativeMatrixLayoutRowMajor);
    SG_SYNC();
    [[unroll]] for (int u = 0; u < 8; ++u) {
      const int e = sl + 32 * u;
      const int r = 16 * sg + e / 16;
      const int i = i0 + r;
      const int c = 16 * f + e % 16;
      const float lr = row_l[r];
      if (i < L && c < Ev) {
        out_data[o_base + i * o_row + c] =
            OUT_STORE(lr > 0.0 ? uintBitsToFloat(s_sh[r * SS + e % 16]) / lr : FULLY_MASKED);
      }
    }
    subgroupBarrier();
  }
}
