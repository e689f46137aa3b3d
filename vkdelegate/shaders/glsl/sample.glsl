#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"

// vkdelegate.sample (vkdelegate/ops/families/sample.py): the next token id from one row
// of logits, in ONE workgroup. Definition (the op's torch kernel, custom_ops_llm.py):
// temperature t <= 0: argmax of the logits (first maximum). Else z = logit / t, tokens
// ordered by z descending, ties by lower index; keep the top_k first (0 or >= V: all),
// then the shortest prefix whose mass (w = exp(z - max z)) reaches top_p of the kept
// mass (top_p <= 0 keeps one token), then take the first token whose cumulative mass
// exceeds draw * (kept mass), or the last kept one.
//
// Each token's place in the order is the 64-bit key (h, l) = (orderable bits of z,
// V - 1 - index), larger first. Masses are fixed point, w * 2^40 truncated to a 64-bit
// integer (uvec2: lo, hi), so every sum is exact and independent of the order of
// additions (shared-memory integer atomics are deterministic).
// 1. One pass: the maximum key (greedy: the answer; top_k = 1 or top_p <= 0 too).
// 2. A threshold (the k-th key, the top-p cut, the drawn token) is the largest key T
//    whose count/mass F(T) over the keys >= T (and >= a floor) passes a monotone test;
//    radix search: each level is one pass that builds a 256-bin histogram (count, mass,
//    largest h and l per bin) of the candidate keys, then picks the bin where the test
//    first passes. Level 0 bins by (max z - z) in steps of 1/8 (spread where the mass
//    is; few atomics on one address), later levels by the bits of h - lo of the
//    candidate range [lo, hi], until one token is left or h is one value; tokens tied
//    in h then split by l (a count search). About 3-5 passes per search.
// 3. top-k path (top_k in [1, KMAX], or V <= KMAX): the k-th key by a count search, the
//    k kept tokens compacted into shared memory, bitonic-sorted, their masses' prefix
//    sums by a fixed scan, top-p and the draw by binary searches on those sums.
//    General path: count search (top_k > KMAX), mass search for top_p, mass search
//    for the draw, each with the previous threshold as the floor.
// RECORD (vkdelegate.sample_record): the decode loop's step. p = pos_data[0], the
// position the step fed; with DRAWS the draw is draws[p] (not sampling[3]); invocation
// 0 writes the id to out_data and token_out, p + 1 to pos_out and the id to
// history_out[p + 1] (history_out already holds the rest of the history). A p outside
// the draws' rows or a p + 1 outside the history's sets the node's error flag; the
// draw is then clamped into the table and the history row is not written.
// PARTIALS (V > SPAN): the maximum key is the largest of part_data's ceil(V / SPAN)
// keys (h, l), each workgroup's maximum from sample_max.glsl, dispatched first over
// many workgroups: the one pass a greedy step makes, spread over the GPU instead of
// one workgroup's invocations.
// Defines: OUT_T (int storage), IN_T (logit storage), SAMP_T, OUT_STORE(v); RECORD:
// POS_T; DRAWS; PARTIALS: SPAN.

#define KMAX 1024u        // the shared list of the top-k path
#define NBIN 256u
#define MAX_LEVELS 16u     // a search's levels (see search)
#define NEG_INF_KEY 0x007fffffu  // fkey(-inf): the smallest non-NaN key

TENSOR_OUT(out_data, OUT_T)
TENSOR_IN(logits, IN_T)
TENSOR_IN(sampling, SAMP_T)
#ifdef PARTIALS
TENSOR_IN(part_data, uint)
#endif
#ifdef RECORD
#include "index_check.h"
TENSOR_OUT(token_out, OUT_T)
TENSOR_OUT(pos_out, OUT_T)
TENSOR_OUT(history_out, OUT_T)
TENSOR_IN(pos_data, POS_T)
#ifdef DRAWS
TENSOR_IN(draws, SAMP_T)
#endif
#endif
PARAMS(sample_block) {
  ivec4 info;  // x: V (number of logits); RECORD: y: history rows, z: error-flag word,
               // w: draws rows
};

