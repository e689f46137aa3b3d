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
// No sort: each token's place in the order is the 64-bit key (orderable bits of z,
// V - 1 - index), larger first, and every threshold (the k-th key, the top-p cut, the
// drawn token) is the largest key T whose masked count/mass F(T) = sum over keys >= T
// passes a monotone test, found bit by bit (32 + log2 V passes over the logits, each a
// workgroup tree sum in a fixed order, so equal inputs give equal sums).
// Defines: OUT_T (int storage), IN_T (logit storage), SAMP_T, OUT_STORE(v).

#define MAX_WG 1024u

TENSOR_OUT(out_data, OUT_T)
TENSOR_IN(logits, IN_T)
TENSOR_IN(sampling, SAMP_T)
PARAMS(sample_block) {
  ivec4 info;  // x: V (number of logits)
};

shared float red_f[MAX_WG];
shared uint red_h[MAX_WG];
shared uint red_l[MAX_WG];

uint tid, wg, nv, chunks;
float temp, zmax;
bool greedy;

// Orderable bits of a float (larger float, larger uint); -0 is 0.
uint fkey(float z) {
  const uint u = floatBitsToUint(z == 0.0 ? 0.0 : z);
  return (u & 0x80000000u) != 0u ? ~u : (u | 0x80000000u);
}

float key_float(uint k) {
  return uintBitsToFloat((k & 0x80000000u) != 0u ? (k & 0x7fffffffu) : ~k);
}

float z_at(uint i) {
  const float x = float(logits[i]);
  return greedy ? x : x / temp;
}

bool key_ge(uint h, uint l, uint th, uint tl) {
  return h > th || (h == th && l >= tl);
}

float wg_sum(float v) {
  red_f[tid] = v;
  barrier();
  for (uint s = wg >> 1; s > 0u; s >>= 1) {
    if (tid < s) {
      red_f[tid] += red_f[tid + s];
    }
    barrier();
  }
  const float r = red_f[0];
  barrier();
  return r;
}

// Count (mass == false) or mass of the tokens whose key is >= (th, tl).
float masked_sum(uint th, uint tl, bool mass) {
  float acc = 0.0;
  for (uint c = 0u; c < chunks; ++c) {
    [[unroll]] for (uint u = 0u; u < 8u; ++u) {
      const uint i = (c * 8u + u) * wg + tid;
      if (i < nv) {
        const float z = z_at(i);
        if (key_ge(fkey(z), nv - 1u - i, th, tl)) {
          acc += mass ? exp(z - zmax) : 1.0;
        }
      }
    }
  }
  return wg_sum(acc);
}

// The largest key T with F(max(T, floor)) >= target (mode 0: count, 1: mass) or
// > target (mode 2: mass), max'ed with the floor (fh, fl).
void search(int mode, float target, inout uint fh, inout uint fl, uint lo_bits) {
  uint h = 0u, l = 0u;
  for (int b = 31; b >= 0; --b) {
    const uint ch = h | (1u << uint(b));
    const bool floor_wins = !key_ge(ch, 0u, fh, fl);
    const float f = masked_sum(floor_wins ? fh : ch, floor_wins ? fl : 0u, mode != 0);
    if (mode == 2 ? f > target : f >= target) {
      h = ch;
    }
  }
  for (int b = int(lo_bits) - 1; b >= 0; --b) {
    const uint cl = l | (1u << uint(b));
    const bool floor_wins = !key_ge(h, cl, fh, fl);
    const float f = masked_sum(floor_wins ? fh : h, floor_wins ? fl : cl, mode != 0);
    if (mode == 2 ? f > target : f >= target) {
      l = cl;
    }
  }
  if (key_ge(h, l, fh, fl)) {
    fh = h;
    fl = l;
  }
}

void main() {
  tid = gl_LocalInvocationID.x;
  wg = gl_WorkGroupSize.x;
  nv = uint(info.x);
  chunks = (nv + 8u * wg - 1u) / (8u * wg);
  temp = float(sampling[0]);
  greedy = !(temp > 0.0);
  // The maximum key: argmax (greedy) or max z.
  uint mh = 0u, ml = 0u;
  for (uint c = 0u; c < chunks; ++c) {
    [[unroll]] for (uint u = 0u; u < 8u; ++u) {
      const uint i = (c * 8u + u) * wg + tid;
      if (i < nv) {
        const uint h = fkey(z_at(i));
        const uint l = nv - 1u - i;
        if (key_ge(h, l, mh, ml)) {
          mh = h;
          ml = l;
        }
      }
    }
  }
  red_h[tid] = mh;
  red_l[tid] = ml;
  barrier();
  for (uint s = wg >> 1; s > 0u; s >>= 1) {
    if (tid < s && key_ge(red_h[tid + s], red_l[tid + s], red_h[tid], red_l[tid])) {
      red_h[tid] = red_h[tid + s];
      red_l[tid] = red_l[tid + s];
    }
    barrier();
  }
  mh = red_h[0];
  ml = red_l[0];
  barrier();
  uint fh = 0u, fl = 0u;  // the smallest key kept so far
  if (!greedy) {
    zmax = key_float(mh);
    const uint lo_bits = nv > 1u ? uint(findMSB(nv - 1u)) + 1u : 0u;
    const float top_p = float(sampling[2]);
    int top_k = int(float(sampling[1]));
    if (!(top_p > 0.0)) {
      top_k = 1;
    }
    if (top_k > 0 && uint(top_k) < nv) {
      search(0, float(top_k), fh, fl, lo_bits);
    }
    if (top_p > 0.0 && top_p < 1.0) {
      search(1, top_p * masked_sum(fh, fl, true), fh, fl, lo_bits);
    }
    const float draw = clamp(float(sampling[3]), 0.0, 1.0);
    search(2, draw * masked_sum(fh, fl, true), fh, fl, lo_bits);
    ml = fl;
  }
  if (tid == 0u) {
    out_data[0] = OUT_STORE(int(nv - 1u - ml));
  }
}
