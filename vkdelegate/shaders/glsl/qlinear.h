// Shared by the quantized linears (linear_qw.glsl, linear_qw_gemv.glsl), after their
// bindings: 8da4w's per-row activation quantization and the packed int8 dot product.
#ifndef VKDELEGATE_QLINEAR_H
#define VKDELEGATE_QLINEAR_H

#ifdef INT_DOT
// OpSDot on 4 packed int8 values (SPV_KHR_integer_dot_product, core in SPIR-V 1.6:
// capabilities DotProduct 6019 and DotProductInput4x8BitPacked 6018, opcode 4450),
// through spirv_intrinsics: glslang 12 has no GL_EXT_integer_dot_product yet (the
// including shader enables GL_EXT_spirv_intrinsics first, before any declaration).
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018],
                  id = 4450)
int sdot_packed(uint a, uint b, spirv_literal int packed_vector_format);
#define dotPacked4x8EXT(a, b) sdot_packed(a, b, 0)  // PackedVectorFormat4x8Bit

// Four int8 values (in -128..127) as one packed word, v.x in the low byte.
uint packed_bytes(ivec4 v) {
  const uvec4 u = uvec4(v) & 0xFFu;
  return u.x | (u.y << 8) | (u.z << 16) | (u.w << 24);
}
#endif

#ifdef DQ8CA
#include "quantize_x.h"
// Row m's quantization (xs_data, xz_data: one scale / int8 zero point per row):
// (1 / scale as torchao's chain computes it, scale, zero point).
void row_qparams(int m, out float inv, out float xs, out int z) {
  xs = float(xs_data[m]);
  inv = inverse_scale(xs);
  z = int(xz_data[m]);
}
#endif

#endif