// 16 KB: [0, 2048) the histogram (5 x 256), BC, PART / the max reduction / the prefix
// sums (lo, hi); [2048, 4096) the sorted list (h, l).
shared uint sm[4096];
#define H_CNT 0u
#define H_MLO 256u
#define H_MHI 512u
#define H_MAXH 768u
#define H_MAXL 1024u
#define C_LO 0u
#define C_HI 1024u
#define S_H 2048u
#define S_L 3072u

// Invocation 0 decides each level and broadcasts through shared memory (after the
// histogram): BC_LO, BC_HI, BC_LLO, BC_LHI, BC_S (the next ranges of h and l),
// BC_STATE (0: go on by h; 1: the threshold is (BC_TH, BC_TL); 2: none passes; 3: go
// on by l among the tokens at h = BC_TH).
#define BC 1280u
#define BC_LO (BC + 0u)
#define BC_HI (BC + 1u)
#define BC_S (BC + 2u)
#define BC_STATE (BC + 3u)
#define BC_TH (BC + 4u)
#define BC_TL (BC + 5u)
#define BC_LLO (BC + 6u)
#define BC_LHI (BC + 7u)

uint tid, wg, nv, chunks;
float temp, zmax;
bool greedy;
uint mh, ml;  // the maximum key

#include "sample_keys.h"

float z_at(uint i) {
  return z_of(float(logits[i]), temp);
}

// 64-bit unsigned arithmetic on uvec2 (lo, hi).
uvec2 add64(uvec2 a, uvec2 b) {
  uint c;
  const uint lo = uaddCarry(a.x, b.x, c);
  return uvec2(lo, a.y + b.y + c);
}

bool ge64(uvec2 a, uvec2 b) {
  return a.y > b.y || (a.y == b.y && a.x >= b.x);
}

// floor(a * f) for f in [0, 1] (f truncated to 32 fraction bits).
uvec2 frac64(uvec2 a, float f) {
  if (f >= 1.0) {
    return a;
  }
  const uint pf = uint(max(f, 0.0) * 4294967296.0);
  uint h1, l1, h2, l2;
  umulExtended(a.y, pf, h1, l1);
  umulExtended(a.x, pf, h2, l2);
  return add64(uvec2(l1, h1), uvec2(h2, 0u));
}

// j * m for j < 2^24 and m <= 2^40.
uvec2 mul64(uint j, uvec2 m) {
  uint h, l;
  umulExtended(j, m.x, h, l);
  return uvec2(l, h + j * m.y);
}

// The mass of z as fixed point: exp(z - zmax) * 2^40, truncated.
uvec2 mass_q(float z) {
  const float t = exp(z - zmax) * 256.0;  // <= 256
  const float hi = floor(t);
  return uvec2(uint((t - hi) * 4294967296.0), uint(hi));
}

// Level 0's bin: 255 - (max z - z) * 8, clamped; non-decreasing in the key.
uint digit0(float z) {
  return 255u - uint(clamp((zmax - z) * 8.0, 0.0, 255.0));
}

// mode 0: count >= target, 1: mass >= target, 2: mass > target.
bool passes(uvec2 f, uvec2 target, uint mode) {
  return mode == 2u ? !ge64(target, f) : ge64(f, target);
}

uvec2 bin_value(uint d, uint mode) {
  return mode == 0u ? uvec2(sm[H_CNT + d], 0u) : uvec2(sm[H_MLO + d], sm[H_MHI + d]);
}

void clear_hist() {
  for (uint j = tid; j < 5u * NBIN; j += wg) {
    sm[j] = 0u;
  }
  barrier();
}

// Adds cnt tokens of mass m, largest key parts h and l, to bin d. Level 0 (full, all
// V tokens: its atomics are the cost on a CPU driver) adds only the count (mode 0) or
// only the mass; its bin's count, h and l are not known then.
bool h_full, h_mass;

