// Shared by the GEMM core (gemm.glsl) and the GEMV path (gemv.glsl), whose bindings
// are the same as linear.glsl's: out_data, a_data, b_data (c_data with HAS_BIAS),
// their TensorMeta blocks out_meta, a_meta, b_meta (c_meta) and scalars_block
// (alpha, beta; gemv.glsl's RMS_NORM: eps in z). Products: out[..., m, n] = alpha * sum_k a[..., m, k] * B[..., k, n]
// + beta * bias[...], B being b ([..., K, N]) or, with B_NK, b's transpose (b is
// [..., N, K], nn.Linear's weight layout); batch dims broadcast (size 1 in a or b).
#ifndef VKDELEGATE_GEMM_H
#define VKDELEGATE_GEMM_H

PARAMS(scalars_block) { vec4 scalars; };

// Element offsets of a, b and the bias for batch index z (dims 2.. of out, innermost
// first); false when z is past the current batch count (the grid covers the upper
// bound). Constant metadata indices only (see linear.glsl).
bool batch_offsets(int z, out int a_off, out int b_off, out int c_off) {
  const int nd = ndim_of(out_meta);
  int rest = z;
  a_off = 0;
  b_off = 0;
  c_off = 0;
  [[unroll]] for (int d = 2; d < 8; ++d) {
    if (d < nd) {
      const int size = size_at(out_meta, d);
      const int coord = rest % size;
      rest /= size;
      a_off += (size_at(a_meta, d) == 1 ? 0 : coord) * stride_at(a_meta, d);
      b_off += (size_at(b_meta, d) == 1 ? 0 : coord) * stride_at(b_meta, d);
#ifdef HAS_BIAS
      c_off += (size_at(c_meta, d) == 1 ? 0 : coord) * stride_at(c_meta, d);
#endif
    }
  }
  return rest == 0;
}

// The stored value of output (m, n) from its accumulated product: alpha * acc, plus
// beta * bias unless beta is 0 (ATen then ignores the bias, NaN included).
float epilogue(float acc, int c_off, int m, int n) {
  float v = scalars.x * acc;
#ifdef HAS_BIAS
  if (scalars.y != 0.0) {
    const int c_row = size_at(c_meta, 1) == 1 ? 0 : stride_at(c_meta, 1);
    const int c_col = size_at(c_meta, 0) == 1 ? 0 : stride_at(c_meta, 0);
    v += scalars.y * float(c_data[c_off + m * c_row + n * c_col]);
  }
#endif
  return v;
}

// HAS_RESIDUAL (gemv.glsl, linear.glsl: vkdelegate.linear_add): v, an output's value
// from ``epilogue``, plus element i of r_data (a residual of out's shape, contiguous
// like out), added in fp32 before the store's one rounding.
#ifdef HAS_RESIDUAL
#define WITH_RESIDUAL(v, i) ((v) + float(r_data[i]))
#else
#define WITH_RESIDUAL(v, i) (v)
#endif

#endif
