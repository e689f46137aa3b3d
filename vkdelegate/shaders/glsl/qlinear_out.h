// The output epilogue shared by the quantized linears that finish one sum per output
// (linear_qw_gemv.glsl, linear_qw_texel.glsl), included after their bindings (c_data,
// r_data, s_data, qdims).
#ifndef VKDELEGATE_QLINEAR_OUT_H
#define VKDELEGATE_QLINEAR_OUT_H

// Output (m, n) from its sum: the int8 scale where the sums leave it out (SCALE_LAST:
// s_data[n]), the bias, then HAS_RESIDUAL's r[m, n].
float finish(float acc, int m, int n) {
#ifdef SCALE_LAST
  acc *= float(s_data[n]);
#endif
#ifdef HAS_BIAS
  acc += float(c_data[n]);
#endif
#ifdef HAS_RESIDUAL
  acc += float(r_data[m * qdims.y + n]);
#endif
  return acc;
}

#ifdef SWIGLU
// Output (m, n) from its gate and up sums: the plain op's epilogue for rows n and
// N + n of the merged weight, each rounded as its store rounds it, then the chain.
float swiglu_out(float gate_acc, float up_acc, int m, int n) {
  const float r0 = SWIGLU_ROUND(finish(gate_acc, m, n));
  const float r1 = SWIGLU_ROUND(finish(up_acc, m, qdims.y + n));
  CHAIN_BODY
  return CHAIN_RESULT;
}
#endif

#endif