void hist_add(uint d, uint cnt, uint h, uint l, uvec2 m) {
  if (h_full || !h_mass) {
    atomicAdd(sm[H_CNT + d], cnt);
  }
  if (h_full) {
    atomicMax(sm[H_MAXH + d], h);
    atomicMax(sm[H_MAXL + d], l);
  }
  if (h_mass && m != uvec2(0u)) {
    const uint old = atomicAdd(sm[H_MLO + d], m.x);
    uint c;
    uaddCarry(old, m.x, c);
    if (m.y + c != 0u) {
      atomicAdd(sm[H_MHI + d], m.y + c);
    }
  }
}

// Bin 0 (level 0: the tokens 32 or more below the maximum, often most of them) is
// summed per invocation and added once, not one atomic per token on one address.
uint p_cnt, p_h, p_l;
uvec2 p_m;

void hist_token(uint d, uint h, uint l, uvec2 m) {
  if (d == 0u) {
    p_cnt += 1u;
    p_h = max(p_h, h);
    p_l = max(p_l, l);
    p_m = add64(p_m, m);
  } else {
    hist_add(d, 1u, h, l, m);
  }
}

void hist_begin() {
  p_cnt = 0u;
  p_h = 0u;
  p_l = 0u;
  p_m = uvec2(0u);
}

void hist_end() {
  if (p_cnt != 0u) {
    hist_add(0u, p_cnt, p_h, p_l, p_m);
  }
  barrier();
}

// The bins' sums by 16 (invocations 0..15, after the histogram): PART_LO/HI, so that
// invocation 0's scans below are short (a serial scan of 256 bins is slow on a GPU).
#define PART (BC + 8u)
#define NPART (NBIN / 16u)

void part_sums(uint mode) {
  if (tid < NPART) {
    uvec2 acc = uvec2(0u);
    for (uint j = 0u; j < 16u; ++j) {
      acc = add64(acc, bin_value(tid * 16u + j, mode));
    }
    sm[PART + 2u * tid] = acc.x;
    sm[PART + 2u * tid + 1u] = acc.y;
  }
  barrier();
}

uvec2 part_value(uint c) {
  return uvec2(sm[PART + 2u * c], sm[PART + 2u * c + 1u]);
}

// Picks the largest bin d whose value, with `above` (the keys above the bins), passes;
// then `above` holds the bins above d. Returns -1 where none passes. After part_sums.
int pick_bin(inout uvec2 above, uvec2 target, uint mode) {
  uvec2 acc = above;
  for (int c = int(NPART) - 1; c >= 0; --c) {
    const uvec2 next = add64(acc, part_value(uint(c)));
    if (passes(next, target, mode)) {
      for (int d = 16 * c + 15; d >= 16 * c; --d) {
        const uvec2 nd = add64(acc, bin_value(uint(d), mode));
        if (passes(nd, target, mode)) {
          above = acc;
          return d;
        }
        acc = nd;
      }
      return -1;  // not reached: the part's bins sum to its value
    }
    acc = next;
  }
  return -1;
}

// The next level's range after picking bin d of [lo, hi]: level 0's by binary searches
// (digit0 is monotone in the key), later levels' by the bits.
void narrow(uint d, bool level0, uint s, inout uint lo, inout uint hi) {
  if (level0) {
    uint a = lo, e = hi;
    while (a < e) {
      const uint m = a + ((e - a) >> 1);
      if (digit0(key_float(m)) >= d) {
        e = m;
      } else {
        a = m + 1u;
      }
    }
    lo = a;
    e = hi;
    while (a < e) {
      const uint m = a + ((e - a + 1u) >> 1);
      if (digit0(key_float(m)) <= d) {
        a = m;
      } else {
        e = m - 1u;
      }
    }
    hi = a;
  } else {
    lo += d << s;
    hi = ((hi - lo) >> s) == 0u ? hi : lo + ((1u << s) - 1u);
  }
}

uint shift_for(uint lo, uint hi) {
  return lo == hi ? 0u : uint(max(findMSB(hi - lo) + 1 - 8, 0));
}


