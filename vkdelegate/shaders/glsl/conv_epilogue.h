// The pointwise convolution's epilogue after the bias (conv2d_pw.glsl's single pass and
// conv2d_pw_reduce.glsl's, one definition for both): CLAMP to [conv.clamp.x,
// conv.clamp.y] keeping NaN (as ATen does), then RESIDUAL's r_data[at] added after the
// clamp; fp32, the caller rounds once at the store. Include after the conv parameter
// block and r_data.

float conv_epilogue(float v, int at) {
#ifdef CLAMP
  v = isnan(v) ? v : min(max(v, conv.clamp.x), conv.clamp.y);
#endif
#ifdef RESIDUAL
  v += float(r_data[at]);
#endif
  return v;
}
