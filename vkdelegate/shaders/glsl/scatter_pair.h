// What the paired cache-write shaders share (scatter_rows_pair.glsl,
// rotary_scatter_pair.glsl, rotary_cache.h: the GEMVs' ROTARY epilogue): where element
// i of a written region goes. The region is dest.shape[:dim] x count x
// dest.shape[dim + 1:] in order, its rows along dim at index_data[0 .. count - 1]
// (negative indices wrapped, as index_put does). Include after the index_data and
// error_flags (index_check.h) bindings.
#ifndef VKDELEGATE_SCATTER_PAIR_H
#define VKDELEGATE_SCATTER_PAIR_H

// The row of index_data region element i is written at, for sc = (region numel,
// inner, count, size of the dim).
uint scatter_index(uint i, ivec4 sc) {
  return (i / uint(sc.y)) % uint(sc.z);
}

// The element offset in the destination of region element i whose row index (read
// from index_data[scatter_index(i, sc)]) is raw; false, with error_flags[slot] set,
// for an index ATen rejects (the element is then not written).
bool scatter_at(uint i, ivec4 sc, int slot, int raw, out uint at) {
  const uint inner = uint(sc.y);
  const uint count = uint(sc.z);
  const int size = sc.w;
  const uint k = i % inner;
  const uint o = i / (inner * count);
  const int row = raw < 0 ? raw + size : raw;
  at = 0u;
  if (row < 0 || row >= size) {
    atomicOr(error_flags[slot], 1u);
    return false;
  }
  at = (o * uint(size) + uint(row)) * inner + k;
  return true;
}

// scatter_at with the row index read here.
bool scatter_target(uint i, ivec4 sc, int slot, out uint at) {
  return scatter_at(i, sc, slot, int(index_data[scatter_index(i, sc)]), at);
}

#endif
