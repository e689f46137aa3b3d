// Correctly rounded fp32 division, shared by choose_qparams.glsl and qlinear.h (8da4w's
// activation quantization), which must give the CPU's bits.
#ifndef VKDELEGATE_DIV_RN_H
#define VKDELEGATE_DIV_RN_H

// a / b (b > 0) rounded to nearest even, as the CPU's division: GLSL's `/` may be off
// by a few ulp (Vulkan allows 2.5; the H100 gave a row's scale one ulp off). The
// quotient is corrected once by its remainder, which brings it within an ulp, so that
// the remainder r = a - q b is exact (one fma); then the true quotient lies past the
// midpoint to a neighbour q' exactly when r passes (q' - q) / 2 * b (exact: a power of
// two times b), and equals it at a tie (then the even mantissa). Finite nonzero
// quotients only (the others are returned as they are).
float next_toward(float q, bool up) {
  const uint u = floatBitsToUint(q);
  return uintBitsToFloat((q > 0.0) == up ? u + 1u : u - 1u);
}

float div_rn(float a, float b) {
  float q = a / b;
  if (isinf(q) || isnan(q) || q == 0.0) {
    return q;
  }
  q += fma(-q, b, a) / b;
  if (q == 0.0) {
    return q;
  }
  precise const float r = fma(-q, b, a);
  const float qu = next_toward(q, true);
  const float qd = next_toward(q, false);
  precise const float hu = (qu - q) * 0.5 * b;
  precise const float hd = (q - qd) * 0.5 * b;
  if (r > hu || (r == hu && (floatBitsToUint(qu) & 1u) == 0u)) {
    return qu;
  }
  if (r < -hd || (r == -hd && (floatBitsToUint(qd) & 1u) == 0u)) {
    return qd;
  }
  return q;
}

#endif
