#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"

// Brings a constant buffer (a layer's weights) into the GPU's L2 cache ahead of the
// dispatches that read it (vkdelegate/runtime/prefetch.py): one 4-byte load per
// 32-byte sector of data, UNROLL loads issued together per iteration, invocations
// striding over the sectors. An invocation whose loads' XOR happens to equal one
// constant writes it to sink, a buffer of the prefetch's own that nothing reads: the
// loads cannot be dropped, and the rare write is harmless. The runtime records it
// without a barrier beside the dispatches before the reader's, so that it runs
// concurrently with them.
// Defines: UNROLL (sectors per invocation per iteration).

TENSOR_OUT(sink, uint)
TENSOR_IN(data, uint)

void main() {
  const uint n = uint(data.length()) / 8u;  // 32-byte sectors
  const uint total = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  uint acc = 0u;
  for (uint s = gl_GlobalInvocationID.x; s < n; s += UNROLL * total) {
    [[unroll]] for (uint u = 0u; u < UNROLL; ++u) {
      const uint i = min(s + u * total, n - 1u);
      acc ^= data[8u * i];
    }
  }
  if (acc == 0x9E3779B9u) {
    sink[0] = acc;
  }
}
