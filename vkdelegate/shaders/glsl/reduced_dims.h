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
// It also copies the reduced dims' sizes and strides into rd_size / rd_stride (size 1
// and stride 0 for kept dims), which reduced_offset reads in the hot loop: registers,
// not parameter-block loads per element (a storage buffer on lavapipe, see common.h;
// 2.5x faster there for a long cooperative sum).
// REDUCED_RUN (Python: kernels/dims.run_defines): the reduced dims are consecutive, so
// in a contiguous tensor the r-th reduced element is r * run_stride from the base.
int rd_size[8];
int rd_stride[8];
#ifdef REDUCED_RUN
int run_stride = 0;
#endif

int kept_base(uint o, out uint count) {
  uint rem = o;
  int base = 0;
  count = 1u;
  [[unroll]] for (int d = 0; d < 8; ++d) {
    const int size = size_at(in_meta, d);
    const bool reduced = (mask.x & (1 << d)) != 0;
    rd_size[d] = reduced ? size : 1;
    rd_stride[d] = reduced ? stride_at(in_meta, d) : 0;
    if (reduced) {
#ifdef REDUCED_RUN
      if (run_stride == 0) {
        run_stride = stride_at(in_meta, d);  // the lowest reduced dim's
      }
#endif
      count *= uint(size);
    } else {
      base += int(rem % uint(size)) * stride_at(in_meta, d);
      rem /= uint(size);
    }
  }
  return base;
}

// Offset of the r-th reduced element (row-major over the reduced dims) from `base`.
// Call kept_base first (it fills rd_size / rd_stride).
int reduced_offset(int base, uint r) {
#ifdef REDUCED_RUN
  return base + int(r) * run_stride;
#endif
  int offset = base;
  [[unroll]] for (int d = 0; d < 8; ++d) {
    const uint size = uint(rd_size[d]);
    offset += int(r % size) * rd_stride[d];
    r /= size;
  }
  return offset;
}

#endif
