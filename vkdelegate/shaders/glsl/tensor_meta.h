// Tensor metadata uniform block, written by vkdelegate.runtime.params.meta_record and
// declared in Python by param_block.STRUCTS["TensorMeta"] (std140; every member is an
// ivec4, so the layout is 16-byte rows, 80 bytes).
// One buffer per tensor, bound by every node that reads or writes the tensor; a resize
// rewrites it once and no command buffer is re-recorded.
#ifndef VKDELEGATE_TENSOR_META_H
#define VKDELEGATE_TENSOR_META_H

struct TensorMeta {
  ivec4 sizes[2];    // sizes, innermost dim first (dim ndim-1 at index 0), padded with 1
  ivec4 strides[2];  // element strides in the same order, padded with 0
  ivec4 info;        // x: numel, y: ndim
};

#define TENSOR_META(name) \
  layout(set = 0, binding = BINDING_##name) PARAM_BLOCK name##_block { TensorMeta name; };

// d counts from the innermost dim (0) outwards, as in the struct. Loop over dims with
// `[[unroll]] for (int d = 0; d < 8; ++d)` (padded dims have size 1, stride 0) so that
// d is a constant: a dynamic index into the ivec4s made a broadcasting add 14x slower
// on llvmpipe.
int size_at(TensorMeta m, int d) { return m.sizes[d >> 2][d & 3]; }
int stride_at(TensorMeta m, int d) { return m.strides[d >> 2][d & 3]; }
int numel_of(TensorMeta m) { return m.info.x; }
int ndim_of(TensorMeta m) { return m.info.y; }

#endif
