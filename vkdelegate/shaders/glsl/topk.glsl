#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"

// The k largest (or smallest) elements along one dim, sorted, with their indices
// (vkdelegate/ops/families/topk.py): one invocation per line (every element with the
// topk dim's coordinate removed) walks it in order and keeps its best k in a sorted
// list of TOPK_MAX slots (an insertion sort, the slot loop [[unroll]]ed so that only
// the walk over the line counts against llvmpipe's loop limit). Order: NaN above
// everything (as ATen: first for largest, last for smallest), then by value, equal
// values (-0.0 == 0.0 included) by lower index first (torch.sort(stable=True)'s order).
// Defines: OUT_T, OUT_STORE(v) (values), IN_T, IDX_T, IDX_STORE(v) (int64 indices are
// int32 on the device). `topk.x`: the dim as a metadata index (innermost first), `.y`:
// k (<= TOPK_MAX), `.z`: 1 for largest. Input and outputs are contiguous and have the
// same sizes but along the dim.

#define TOPK_MAX 16

TENSOR_OUT(out_data, OUT_T)
TENSOR_OUT(idx_data, IDX_T)
TENSOR_IN(in_data, IN_T)
TENSOR_META(out_meta)
TENSOR_META(in_meta)
PARAMS(topk_block) { ivec4 topk; };

// Whether (a, ai) comes before (b, bi) in the result; an empty slot (index -1) comes
// after every element.
bool before(float a, int ai, float b, int bi, bool largest) {
  if (bi < 0 || ai < 0) {
    return bi < 0 && ai >= 0;
  }
  const bool an = isnan(a), bn = isnan(b);
  if (an || bn) {
    // NaN counts as the largest value for either direction.
    return an && bn ? ai < bi : (largest ? an : bn);
  }
  if (a == b) {
    return ai < bi;
  }
  return largest ? a > b : a < b;
}

void main() {
  const uint o = linear_id();
  const int d = topk.x, k = topk.y;
  const bool largest = topk.z != 0;
  const int n = size_at(in_meta, d);
  if (n == 0 || k == 0 || o >= uint(numel_of(in_meta) / n)) {
    return;
  }
  uint rem = o;
  int in_base = 0, out_base = 0;
  [[unroll]] for (int j = 0; j < 8; ++j) {
    if (j != d) {
      const int size = size_at(in_meta, j);
      const int c = int(rem % uint(size));
      in_base += c * stride_at(in_meta, j);
      out_base += c * stride_at(out_meta, j);
      rem /= uint(size);
    }
  }
  float vals[TOPK_MAX];
  int idxs[TOPK_MAX];
  [[unroll]] for (int s = 0; s < TOPK_MAX; ++s) {
    vals[s] = 0.0;
    idxs[s] = -1;
  }
  const int in_stride = stride_at(in_meta, d);
  for (int r = 0; r < n; ++r) {
    float cv = float(in_data[in_base + r * in_stride]);
    int ci = r;
    if (!before(cv, ci, vals[k - 1], idxs[k - 1], largest)) {
      continue;  // not better than the k-th best so far
    }
    // Carry the element down the list: each slot keeps the better of itself and the
    // carry, and passes the other on (the last one carried past slot k-1 drops out).
    [[unroll]] for (int s = 0; s < TOPK_MAX; ++s) {
      if (s < k && before(cv, ci, vals[s], idxs[s], largest)) {
        const float tv = vals[s];
        const int ti = idxs[s];
        vals[s] = cv;
        idxs[s] = ci;
        cv = tv;
        ci = ti;
      }
    }
  }
  const int out_stride = stride_at(out_meta, d);
  [[unroll]] for (int s = 0; s < TOPK_MAX; ++s) {
    if (s < k) {
      const int at = out_base + s * out_stride;
      out_data[at] = OUT_STORE(vals[s]);
      idx_data[at] = IDX_STORE(idxs[s]);
    }
  }
}
