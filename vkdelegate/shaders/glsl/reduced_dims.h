// Index arithmetic of the reductions over a set of dims (reduce.glsl, reduce_sum.glsl).
// The including shader declares the input's metadata block `in_meta` and `mask` (an
// ivec4 whose x is the reduced dims' bitmask, bit d for metadata dim d, innermost
// first) before including this header. The output is contiguous over the kept dims in
// their order, keepdim or not, so an output index maps to the kept-dim coordinates of
// the input directly. Sizes come from in_meta (resizable).
#ifndef VKDELEGATE_REDUCED_DIMS_H
#define VKDELEGATE_REDUCED_DIMS_H

// Offset in the input of output element o's first reduced element, and how many
// elements it reduces.
int kept_base(uint o, out uint count) {
  uint rem = o;
  int base = 0;
  count = 1u;
  [[unroll]] for (int d = 0; d < 8; ++d) {
    const int size = size_at(in_meta, d);
    if ((mask.x & (1 << d)) != 0) {
      count *= uint(size);
    } else {
      base += int(rem % uint(size)) * stride_at(in_meta, d);
      rem /= uint(size);
    }
  }
  return base;
}

// Offset of the r-th reduced element (row-major over the reduced dims) from `base`.
int reduced_offset(int base, uint r) {
  int offset = base;
  [[unroll]] for (int d = 0; d < 8; ++d) {
    if ((mask.x & (1 << d)) != 0) {
      const int size = size_at(in_meta, d);
      offset += int(r % uint(size)) * stride_at(in_meta, d);
      r /= uint(size);
    }
  }
  return offset;
}

#endif