// The largest key T >= the floor (fh, fl) whose F(T) passes the test: mode 0, the
// count >= kcount; modes 1 and 2, the mass >= / > frac * (the mass of the keys >= the
// floor). Leaves the floor where none passes. One loop of levels (one copy of the pass:
// a CPU driver runs a large shader slower): by h in [lo, hi], then, for tokens tied at
// h = lo, by l in [llo, lhi] (a count search for the j-th largest l).
void search(uint mode, uint kcount, float frac, inout uint fh, inout uint fl) {
  uvec2 above = uvec2(0u), target = uvec2(kcount, 0u);  // invocation 0's
  uint lo = max(fh, NEG_INF_KEY), hi = mh, llo = 0u, lhi = nv - 1u, s = 0u;
  bool level0 = true, by_l = false;
  uint state = 0u;
  h_mass = mode != 0u;
  // At most 1 + 4 levels by h (8 bits each after level 0) and 3 by l (V < 2^24): the
  // cap only bounds the loop against data no search can narrow (a hang on a GPU is a
  // lost device); it leaves the floor as it was, as when no key passes.
  for (uint level = 0u; level < MAX_LEVELS && (state == 0u || state == 3u); ++level) {
    h_full = !level0;
    clear_hist();
    hist_begin();
    for (uint c = 0u; c < chunks; ++c) {
      [[unroll]] for (uint u = 0u; u < 8u; ++u) {
        const uint i = (c * 8u + u) * wg + tid;
        if (i < nv) {
          const float z = z_at(i);
          const uint h = fkey(z), l = nv - 1u - i;
          if (h >= lo && h <= hi && l >= llo && l <= lhi && key_ge(h, l, fh, fl)) {
            // A token of mass 0 (fixed point) never moves a mass threshold: skipped.
            const uvec2 m = h_mass ? mass_q(z) : uvec2(0u);
            if (!h_mass || m != uvec2(0u)) {
              const uint d = by_l ? (l - llo) >> s
                                  : (level0 ? digit0(z) : min((h - lo) >> s, NBIN - 1u));
              hist_token(d, h, l, m);
            }
          }
        }
      }
    }
    hist_end();
    part_sums(h_mass ? 1u : 0u);
    if (tid == 0u) {
      if (level0 && h_mass) {
        uvec2 total = uvec2(0u);
        for (uint c = 0u; c < NPART; ++c) {
          total = add64(total, part_value(c));
        }
        target = frac64(total, frac);
      }
      const int b = pick_bin(above, target, h_mass ? mode : 0u);
      uint st = state;
      if (b < 0) {
        st = 2u;
      } else {
        const uint d = uint(b), cnt = sm[H_CNT + d];
        sm[BC_TH] = by_l ? lo : sm[H_MAXH + d];
        sm[BC_TL] = sm[H_MAXL + d];
        if (cnt == 1u && !level0) {
          st = 1u;
        } else if (by_l) {
          narrow(d, false, s, llo, lhi);
        } else {
          narrow(d, level0, s, lo, hi);
          if (lo == hi) {
            // cnt tokens share h = lo, each of mass m: the j-th of them (by l, larger
            // first) is the threshold.
            uint j = mode == 0u ? kcount - above.x : 1u;
            if (h_mass) {
              const uvec2 m = mass_q(key_float(lo));
              uint a = 1u, e = level0 ? nv : cnt;  // level 0 has no count
              while (a < e) {
                const uint mid = (a + e) >> 1;
                if (passes(add64(above, mul64(mid, m)), target, mode)) {
                  e = mid;
                } else {
                  a = mid + 1u;
                }
              }
              j = a;
            }
            sm[BC_TH] = lo;
            st = j > 1u || level0 ? 3u : 1u;  // level 0 has no largest l
            above = uvec2(0u);
            target = uvec2(j, 0u);
            llo = lo == fh ? fl : 0u;
          }
        }
      }
      sm[BC_LO] = lo;
      sm[BC_HI] = hi;
      sm[BC_LLO] = llo;
      sm[BC_LHI] = lhi;
      sm[BC_S] = st == 3u ? shift_for(llo, lhi) : shift_for(lo, hi);
      sm[BC_STATE] = st;
    }
    barrier();
    lo = sm[BC_LO];
    hi = sm[BC_HI];
    llo = sm[BC_LLO];
    lhi = sm[BC_LHI];
    s = sm[BC_S];
    state = sm[BC_STATE];
    level0 = false;
    if (state == 3u) {
      by_l = true;
      h_mass = false;
    }
  }
  const uint th = sm[BC_TH], tl = sm[BC_TL];
  barrier();
  if (state == 1u && key_ge(th, tl, fh, fl)) {
    fh = th;
    fl = tl;
  }
}

