// main() of the shaders that write one output element per invocation over the last
// two dims of a (C, H, W) or (N, C, H, W) tensor (pool2d.glsl, upsample2d.glsl).
// Mirrored by vkdelegate/kernels/plane_grid.py, which sizes the grid.
// Grid: (output column, output row, plane): no integer division per element.
// The including shader declares the metadata blocks `out_meta` and `in_meta` and
// defines, before including this header last,
//   void output_at(int ow, int oh, int plane, int OW, int OH, int IW, int IH);
// which writes one output element (sizes passed in so that they are read once per
// invocation). PLANE_LOOP: see main().
#ifndef VKDELEGATE_PLANE_GRID_H
#define VKDELEGATE_PLANE_GRID_H

void main() {
  const int OW = size_at(out_meta, 0), OH = size_at(out_meta, 1);
  const int IW = size_at(in_meta, 0), IH = size_at(in_meta, 1);
  const int ow = int(gl_GlobalInvocationID.x);
  const int oh = int(gl_GlobalInvocationID.y);
  if (ow >= OW || oh >= OH) {
    return;
  }
  // (N,) C: the metadata pads missing dims with size 1.
  const int planes = size_at(out_meta, 2) * size_at(out_meta, 3);
#ifdef PLANE_LOOP
  // The grid's z was capped at the device's workgroup-count limit (N x C beyond it):
  // each invocation strides over the planes. A separate variant: the loop costs
  // llvmpipe about 10% in the common case.
  const int step = int(gl_NumWorkGroups.z * gl_WorkGroupSize.z);
  for (int plane = int(gl_GlobalInvocationID.z); plane < planes; plane += step) {
    output_at(ow, oh, plane, OW, OH, IW, IH);
  }
#else
  const int plane = int(gl_GlobalInvocationID.z);
  if (plane < planes) {
    output_at(ow, oh, plane, OW, OH, IW, IH);
  }
#endif
}

#endif
