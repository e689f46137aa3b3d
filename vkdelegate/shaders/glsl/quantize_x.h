// 8da4w's activation quantization, shared by choose_qparams.glsl (its QX form, which
// writes the quantized row once) and qlinear.h (the products that quantize x as they
// load it): the same float operations in both, so the same int8 values.
// XQ16: x is fp16 (torchao's chain then runs in fp16 and rounds each op to fp16).
#ifndef VKDELEGATE_QUANTIZE_X_H
#define VKDELEGATE_QUANTIZE_X_H
#include "div_rn.h"

// 1 / scale as torchao multiplies by it: ATen's correctly rounded reciprocal (GLSL's
// division may be 2.5 ulp off, so div_rn's quotient); XQ16: the fp16 tensor eager's
// reciprocal makes, that fp32 quotient rounded to fp16 (as ATen computes an fp16 op:
// in fp32, one rounding to fp16 at the store).
float inverse_scale(float xs) {
#ifdef XQ16
  return round_to_half(div_rn(1.0, xs));
#else
  return div_rn(1.0, xs);
#endif
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
