// What the paired cache-write shaders share (scatter_rows_pair.glsl,
// rotary_scatter_pair.glsl): where element i of a written region goes. The region is
// dest.shape[:dim] x count x dest.shape[dim + 1:] in order, its rows along dim at
// index_data[0 .. count - 1] (negative indices wrapped, as index_put does). Include
// after the index_data and error_flags (index_check.h) bindings.
#ifndef VKDELEGATE_SCATTER_PAIR_H
#define VKDELEGATE_SCATTER_PAIR_H

// The element offset in the destination of region element i, for sc = (region
// numel, inner, count, size of the dim); false, with error_flags[slot] set, for an
// index ATen rejects (the element is then not written).
bool scatter_target(uint i, ivec4 sc, int slot, out uint at) {
  const uint inner = uint(sc.y);
  const uint count = uint(sc.z);
  const int size = sc.w;
  const uint k = i % inner;
  const uint j = (i / inner) % count;
  const uint o = i / (inner * count);
  const int raw = int(index_data[j]);
  const int row = raw < 0 ? raw + size : raw;
  at = 0u;
  if (row < 0 || row >= size) {
    atomicOr(error_flags[slot], 1u);
    return false;
  }
  at = (o * uint(size) + uint(row)) * inner + k;
  return true;
}

#endif
