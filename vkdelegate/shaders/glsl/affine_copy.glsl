#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"

// Affine copy: the one shader behind view, permute, expand, slice, select, flip,
// repeat, cat, split, constant_pad_nd, clone and _to_copy (see
// vkdelegate/kernels/affine_copy.py, which builds the plan this shader reads).
//
// One invocation per element of a "domain" (up to 8 dims, innermost first). For
// domain coordinates c_d:
//   out index = out_offset + sum(c_d * out_stride_d)
//   source coordinate s_d = start_d + c_d * step_d       (mode 0, AFFINE)
//                     s_d = c_d % bound_d                (mode 1, MODULO: repeat)
//                     s_d = start_d + c_d * step_d, fill if outside [0, bound_d)
//                                                        (mode 2, PAD)
//   in index  = in_offset + sum(s_d * in_stride_d)
// Values convert from the input dtype to the output dtype as torch converts them
// (float -> int truncates toward zero, int8/uint8 wrap, bool is x != 0).
// Defines: OUT_T, IN_T (storage types), OUT_STORE(v) (see runtime/dtypes.py), IN_ACC
// (float or int), and one of OUT_FLOAT, OUT_INT, OUT_BOOL.

TENSOR_OUT(out_data, OUT_T)
TENSOR_IN(in_data, IN_T)
PARAMS(plan_block) {
  ivec4 domain[2];      // domain sizes, innermost first, padded with 1
  ivec4 out_stride[2];
  ivec4 step[2];
  ivec4 start[2];
  ivec4 in_stride[2];
  ivec4 bound[2];
  ivec4 mode[2];        // (the shader reads MODULO_DIMS and PAD_DIMS instead)
  ivec4 info;           // x: invocations (CHUNK 1: the domain's numel), y: out
                        // offset, z: in offset, w: int fill
  vec4 ffill;           // x: float fill
  ivec4 chunks;         // x: CHUNK > 1: chunks per row of the innermost dim; y:
                        // CHECK_INT32's error-flag word
};
// CHECK_INT32 (float -> int64, kernels/affine_copy.py checked_cast): a value that does
// not truncate into the int32 range the device holds int64 in sets error_flags[chunks.y]
// (int_checked.h) instead of converting to an undefined int.
#ifdef CHECK_INT32
#include "int_checked.h"
#endif

// CONVERT: input ACC value -> output ACC value; OUT_STORE (from storage_defines) then
// rounds to fp16 or wraps to int8/uint8 exactly as the output dtype holds it.
#if defined(OUT_FLOAT)
#define OUT_ACC float
#define CONVERT(v) float(v)
#define FILL ffill.x
#elif defined(OUT_BOOL)
#define OUT_ACC int
#define CONVERT(v) ((v) != IN_ACC(0) ? 1 : 0)
#define FILL info.w
#elif defined(CHECK_INT32)
#define OUT_ACC int
#define CONVERT(v) to_int_checked(v)
#define FILL info.w
#else
#define OUT_ACC int
#define CONVERT(v) int(v)
#define FILL info.w
#endif

// The plan's rank, fixed per node (resizes change sizes, never the rank): the loop
// below runs only over real dims. Integer division has no SIMD form on CPUs
// (llvmpipe scalarizes it), so every division saved counts: the outermost dim needs
// none, and a flat copy (view, clone, _to_copy) none at all.
layout(constant_id = 3) const int NDIM = 8;
// Which dims are MODULO and which PAD (bit d for dim d, innermost first), fixed per
// node like the rank: llvmpipe runs both sides of every branch under a lane mask, so
// a mode read from the plan made every dim of every copy pay a modulo (lane by lane):
// as constants, an AFFINE dim costs a multiply-add.
layout(constant_id = 4) const int MODULO_DIMS = 0;
layout(constant_id = 5) const int PAD_DIMS = 0;

// CHUNK (kernels/affine_copy.py chunk_for): domain elements per invocation along the
// innermost dim, 1 or, on CPU drivers, 4 consecutive ones (never for a MODULO
// innermost dim): an invocation then walks the outer dims (divisions, parameter
// loads, multiply-adds) once for all of them, and dim 0 counts chunks
// (chunks.x per row of the innermost dim).
layout(constant_id = 6) const int CHUNK = 1;

void main() {
  const uint i = linear_id();
  if (i >= uint(info.x)) {
    return;
  }
  uint rem = i;
  int o = info.y;
  int src = info.z;
  bool inside = true;
  int c0 = 0;  // CHUNK > 1: the innermost coordinate of the invocation's first element
  [[unroll]] for (int d = 0; d < NDIM; ++d) {
    const bool chunked = CHUNK > 1 && d == 0;
    int c;
    if (d == NDIM - 1) {
      c = int(rem);
    } else {
      const uint size = uint(chunked ? chunks.x : domain[d >> 2][d & 3]);
      const uint q = rem / size;
      c = int(rem - q * size);
      rem = q;
    }
    if (chunked) {
      c0 = c * CHUNK;
    } else {
      o += c * out_stride[d >> 2][d & 3];
      int s;
      if (((MODULO_DIMS >> d) & 1) != 0) {
        s = c % bound[d >> 2][d & 3];
      } else {
        s = start[d >> 2][d & 3] + c * step[d >> 2][d & 3];
        if (((PAD_DIMS >> d) & 1) != 0) {
          inside = inside && s >= 0 && s < bound[d >> 2][d & 3];
        }
      }
      src += s * in_stride[d >> 2][d & 3];
    }
  }
  if (CHUNK == 1) {
    OUT_ACC v;
    if (inside) {
      v = CONVERT(IN_ACC(in_data[src]));
    } else {
      v = FILL;
    }
    out_data[o] = OUT_STORE(v);
  } else {
    // Dim 0 is AFFINE or PAD here: element j's source coordinate is s0 + j * step.
    const int size0 = domain[0].x, step0 = step[0].x, in_stride0 = in_stride[0].x;
    const int s0 = start[0].x + c0 * step0;
    o += c0 * out_stride[0].x;
    [[unroll]] for (int j = 0; j < CHUNK; ++j) {
      if (c0 + j < size0) {
        const int s = s0 + j * step0;
        bool in_j = inside;
        if ((PAD_DIMS & 1) != 0) {
          in_j = in_j && s >= 0 && s < bound[0].x;
        }
        OUT_ACC v;
        if (in_j) {
          v = CONVERT(IN_ACC(in_data[src + s * in_stride0]));
        } else {
          v = FILL;
        }
        out_data[o + j * out_stride[0].x] = OUT_STORE(v);
      }
    }
  }
#ifdef CHECK_INT32
  report_overflow(chunks.y);
#endif
}
