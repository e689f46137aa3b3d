// The last-arriving split (conv2d_pw.glsl / conv2d_pw_tiled.glsl LAST_SUM,
// sdpa_decode_lanes.glsl LAST_MERGE): the splits of one piece of work (a block of
// outputs, a query row) each store their partial result in part_data and count
// themselves in count_data[counter]; the last split to count combines every split's
// partial result in split order (so the result does not depend on which split ended
// last) and writes the output, without a second dispatch. count_data holds one
// counter per piece of work, zeros before the first dispatch (NodeBuilder.zeroed):
// the last split returns its counter to zero for the next one.
#ifndef VKDELEGATE_LAST_SPLIT_H
#define VKDELEGATE_LAST_SPLIT_H

layout(set = 0, binding = BINDING_part_data) coherent buffer part_buffer {
  float part_data[];
};
layout(set = 0, binding = BINDING_count_data) coherent buffer count_buffer {
  uint count_data[];
};
shared bool last_split;  // this workgroup's split is the last of its work to finish

// After the workgroup stored its partial result: the invocation for which ``first``
// holds counts the split (atomicAdd after a device-scope memory barrier) among
// ``splits``; every workgroup but the last to count returns, and the last one resets
// the counter and may then read every split's partial result. Reached by the whole
// workgroup (its barriers).
#define LAST_SPLIT_COUNT(counter, first, splits)                          \
  memoryBarrierBuffer(); /* the partial written before it is counted */   \
  barrier();                                                              \
  if (first) {                                                            \
    last_split = atomicAdd(count_data[counter], 1u) == uint((splits) - 1); \
    if (last_split) {                                                     \
      count_data[counter] = 0u; /* every split of this dispatch counted */ \
    }                                                                     \
  }                                                                       \
  barrier();                                                              \
  if (!last_split) {                                                      \
    return;                                                               \
  }                                                                       \
  memoryBarrierBuffer(); /* the other splits' partials read after the count */

#endif
