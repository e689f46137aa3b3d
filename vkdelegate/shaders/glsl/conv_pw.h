// The pointwise convolution's inputs and parameter block, declared alike by
// conv2d_pw.glsl and conv2d_pw_tiled.glsl (kernels/conv_pointwise.py binds both the
// same way; each shader declares its own outputs): the input, again as 4-vectors
// (IN4_T, for planes of a multiple of 4 pixels), the prepacked fp32 weights
// [IC, ceil(OC / 4)] of vec4, the fp32 bias (not in SPLIT_OUT's first pass without LAST_SUM), the
// residual (RESIDUAL), the output's and input's metadata and conv_block; then
// conv_epilogue.h.
#ifndef VKDELEGATE_CONV_PW_H
#define VKDELEGATE_CONV_PW_H

TENSOR_IN(in_data, IN_T)
TENSOR_IN(in4_data, IN4_T)  // the input again, 4 elements a load (P % 4 == 0)
TENSOR_IN(w_data, vec4)
#if !defined(SPLIT_OUT) || defined(LAST_SUM)
TENSOR_IN(b_data, B_T)
#endif
#ifdef RESIDUAL
TENSOR_IN(r_data, R_T)
#endif
TENSOR_META(out_meta)
TENSOR_META(in_meta)
PARAMS(conv_block) {
  ivec4 channels;  // IC, OC (groups 1)
  vec4 clamp;      // output min, output max (CLAMP only)
} conv;
#include "conv_epilogue.h"

// SPLIT_OUT alone: this pass stores the split's raw sums (conv2d_pw_reduce.glsl ends
// it). LAST_SUM (with SPLIT_OUT): the splits' sums go to part_data and the last split
// of each block adds them (last_split.h; each shader's header comment).
#if defined(SPLIT_OUT) && !defined(LAST_SUM)
#define RAW_SPLIT
#endif
#ifdef LAST_SUM
#ifndef SPLIT_OUT
#error "LAST_SUM sums SPLIT_OUT's splits"
#endif
#include "last_split.h"
#endif

#endif