// top-k path: the tokens with keys >= (fh, fl) (n <= KMAX of them) sorted in shared
// memory; returns the drawn token's l.
uint draw_from_list(uint n, uint fh, uint fl, float top_p, float draw) {
  if (tid == 0u) {
    sm[0] = 0u;
  }
  uint n2 = 1u;
  while (n2 < n) {
    n2 <<= 1;
  }
  for (uint j = tid; j < n2; j += wg) {
    sm[S_H + j] = 0u;  // padding: below every real key
    sm[S_L + j] = 0u;
  }
  barrier();
  for (uint c = 0u; c < chunks; ++c) {
    [[unroll]] for (uint u = 0u; u < 8u; ++u) {
      const uint i = (c * 8u + u) * wg + tid;
      if (i < nv) {
        const uint h = fkey(z_at(i)), l = nv - 1u - i;
        if (key_ge(h, l, fh, fl)) {
          const uint slot = atomicAdd(sm[0], 1u);
          if (slot < n) {  // exactly n (the search is exact): a guard only
            sm[S_H + slot] = h;
            sm[S_L + slot] = l;
          }
        }
      }
    }
  }
  barrier();
  // Bitonic sort, descending.
  for (uint k = 2u; k <= n2; k <<= 1) {
    for (uint j = k >> 1; j > 0u; j >>= 1) {
      for (uint t = tid; t < n2 >> 1; t += wg) {
        const uint a = 2u * t - (t & (j - 1u));
        const uint e = a + j;
        const uint ah = sm[S_H + a], al = sm[S_L + a], eh = sm[S_H + e], el = sm[S_L + e];
        const bool desc = (a & k) == 0u;
        if (key_ge(eh, el, ah, al) == desc && (eh != ah || el != al)) {
          sm[S_H + a] = eh;
          sm[S_L + a] = el;
          sm[S_H + e] = ah;
          sm[S_L + e] = al;
        }
      }
      barrier();
    }
  }
  // Masses and their inclusive prefix sums (Hillis-Steele: integer, exact).
  for (uint j = tid; j < n2; j += wg) {
    const uvec2 m = j < n ? mass_q(key_float(sm[S_H + j])) : uvec2(0u);
    sm[C_LO + j] = m.x;
    sm[C_HI + j] = m.y;
  }
  barrier();
  for (uint off = 1u; off < n2; off <<= 1) {
    uvec2 v[KMAX / 128u];  // wg >= 128 (Vulkan's minimum limit)
    uint q = 0u;
    for (uint j = tid; j < n2; j += wg, ++q) {
      v[q] = j >= off ? uvec2(sm[C_LO + j - off], sm[C_HI + j - off]) : uvec2(0u);
    }
    barrier();
    q = 0u;
    for (uint j = tid; j < n2; j += wg, ++q) {
      const uvec2 r = add64(uvec2(sm[C_LO + j], sm[C_HI + j]), v[q]);
      sm[C_LO + j] = r.x;
      sm[C_HI + j] = r.y;
    }
    barrier();
  }
  // top-p: the first j whose sum reaches top_p of the kept mass; the draw: the first
  // j <= that whose sum exceeds draw * its sum (binary searches: the sums rise).
  uint last = n - 1u;
  if (top_p < 1.0) {
    const uvec2 target = frac64(uvec2(sm[C_LO + last], sm[C_HI + last]), top_p);
    uint a = 0u, e = last;
    while (a < e) {
      const uint m = (a + e) >> 1;
      if (ge64(uvec2(sm[C_LO + m], sm[C_HI + m]), target)) {
        e = m;
      } else {
        a = m + 1u;
      }
    }
    last = a;
  }
  const uvec2 target = frac64(uvec2(sm[C_LO + last], sm[C_HI + last]), draw);
  uint a = 0u, e = last;
  while (a < e) {
    const uint m = (a + e) >> 1;
    if (!ge64(target, uvec2(sm[C_LO + m], sm[C_HI + m]))) {
      e = m;
    } else {
      a = m + 1u;
    }
  }
  return sm[S_L + a];
}

