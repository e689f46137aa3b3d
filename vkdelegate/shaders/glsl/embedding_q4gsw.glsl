#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"
#include "index_check.h"

// int4 group-wise embedding (et_vk.embedding_q4gsw, ops/families/quantized_embedding.py):
//   out[j, d] = (nibble(weight[index[j], d]) - 8) * scales[index[j], d / GS]
// weight: uint8 [V, D/2], two values per byte (k even in the high nibble, or in the low
// one with LINEAR_PACKING: ExecuTorch's is_linear_weight), read as 32-bit words with
// W_WORDS (8-bit storage), else one W_T per byte. One invocation per 8 outputs (one
// word). Out-of-range indices set the node's error flag (index_check.h), clamped.
// Defines: OUT_T, OUT_STORE(v), S_T, IDX_T, W_T (without W_WORDS), LINEAR_PACKING.

TENSOR_OUT(out_data, OUT_T)
#ifdef W_WORDS
TENSOR_IN(w_data, uint)
#else
TENSOR_IN(w_data, W_T)
#endif
TENSOR_IN(s_data, S_T)
TENSOR_IN(index_data, IDX_T)
PARAMS(qembedding_block) {
  ivec4 info;    // x: output words (numel / 8), y: words per output row (D / 8), z: V,
                 // w: error-flag word of this node
  ivec4 strides;  // x: weight row stride in words, y: scales per row, z: group size
};

#ifndef W_WORDS
uint byte_at(int i) { return uint(int(w_data[i])) & 0xFFu; }
#endif

void main() {
  const int i = int(linear_id());
  if (i >= info.x) {
    return;
  }
  const int c = i % info.y;
  const int j = i / info.y;
  const int row = checked_index(int(index_data[j]), info.z, false, info.w);
  const int wi = row * strides.x + c;
#ifdef W_WORDS
  const uint word = w_data[wi];
#else
  const uint word = byte_at(4 * wi) | (byte_at(4 * wi + 1) << 8)
      | (byte_at(4 * wi + 2) << 16) | (byte_at(4 * wi + 3) << 24);
#endif
  const float s = float(s_data[row * strides.y + (c * 8) / strides.z]);
  [[unroll]] for (int t = 0; t < 8; ++t) {
    const uint byte_ = (word >> (8 * (t >> 1))) & 0xFFu;
#ifdef LINEAR_PACKING
    const uint nibble = (t & 1) == 0 ? (byte_ & 0xFu) : (byte_ >> 4);
#else
    const uint nibble = (t & 1) == 0 ? (byte_ >> 4) : (byte_ & 0xFu);
#endif
    out_data[i * 8 + t] = OUT_STORE(float(int(nibble) - 8) * s);
  }
}
