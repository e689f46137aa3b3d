// The output epilogue shared by the quantized linears that finish one sum per output
// (linear_qw_gemv.glsl, linear_qw_texel.glsl, linear_qw.glsl), included after their
// bindings (c_data, r_data, s_data, qdims).
#ifndef VKDELEGATE_QLINEAR_OUT_H
#define VKDELEGATE_QLINEAR_OUT_H

// What finish reads for output (m, n): the int8 scale where the sums leave it out
// (SCALE_LAST: s_data[n]), the bias, HAS_RESIDUAL's r[m, n] (1, 0, 0 where absent).
// A kernel may request them before its products, so that their latency overlaps them.
struct FinishLoads { float scale; float bias; float residual; };

FinishLoads finish_loads(int m, int n) {
  FinishLoads f = FinishLoads(1.0, 0.0, 0.0);
#ifdef SCALE_LAST
  f.scale = float(s_data[n]);
#endif
#ifdef HAS_BIAS
  f.bias = float(c_data[n]);
#endif
#ifdef HAS_RESIDUAL
  f.residual = float(r_data[m * qdims.y + n]);
#endif
  return f;
}

// An output from its sum and finish_loads' values: times the scale, plus the bias,
// plus the residual, in that order.
float finish_loaded(float acc, FinishLoads f) {
#ifdef SCALE_LAST
  acc *= f.scale;
#endif
#ifdef HAS_BIAS
  acc += f.bias;
#endif
#ifdef HAS_RESIDUAL
  acc += f.residual;
#endif
  return acc;
}

// Output (m, n) from its sum: the int8 scale where the sums leave it out (SCALE_LAST:
// s_data[n]), the bias, then HAS_RESIDUAL's r[m, n].
float finish(float acc, int m, int n) {
  return finish_loaded(acc, finish_loads(m, n));
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