void main() {
  tid = gl_LocalInvocationID.x;
  wg = gl_WorkGroupSize.x;
  nv = uint(info.x);
  chunks = (nv + 8u * wg - 1u) / (8u * wg);
  temp = float(sampling[0]);
  greedy = !(temp > 0.0);
#ifdef RECORD
  const int p = int(pos_data[0]);
#endif
#if defined(RECORD) && defined(DRAWS)
  if (tid == 0u && (p < 0 || p >= info.w)) {
    atomicOr(error_flags[info.z], 1u);
  }
  const float drawn = float(draws[clamp(p, 0, info.w - 1)]);
#else
  const float drawn = float(sampling[3]);
#endif
  // The maximum key: argmax (greedy) or max z.
  uint bh = 0u, bl = 0u;
#ifdef PARTIALS
  // The maximum of sample_max.glsl's per-workgroup maxima (a total order: the same).
  for (uint i = tid; i < (nv + SPAN - 1u) / SPAN; i += wg) {
    const uint h = part_data[2u * i];
    const uint l = part_data[2u * i + 1u];
    if (key_ge(h, l, bh, bl)) {
      bh = h;
      bl = l;
    }
  }
#else
  for (uint c = 0u; c < chunks; ++c) {
    [[unroll]] for (uint u = 0u; u < 8u; ++u) {
      const uint i = (c * 8u + u) * wg + tid;
      if (i < nv) {
        const uint h = fkey(z_at(i));
        const uint l = nv - 1u - i;
        if (key_ge(h, l, bh, bl)) {
          bh = h;
          bl = l;
        }
      }
    }
  }
#endif
  sm[tid] = bh;
  sm[KMAX + tid] = bl;
  barrier();
  for (uint s = wg >> 1; s > 0u; s >>= 1) {
    if (tid < s && key_ge(sm[tid + s], sm[KMAX + tid + s], sm[tid], sm[KMAX + tid])) {
      sm[tid] = sm[tid + s];
      sm[KMAX + tid] = sm[KMAX + tid + s];
    }
    barrier();
  }
  mh = sm[0];
  ml = sm[KMAX];
  barrier();
  uint fl = ml;
  if (!greedy) {
    zmax = key_float(mh);
    const float top_p = float(sampling[2]);
    const float draw = clamp(drawn, 0.0, 1.0);
    const float kf = float(sampling[1]);
    // top_k as a count: 0 (or less) and >= V keep all; top_p <= 0 keeps one.
    uint k = !(top_p > 0.0) ? 1u : (kf >= 1.0 && kf < float(nv) ? uint(kf) : nv);
    if (k > 1u) {
      uint fh = 0u;
      fl = 0u;
      // Up to three searches, each from the previous threshold (one call site: the
      // function is inlined, and a CPU driver runs a large shader slower).
      const bool list = k <= KMAX;
      for (uint mode = k < nv ? 0u : 1u; mode < (list ? 1u : 3u); ++mode) {
        if (mode != 1u || top_p < 1.0) {
          search(mode, k, mode == 1u ? top_p : draw, fh, fl);
        }
      }
      if (list) {
        fl = draw_from_list(k, fh, fl, top_p, draw);
      }
    }
  }
  if (tid == 0u) {
    const int id = int(nv - 1u - fl);
    out_data[0] = OUT_STORE(id);
#ifdef RECORD
    token_out[0] = OUT_STORE(id);
    pos_out[0] = OUT_STORE(p + 1);
    if (p >= -1 && p < info.y - 1) {
      history_out[p + 1] = OUT_STORE(id);
    } else {
      atomicOr(error_flags[info.z], 1u);
    }
#endif
  }
}
