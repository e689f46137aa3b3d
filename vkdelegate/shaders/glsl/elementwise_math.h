// Scalar helpers for the elementwise shaders (unary_op, binary_op, where): ATen's
// results at the edges where GLSL leaves them undefined (NaN inputs to min/max, log
// and pow outside their domain, integer division of negative numbers), and erf, which
// GLSL lacks. Include after common.h; ACC_FLOAT is set when ACC_T is float.
#ifndef VKDELEGATE_ELEMENTWISE_MATH_H
#define VKDELEGATE_ELEMENTWISE_MATH_H

#define INF_F uintBitsToFloat(0x7f800000u)

// KEEP_NAN(x, e): e, except NaN where x is NaN (ATen's clamp/relu propagate NaN; GLSL
// min/max may return either operand). Integers have no NaN.
#ifdef ACC_FLOAT
#define KEEP_NAN(x, e) (isnan(x) ? (x) : (e))
#else
#define KEEP_NAN(x, e) (e)
#endif

// erf by Abramowitz & Stegun 7.1.26 (absolute error < 1.5e-7, below fp32 tolerance
// for gelu's use).
float erf_approx(float x) {
  const float t = 1.0 / (1.0 + 0.3275911 * abs(x));
  const float poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741
      + t * (-1.453152027 + t * 1.061405429))));
  const float y = 1.0 - poly * exp(-x * x);
  return x < 0.0 ? -y : y;
}

// erfinv by M. Giles, "Approximating the erfinv function" (GPU Computing Gems, 2011),
// the single-precision form: relative error below 3e-7 on (-1, 1). -log(1 - x^2) near
// 1 carries Vulkan's absolute log error of 2^-21, about 1e-7 relative in the result.
// ATen's edges: +-1 give +-inf, |x| > 1 and NaN give NaN.
float erfinv_approx(float x) {
  const float ax = abs(x);
  if (!(ax < 1.0)) {
    return ax == 1.0 ? x * INF_F : NAN_F;
  }
  float w = -log((1.0 - x) * (1.0 + x));
  float p;
  if (w < 5.0) {
    w = w - 2.5;
    p = 2.81022636e-08;
    p = 3.43273939e-07 + p * w;
    p = -3.5233877e-06 + p * w;
    p = -4.39150654e-06 + p * w;
    p = 0.00021858087 + p * w;
    p = -0.00125372503 + p * w;
    p = -0.00417768164 + p * w;
    p = 0.246640727 + p * w;
    p = 1.50140941 + p * w;
  } else {
    w = sqrt(w) - 3.0;
    p = -0.000200214257;
    p = 0.000100950558 + p * w;
    p = 0.00134934322 + p * w;
    p = -0.00367342844 + p * w;
    p = 0.00573950773 + p * w;
    p = -0.0076224613 + p * w;
    p = 0.00943887047 + p * w;
    p = 1.00167406 + p * w;
    p = 2.83297682 + p * w;
  }
  return p * x;
}

// exp(x) - 1 and log(1 + x) without the cancellation of the naive formulas near 0.
// For |x| <= 0.5 both are series in plain arithmetic: Vulkan lets exp/log carry an
// absolute error of 2^-21 near 1, which is the whole answer near 0.
float expm1_accurate(float x) {
  if (!(abs(x) <= 0.5)) {
    return exp(x) - 1.0;  // also NaN, +-inf
  }
  // Taylor series to x^11/11! (remainder below 1e-12 for |x| <= 0.5), Horner form.
  float p = 1.0 / 39916800.0;
  p = p * x + 1.0 / 3628800.0;
  p = p * x + 1.0 / 362880.0;
  p = p * x + 1.0 / 40320.0;
  p = p * x + 1.0 / 5040.0;
  p = p * x + 1.0 / 720.0;
  p = p * x + 1.0 / 120.0;
  p = p * x + 1.0 / 24.0;
  p = p * x + 1.0 / 6.0;
  p = p * x + 0.5;
  p = p * x + 1.0;
  return p * x;
}

float log1p_accurate(float x) {
  if (x < -1.0) {
    return NAN_F;
  }
  if (x == -1.0) {
    return -INF_F;
  }
  if (!(abs(x) <= 0.5)) {
    return log(1.0 + x);  // also NaN, +inf
  }
  // log(1 + x) = 2 atanh(s), s = x / (2 + x), |s| <= 0.2: odd series to s^15.
  const float s = x / (2.0 + x);
  const float s2 = s * s;
  float p = 1.0 / 15.0;
  p = p * s2 + 1.0 / 13.0;
  p = p * s2 + 1.0 / 11.0;
  p = p * s2 + 1.0 / 9.0;
  p = p * s2 + 1.0 / 7.0;
  p = p * s2 + 1.0 / 5.0;
  p = p * s2 + 1.0 / 3.0;
  p = p * s2 + 1.0;
  return 2.0 * s * p;
}

// log with ATen's edges: NaN below 0, -inf at 0.
float log_edges(float x) {
  return x < 0.0 ? NAN_F : (x == 0.0 ? -INF_F : log(x));
}

// 1/x with a signed infinity at +-0 (IEEE, as ATen).
float recip_edges(float x) {
  return x == 0.0 ? uintBitsToFloat((floatBitsToUint(x) & 0x80000000u) | 0x7f800000u)
                  : 1.0 / x;
}

