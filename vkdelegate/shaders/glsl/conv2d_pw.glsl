#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"

// Pointwise (1x1, stride 1, unpadded, groups 1) convolution as an implicit GEMM for
// GPUs: per batch n, out[n][OC, P] = W[OC, IC] @ x[n][IC, P] (NCHW / NCL, P = the
// flattened pixels), + bias, optional clamp, optional residual add.
//
// A workgroup computes a 32 x 32 block (32 output channels x 32 pixels): 64
// invocations of 4 x 4 outputs each (4 channels, 4 consecutive pixels), times KS
// K-slices (specialization constant 3; the workgroup is 64 * KS invocations). Slice s
// sums input channels [s * KC, (s + 1) * KC); slices 1.. hand their partial sums to
// slice 0 through shared memory, which adds them and stores. Few output blocks and a
// long reduction (EfficientNet's 1152 -> 192 at 7 x 7: 12 blocks) take KS = 8, so
// that 8x more invocations work on the reduction ((KS - 1) x 4 KiB of shared
// memory: kernels/conv_pointwise.py caps KS by the device's); many blocks take KS = 1.
// Adjacent invocations read adjacent pixel quads (one 128-byte row per 8) and share
// one weight vec4 (an L1 broadcast); accumulation is fp32.
//
// Defines: OUT_T, OUT_STORE(v), IN_T, IN4_T (IN_T's 4-vector), B_T (fp32: prepacked
// bias, zeros when there is none); weights prepacked fp32 vec4 [IC, ceil(OC / 4)]
// (the 4 channels of a quad contiguous, zero-padded); CLAMP: clamp to
// [conv.clamp.x, conv.clamp.y] (ATen keeps NaN); RESIDUAL (R_T): add r_data, a
// tensor of out's shape, after the clamp (a fused aten.add of the convolution's
// result). Sizes come from the metadata: resizable in batch and spatial sizes.
//
// SPLIT_OUT (split-K across workgroups, for dispatches of too few blocks to fill the
// GPU: EfficientNet's 1152 -> 192 at 7 x 7 is 12 blocks): specialization constant 5
// is SPLITS; workgroup z = n * SPLITS + split sums only input channels
// [split * KCS, (split + 1) * KCS), KCS = ceil(IC / SPLITS) (its KS slices divide that
// range), and stores the raw fp32 sums (no bias, clamp or residual: none are bound) at
// out_data[((n * SPLITS + split) * OC + oc) * P + p], a scratch buffer; out_meta still
// describes the real output. conv2d_pw_reduce.glsl then adds the SPLITS parts in
// order and applies the epilogue. LAST_SUM (with SPLIT_OUT): no second pass, as in
// conv2d_pw_tiled.glsl: the raw sums go to part_data at that layout, each split
// counts itself in count_data[block] (block = (n * gl_NumWorkGroups.y + y) *
// gl_NumWorkGroups.x + x) after a device-scope memory barrier, and the last split
// to count resets the counter, adds the SPLITS parts in order from split 0 (the
// reduce pass's float operations: the same bits) and stores through the epilogue
// into out_data, the real output. count_data must hold zeros before the first
// dispatch.

layout(constant_id = 3) const int KS = 1;       // K slices per workgroup
layout(constant_id = 4) const int SPATIAL = 2;  // spatial dims: 1 (N, C, L) or 2
layout(constant_id = 5) const int SPLITS = 1;   // SPLIT_OUT: K splits across workgroups

TENSOR_OUT(out_data, OUT_T)
#include "conv_pw.h"

// Slices 1..KS-1 park their 16 partial sums here (4 vec4 per invocation).
shared vec4 partial[(KS - 1) * 256 + 1];

