#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"
#include "index_check.h"

// aten.gather: out[c] = in[c with c[dim] replaced by index[c]]; index has the output's
// sizes (each at most the input's, except along dim). Out-of-range indices, negative
// ones included (an error in ATen), set this node's error flag (index_check.h) and are
// clamped so that no read leaves the buffer.
// Defines: OUT_T, IN_T, IDX_T (storage types), OUT_STORE(v), IN_ACC (float or int).

TENSOR_OUT(out_data, OUT_T)
TENSOR_IN(in_data, IN_T)
TENSOR_IN(index_data, IDX_T)
TENSOR_META(out_meta)
TENSOR_META(in_meta)
PARAMS(gather_block) {
  ivec4 info;  // x: gathered dim, counted from the innermost (0); y: error-flag word
};

// The tensors' rank: the loop runs over real dims only (integer division is slow on
// CPU drivers); the outermost dim needs no division.
layout(constant_id = 3) const int NDIM = 8;

void main() {
  const uint i = linear_id();
  if (i >= uint(numel_of(out_meta))) {
    return;
  }
  const int idx = checked_index(int(index_data[i]), size_at(in_meta, info.x), false,
                                info.y);
  uint rem = i;
  int src = 0;
  [[unroll]] for (int d = 0; d < NDIM; ++d) {
    int c;
    if (d == NDIM - 1) {
      c = int(rem);
    } else {
      const uint q = rem / uint(size_at(out_meta, d));
      c = int(rem - q * uint(size_at(out_meta, d)));
      rem = q;
    }
    src += (d == info.x ? idx : c) * stride_at(in_meta, d);
  }
  out_data[i] = OUT_STORE(IN_ACC(in_data[src]));
}
