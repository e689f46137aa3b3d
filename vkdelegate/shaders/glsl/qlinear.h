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
#include "div_rn.h"
// Row m's quantization (xs_data, xz_data: one scale / int8 zero point per row):
// (1 / scale, scale, zero point). torchao multiplies x by ATen's correctly rounded
// reciprocal; GLSL's division may be 2.5 ulp off, so the quotient is div_rn's
// (correctly rounded). XQ16 (an fp16 x: torchao's chain runs in fp16): the reciprocal
// is the fp16 tensor eager's reciprocal makes, that fp32 quotient rounded to fp16 (as
// ATen computes an fp16 op: in fp32, one rounding to fp16 at the store).
void row_qparams(int m, out float inv, out float xs, out int z) {
  xs = float(xs_data[m]);
#ifdef XQ16
  inv = round_to_half(div_rn(1.0, xs));
#else
  inv = div_rn(1.0, xs);
#endif
  z = int(xz_data[m]);
}

// x quantized as torchao's quantize_affine: clamp(roundEven(x / s) + z, -128, 127).
// XQ16: x * (1 / s) is the fp16 product eager rounds before its round (the fp32
// product of two fp16 values is exact, so one rounding, as eager's).
float quantize_x(float x, float inv, int z) {
#ifdef XQ16
  return clamp(roundEven(round_to_half(x * inv)) + float(z), -128.0, 127.0);
#else
  return clamp(roundEven(x * inv) + float(z), -128.0, 127.0);
#endif
}
#endif

#endif