void main() {
  const int P = size_at(out_meta, 0) * (SPATIAL == 2 ? size_at(out_meta, 1) : 1);
  const int OC = size_at(out_meta, SPATIAL);
  const int N = size_at(out_meta, SPATIAL + 1);
  const int IC = size_at(in_meta, SPATIAL);
  const int OC4 = (OC + 3) >> 2;
  if (P == 0 || N == 0) {
    return;  // uniform: the whole workgroup leaves before the barrier
  }

  const int lid = int(gl_LocalInvocationID.x);
  const int t = lid & 63;
  const int s = lid >> 6;
  const int p0 = int(gl_WorkGroupID.x) * 32 + (t & 7) * 4;
  const int ocq = int(gl_WorkGroupID.y) * 8 + (t >> 3);  // this invocation's channel quad
#ifdef SPLIT_OUT
  const int n = int(gl_WorkGroupID.z) / SPLITS;
  const int split = int(gl_WorkGroupID.z) % SPLITS;
  const int KCS = (IC + SPLITS - 1) / SPLITS;
  const int kb = min(IC, split * KCS);  // this split's channels: [kb, ke)
  const int ke = min(IC, kb + KCS);
#else
  const int n = int(gl_WorkGroupID.z);
  const int kb = 0, ke = IC;
#endif
  // Out-of-range invocations compute on clamped (valid) addresses and store nothing;
  // they still reach the barrier.
  const bool live = n < N && p0 < P && ocq < OC4;
  const int nn = min(n, N - 1);
  const int wq = min(ocq, OC4 - 1);

  const int KC = (ke - kb + KS - 1) / KS;
  const int k0 = kb + s * KC;
  const int k1 = min(ke, k0 + KC);
  vec4 acc[4];  // acc[i][j]: channel 4 ocq + i, pixel p0 + j
  [[unroll]] for (int i = 0; i < 4; ++i) {
    acc[i] = vec4(0.0);
  }
  const int in_base = nn * IC * P;
  if ((P & 3) == 0) {
    // Aligned planes: one vec4 per channel; the quad of a tail block is clamped in.
    const int q = (in_base + min(p0, P - 4)) >> 2;
    const int qstep = P >> 2;
    for (int k = k0; k < k1; ++k) {
      const vec4 w = w_data[k * OC4 + wq];
      const vec4 x = vec4(in4_data[q + k * qstep]);
      acc[0] += w.x * x;
      acc[1] += w.y * x;
      acc[2] += w.z * x;
      acc[3] += w.w * x;
    }
  } else {
    const int c1 = min(p0 + 1, P - 1), c2 = min(p0 + 2, P - 1), c3 = min(p0 + 3, P - 1);
    const int c0 = min(p0, P - 1);
    for (int k = k0; k < k1; ++k) {
      const vec4 w = w_data[k * OC4 + wq];
      const int row = in_base + k * P;
      const vec4 x = vec4(float(in_data[row + c0]), float(in_data[row + c1]),
                          float(in_data[row + c2]), float(in_data[row + c3]));
      acc[0] += w.x * x;
      acc[1] += w.y * x;
      acc[2] += w.z * x;
      acc[3] += w.w * x;
    }
  }
  if (KS > 1) {
    if (s > 0) {
      [[unroll]] for (int i = 0; i < 4; ++i) {
        partial[((s - 1) * 64 + t) * 4 + i] = acc[i];
      }
    }
    barrier();
    if (s == 0) {
      for (int r = 0; r < KS - 1; ++r) {
        [[unroll]] for (int i = 0; i < 4; ++i) {
          acc[i] += partial[(r * 64 + t) * 4 + i];
        }
      }
    }
  }
#ifdef LAST_SUM
  // Slice 0's sums of this split into part_data; the last split of the block to
  // count adds all of them, in split order, into acc. Every invocation reaches the
  // barriers.
  const int n_first = nn * SPLITS * OC * P;  // split 0's sums of image nn at oc = 0
  if (s == 0 && live) {
    [[unroll]] for (int i = 0; i < 4; ++i) {
      const int oc = ocq * 4 + i;
      [[unroll]] for (int j = 0; j < 4; ++j) {
        if (oc < OC && p0 + j < P) {
          part_data[n_first + (split * OC + oc) * P + p0 + j] = acc[i][j];
        }
      }
    }
  }
  const uint block = (uint(n) * gl_NumWorkGroups.y + gl_WorkGroupID.y) *
                     gl_NumWorkGroups.x + gl_WorkGroupID.x;
  LAST_SPLIT_COUNT(block, lid == 0, SPLITS)
  if (s == 0 && live) {
    [[unroll]] for (int i = 0; i < 4; ++i) {
      acc[i] = vec4(0.0);
    }
    for (int sp = 0; sp < SPLITS; ++sp) {
      [[unroll]] for (int i = 0; i < 4; ++i) {
        const int oc = ocq * 4 + i;
        [[unroll]] for (int j = 0; j < 4; ++j) {
          if (oc < OC && p0 + j < P) {
            acc[i][j] += part_data[n_first + (sp * OC + oc) * P + p0 + j];
          }
        }
      }
    }
  }
#endif
  if (s > 0 || !live) {
    return;
  }
  [[unroll]] for (int i = 0; i < 4; ++i) {
    const int oc = ocq * 4 + i;
    if (oc < OC) {
#ifdef RAW_SPLIT
      const int base = (int(gl_WorkGroupID.z) * OC + oc) * P + p0;
      [[unroll]] for (int j = 0; j < 4; ++j) {
        if (p0 + j < P) {
          out_data[base + j] = acc[i][j];
        }
      }
#else
      const float bias = float(b_data[oc]);
      const int base = (n * OC + oc) * P + p0;
      [[unroll]] for (int j = 0; j < 4; ++j) {
        if (p0 + j < P) {
          out_data[base + j] = OUT_STORE(conv_epilogue(acc[i][j] + bias, base + j));
        }
      }
#endif
    }
  }
}
