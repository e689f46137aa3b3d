// What the HF-style rotary shaders share (rotary_half.glsl, rotary_half_pair.glsl,
// rotary_scatter_pair.glsl, rotary_cache.h; kernels/rotary_half.py): out = x * cos
// + rotate_half(x) * sin with rotate_half(x) = cat(-x2, x1) (x1, x2 the halves of the
// last dim), cos/sin broadcast to x, fp32 math. One expression, so every shader gives
// an element the same bits. Include after common.h and the cos_data / sin_data
// bindings.
#ifndef VKDELEGATE_ROTARY_HALF_H
#define VKDELEGATE_ROTARY_HALF_H

// The cos/sin element of flat element i of a tensor of sizes sz (rank 4, outermost
// first) whose cos/sin element strides are fs (0 along a broadcast dim).
uint rotary_freq_index(uint i, ivec4 sz, ivec4 fs) {
  const uint d = i % uint(sz.w);
  const uint r = i / uint(sz.w);
  const uint c2 = r % uint(sz.z);
  const uint c1 = (r / uint(sz.z)) % uint(sz.y);
  const uint c0 = r / uint(sz.z * sz.y);
  return c0 * uint(fs.x) + c1 * uint(fs.y) + c2 * uint(fs.z) + d * uint(fs.w);
}

// The rotated value (fp32) of flat element i of buf, a tensor of sizes sz (last dim
// sz.w = 2 * half_d) with cos/sin strides fs, stored from element base of buf on
// (ROTARY_HALF_AT; ROTARY_HALF: from element 0).
#define ROTARY_HALF_AT(buf, base, i, sz, fs, half_d) rotary_half_value(               \
    float(buf[(base) + (i)]),                                                         \
    ((i) % uint((sz).w) < (half_d)) ? -float(buf[(base) + (i) + (half_d)])            \
                                    : float(buf[(base) + (i) - (half_d)]),            \
    rotary_freq_index(i, sz, fs))
#define ROTARY_HALF(buf, i, sz, fs, half_d) ROTARY_HALF_AT(buf, 0u, i, sz, fs, half_d)

// x * cos + partner * sin, partner = -x2 (x in the first half) or x1. ``precise``: two
// products and a sum, each rounded, never contracted into an fma, so that every shader
// computing it (the three above and rotary_cache.h's ROTARY epilogue, whose x is in a
// register rather than loaded) gives the same bits whatever its compiler contracts
// (and fp32 gives eager's: x * cos, rotate_half(x) * sin and their sum, each rounded).
// rotary_half_cs: with the cos and sin values given (rotary_cache.h loads them
// before its products).
float rotary_half_cs(float x, float partner, float c, float s) {
  precise float r = x * c + partner * s;
  return r;
}

float rotary_half_value(float x, float partner, uint f) {
  return rotary_half_cs(x, partner, float(cos_data[f]), float(sin_data[f]));
}

#endif
