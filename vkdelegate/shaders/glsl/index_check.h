// Index range check shared by the indexing shaders (index_rows.glsl, gather.glsl).
// ATen raises on an out-of-range index; a shader cannot, so it sets its node's word in
// the graph's error-flag buffer (NodeBuilder.error_flag) and the runtime raises after
// the fence wait. The index is still clamped so that no read leaves the buffer.

// The graph's error-flag words, one per checked node: the storage-buffer binding the
// op declares as error_flags (an output).
layout(set = 0, binding = BINDING_error_flags) buffer error_flag_buffer {
  uint error_flags[];
};

// idx wrapped (when allow_negative: -size..size-1 as in ATen's index.Tensor) and
// clamped to 0..size-1; sets error_flags[slot] when it was out of range. size > 0.
int checked_index(int idx, int size, bool allow_negative, int slot) {
  const int wrapped = (allow_negative && idx < 0) ? idx + size : idx;
  if (wrapped < 0 || wrapped >= size) {
    atomicOr(error_flags[slot], 1u);
  }
  return clamp(wrapped, 0, size - 1);
}
