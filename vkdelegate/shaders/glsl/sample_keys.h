// The token order of vkdelegate.sample / sample_record (sample.glsl, sample_max.glsl):
// token i's place is the 64-bit key (h, l) = (fkey(z), V - 1 - i), larger first, so
// that ties in z go to the lower index.

// Orderable bits of a float (larger float, larger uint); -0 is 0.
uint fkey(float z) {
  const uint u = floatBitsToUint(z == 0.0 ? 0.0 : z);
  return (u & 0x80000000u) != 0u ? ~u : (u | 0x80000000u);
}

float key_float(uint k) {
  return uintBitsToFloat((k & 0x80000000u) != 0u ? (k & 0x7fffffffu) : ~k);
}

bool key_ge(uint h, uint l, uint th, uint tl) {
  return h > th || (h == th && l >= tl);
}

// Logit x as the sampler orders it: x itself for greedy (temperature t <= 0), else
// x / t.
float z_of(float x, float temp) {
  return temp > 0.0 ? x / temp : x;
}
