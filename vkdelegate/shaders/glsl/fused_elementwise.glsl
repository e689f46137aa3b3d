#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"
#include "elementwise_math.h"
#include "broadcast_plan.h"

// A fused chain of float elementwise ops (kernels/elementwise_chain.py): the inputs
// r0 .. r{NUM_INPUTS-1} are read once per output element through the host's broadcast
// plan (broadcast_plan.h), CHAIN_BODY computes every step in fp32 registers, and
// CHAIN_RESULT (the last register) is stored: one dispatch and one pass over memory
// where the unfused ops took one of each per op.
// Defines: OUT_T, OUT_STORE(v), IN0_T .. IN2_T (storage types: inputs and output
// may differ in float dtype, casts inside the chain join them), NUM_INPUTS (1..3),
// CHAIN_BODY, CHAIN_RESULT, ACC_T=float and ACC_FLOAT (the expressions' types). A
// step whose register is float16 rounds its value with round_to_half (common.h), as
// the unfused op's store to float16 storage would, so the chain computes what its ops
// did one by one.

TENSOR_OUT(out_data, OUT_T)
TENSOR_IN(in0_data, IN0_T)
#if NUM_INPUTS > 1
TENSOR_IN(in1_data, IN1_T)
#endif
#if NUM_INPUTS > 2
TENSOR_IN(in2_data, IN2_T)
#endif

void main() {
  uint i;
  ivec3 o0;
  int count;
  if (!plan_chunk(linear_id(), i, o0, count)) {
    return;
  }
  const ivec3 step = dim_strides(0);
  [[unroll]] for (int j = 0; j < CHUNK; ++j) {
    if (j < count) {
      const ivec3 o = o0 + j * step;
      const float r0 = float(in0_data[o.x]);
#if NUM_INPUTS > 1
      const float r1 = float(in1_data[o.y]);
#endif
#if NUM_INPUTS > 2
      const float r2 = float(in2_data[o.z]);
#endif
      CHAIN_BODY
      out_data[i + j] = OUT_STORE(CHAIN_RESULT);
    }
  }
}
