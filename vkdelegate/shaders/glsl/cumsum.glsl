#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"

// Cumulative sum along one dim (vkdelegate/ops/families/cumsum.py): one invocation per
// line (every element with the cumsum dim's coordinate removed) walks it in order,
// 16 elements per loop iteration ([[unroll]]ed: llvmpipe ends an invocation's loops
// after LOOP_LIMIT iterations). Defines: OUT_T, IN_T, OUT_STORE(v), ACC_T (float:
// fp32 sums, also for fp16 data; int: int32 sums), IN_LOAD(v) (storage -> ACC_T).
// `dim.x` is the dim as a metadata index (innermost first). In and out are contiguous
// with the same sizes, so an element has the same offset in both.
// CHECK_INT32 (int64 results): the sums use int_checked.h's add_checked, and a partial
// sum past the int32 range sets error_flags[dim.y].

TENSOR_OUT(out_data, OUT_T)
TENSOR_IN(in_data, IN_T)
TENSOR_META(out_meta)
TENSOR_META(in_meta)
PARAMS(cumsum_block) { ivec4 dim; };
#ifdef CHECK_INT32
#include "int_checked.h"
#define ACC_ADD(acc, v) add_checked(acc, v)
#else
#define ACC_ADD(acc, v) ((acc) + (v))
#endif

void main() {
  const uint o = linear_id();
  const int n = size_at(in_meta, dim.x);
  if (n == 0 || o >= uint(numel_of(in_meta) / n)) {
    return;
  }
  uint rem = o;
  int base = 0;
  [[unroll]] for (int d = 0; d < 8; ++d) {
    if (d != dim.x) {
      const int size = size_at(in_meta, d);
      base += int(rem % uint(size)) * stride_at(in_meta, d);
      rem /= uint(size);
    }
  }
  const int stride = stride_at(in_meta, dim.x);
  ACC_T acc = ACC_T(0);
  for (int r0 = 0; r0 < n; r0 += 16) {
    [[unroll]] for (int j = 0; j < 16; ++j) {
      const int r = r0 + j;
      if (r < n) {
        const int at = base + r * stride;
        acc = ACC_ADD(acc, IN_LOAD(in_data[at]));
        out_data[at] = OUT_STORE(acc);
      }
    }
  }
#ifdef CHECK_INT32
  report_overflow(dim.y);
#endif
}