// C's pow for floats: GLSL pow is undefined for x < 0 and for x == 0 with y <= 0.
float pow_edges(float x, float y) {
  if (y == 0.0 || x == 1.0) {
    return 1.0;
  }
  if (isnan(x) || isnan(y)) {
    return NAN_F;
  }
  if (y == 1.0) {
    return x;
  }
  if (y == 2.0) {
    return x * x;
  }
  const float ax = abs(x);
  float r;
  if (ax == 0.0) {
    r = y > 0.0 ? 0.0 : INF_F;
  } else if (isinf(y)) {
    r = (ax > 1.0) == (y > 0.0) ? INF_F : 0.0;
    return ax == 1.0 ? 1.0 : r;
  } else {
    r = exp2(y * log2(ax));
  }
  const bool negative = x < 0.0 || (x == 0.0 && floatBitsToUint(x) != 0u);
  if (negative) {
    if (floor(y) != y) {
      return ax == 0.0 ? r : NAN_F;
    }
    if (mod(abs(y), 2.0) == 1.0) {
      r = -r;
    }
  }
  return r;
}

// Integer power with ATen's results for negative exponents (0 unless |base| == 1).
int pow_edges(int base, int e) {
  if (e < 0) {
    return base == 1 ? 1 : (base == -1 ? ((e & 1) == 0 ? 1 : -1) : 0);
  }
  int result = 1;
  while (e > 0) {
    if ((e & 1) != 0) {
      result *= base;
    }
    base *= base;
    e >>= 1;
  }
  return result;
}

// Integer division rounded toward zero, from magnitudes (GLSL leaves the sign of
// integer division with negative operands undefined). Division by zero gives 0 (ATen
// raises; a shader cannot).
int div_trunc(int a, int b) {
  if (b == 0) {
    return 0;
  }
  const int q = int(uint(abs(a)) / uint(abs(b)));
  return (a < 0) != (b < 0) ? -q : q;
}

int div_floor(int a, int b) {
  const int q = div_trunc(a, b);
  const int r = a - q * b;
  return (r != 0 && ((r < 0) != (b < 0))) ? q - 1 : q;
}

float div_trunc(float a, float b) {
  return trunc(a / b);
}

// C's fmod for floats, exact while |a / b| < 2^24: q, the integer part of a / b, then
// a - q * b with q * b split exactly into p + e (Dekker's product; `precise` keeps the
// compiler from fusing or reassociating it: fma may run unfused), then corrected when
// a / b rounded across an integer. fmod(a, 0), fmod(+-inf, b) are NaN; fmod(a, inf) = a.
void split_float(float x, out float hi, out float lo) {
  precise float c = 4097.0 * x;  // 2^12 + 1: Veltkamp's split of a 24-bit significand
  precise float big = c - x;
  precise float h = c - big;  // precise too: c - (c - x) must not fold into x
  precise float l = x - h;
  hi = h;
  lo = l;
}

float fmod_edges(float a, float b) {
  if (b == 0.0 || isinf(a) || isnan(a) || isnan(b)) {
    return NAN_F;
  }
  if (isinf(b)) {
    return a;
  }
  const float q = trunc(a / b);
  float qh, ql, bh, bl;
  split_float(q, qh, ql);
  split_float(b, bh, bl);
  precise float p = q * b;
  precise float e = ((qh * bh - p) + qh * bl + ql * bh) + ql * bl;
  precise float r = (a - p) - e;  // a - p is exact (Sterbenz) for q != 0
  const float step = a < 0.0 ? -abs(b) : abs(b);
  if (r != 0.0 && ((r < 0.0) != (a < 0.0))) {
    r += step;
  } else if (abs(r) >= abs(b)) {
    r -= step;
  }
  return r;
}

// ATen's floor division of floats (div_floor_floating): rounds the exact quotient via
// fmod, so that e.g. floor-dividing by 0.1 matches eager.
float div_floor(float a, float b) {
  if (b == 0.0) {
    return a / b;  // +-inf or NaN, as ATen
  }
  const float m = fmod_edges(a, b);
  float div = (a - m) / b;
  if (m != 0.0 && ((b < 0.0) != (m < 0.0))) {
    div -= 1.0;
  }
  float q;
  if (div != 0.0) {
    q = floor(div);
    if (div - q > 0.5) {
      q += 1.0;
    }
  } else {
    q = (a / b) < 0.0 ? -0.0 : 0.0;
  }
  return q;
}

// minimum/maximum: NaN if either operand is NaN (ATen); GLSL min/max may pick either.
float min_nan(float a, float b) { return isnan(a) || isnan(b) ? NAN_F : min(a, b); }
float max_nan(float a, float b) { return isnan(a) || isnan(b) ? NAN_F : max(a, b); }
int min_nan(int a, int b) { return min(a, b); }
int max_nan(int a, int b) { return max(a, b); }

// fmod (C, the sign of a; float version above div_floor) and remainder (Python, the
// sign of b). Integer modulo 0 gives a (fmod) and 0 (remainder), where ATen raises.
int fmod_edges(int a, int b) { return b == 0 ? a : a - div_trunc(a, b) * b; }
float remainder_edges(float a, float b) {
  const float r = fmod_edges(a, b);
  return (r != 0.0 && ((r < 0.0) != (b < 0.0))) ? r + b : r;
}
int remainder_edges(int a, int b) {
  if (b == 0) {
    return 0;
  }
  const int r = fmod_edges(a, b);
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}

#endif
