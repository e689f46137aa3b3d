// The ROTARY epilogue of a merged q/k/v GEMV (kernels/rotary_cache.py), shared by
// gemv.glsl (vkdelegate.rms_norm_linear_rotary_cache) and linear_qw_gemv.glsl (its int4
// / int8 weight-only forms): the product y [N] of one row (N = Nq + 2 Nk: q | k | v) is
// never stored; its rows are taken as units of two (``rotary_row``: a q or k head's
// rotary pair (h D + i, h D + i + D/2), or two adjacent v rows), and each unit's two
// sums are finished as the plain product finishes them (ROTARY_FINISH), rounded as its
// store rounds them (ROTARY_ROUND), then rotated (rotary_half.h) into q' (out_data, q's
// order) or k' (cache_data at the position's row, scatter_pair.h), or written as v
// (cache2_data); an index ATen rejects sets error_flags[rot.w] and writes nothing.
// Include after the product's bindings and its epilogue; the including shader defines
// OUT_T, OUT_STORE(v), F_T, IDX_T, ROTARY_ROUND(v) and ROTARY_FINISH(s, ctx, n) (row
// n's finished value from its sum s; ctx: what the shader's epilogue needs besides,
// passed through ``rotary_out``).
#ifndef VKDELEGATE_ROTARY_CACHE_H
#define VKDELEGATE_ROTARY_CACHE_H

TENSOR_OUT(cache_data, OUT_T)
TENSOR_OUT(cache2_data, OUT_T)
TENSOR_IN(cos_data, F_T)
TENSOR_IN(sin_data, F_T)
TENSOR_IN(index_data, IDX_T)
PARAMS(rotary_cache_block) {
  ivec4 rot;        // x: Nq, y: Nk (v's rows alike), z: D / 2, w: error-flag word
  ivec4 sizes;      // q's sizes, outermost first, padded with leading 1s to rank 4
  ivec4 fstrides;   // element strides of cos/sin along q's 4 dims (0: broadcast)
  ivec4 sizes2;     // k's sizes
  ivec4 fstrides2;  // element strides of cos/sin along k's 4 dims
  ivec4 scatter;    // x: region numel, y: inner, z: count, w: size of the dim
};
#include "index_check.h"
#include "rotary_half.h"
#include "scatter_pair.h"

// The product's row of unit u (its ``second`` row or its first): the units below
// (Nq + Nk) / 2 are the q and k heads' rotary pairs in order, then v's row pairs.
int rotary_row(int u, bool second) {
  const int half_d = rot.z;
  const int pairs = (rot.x + rot.y) / 2;
  if (u < pairs) {
    return (u / half_d) * 2 * half_d + u % half_d + (second ? half_d : 0);
  }
  return rot.x + rot.y + 2 * (u - pairs) + (second ? 1 : 0);
}

// What unit u's epilogue reads besides its sums, loaded before the products so that
// the loads' latency hides behind them: the cos/sin of its two elements (q, k) and
// their raw positions (k, v).
struct RotaryLoads {
  float c0, s0, c1, s1;
  int p0, p1;
};

RotaryLoads rotary_loads(int u) {
  const int r0 = rotary_row(u, false);
  const int r1 = rotary_row(u, true);
  const int nq = rot.x;
  const int nk = rot.y;
  RotaryLoads l = RotaryLoads(0.0, 0.0, 0.0, 0.0, 0, 0);
  if (r0 < nq + nk) {
    const bool is_q = r0 < nq;
    const uint e0 = uint(is_q ? r0 : r0 - nq);
    const uint e1 = uint(is_q ? r1 : r1 - nq);
    const uint f0 = is_q ? rotary_freq_index(e0, sizes, fstrides)
                         : rotary_freq_index(e0, sizes2, fstrides2);
    const uint f1 = is_q ? rotary_freq_index(e1, sizes, fstrides)
                         : rotary_freq_index(e1, sizes2, fstrides2);
    l.c0 = float(cos_data[f0]);
    l.s0 = float(sin_data[f0]);
    l.c1 = float(cos_data[f1]);
    l.s1 = float(sin_data[f1]);
    if (is_q) {
      return l;
    }
  }
  const uint i0 = uint(r0 < nq + nk ? r0 - nq : r0 - nq - nk);
  const uint i1 = uint(r0 < nq + nk ? r1 - nq : r1 - nq - nk);
  l.p0 = int(index_data[scatter_index(i0, scatter)]);
  l.p1 = int(index_data[scatter_index(i1, scatter)]);
  return l;
}

// Unit u's outputs from its two sums s0 (its first row) and s1 and its loads l: each
// value as the product's store would keep it, then q' stored, k' or v written into
// its cache row.
void rotary_out(float s0, float s1, int ctx, int u, RotaryLoads l) {
  const int r0 = rotary_row(u, false);
  const int r1 = rotary_row(u, true);
  const float x0 = ROTARY_ROUND(ROTARY_FINISH(s0, ctx, r0));
  const float x1 = ROTARY_ROUND(ROTARY_FINISH(s1, ctx, r1));
  const int nq = rot.x;
  const int nk = rot.y;
  if (r0 < nq) {  // x0 is in the first half of its head, x1 its partner
    out_data[r0] = OUT_STORE(rotary_half_cs(x0, -x1, l.c0, l.s0));
    out_data[r1] = OUT_STORE(rotary_half_cs(x1, x0, l.c1, l.s1));
    return;
  }
  uint at;
  if (r0 < nq + nk) {
    if (scatter_at(uint(r0 - nq), scatter, rot.w, l.p0, at)) {
      cache_data[at] = OUT_STORE(rotary_half_cs(x0, -x1, l.c0, l.s0));
    }
    if (scatter_at(uint(r1 - nq), scatter, rot.w, l.p1, at)) {
      cache_data[at] = OUT_STORE(rotary_half_cs(x1, x0, l.c1, l.s1));
    }
    return;
  }
  if (scatter_at(uint(r0 - nq - nk), scatter, rot.w, l.p0, at)) {
    cache2_data[at] = OUT_STORE(x0);
  }
  if (scatter_at(uint(r1 - nq - nk), scatter, rot.w, l.p1, at)) {
    cache2_data[at] = OUT_STORE(x1);
  }
}

#endif
