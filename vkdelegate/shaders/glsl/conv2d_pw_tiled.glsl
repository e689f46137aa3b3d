#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.h"

// Pointwise (1x1, stride 1, unpadded, groups 1) convolution on GPUs as one GEMM over
// the whole batch: out[OC, J] = W[OC, IC] @ X[IC, J] with J = N * P the batch's pixels
// side by side (column j is pixel p = j % P of image n = j / P; NCHW / NCL read and
// written in place), + bias, optional clamp, optional residual add (conv_epilogue.h).
// For layers with many outputs, where conv2d_pw.glsl's 32 x 32 blocks and global-memory
// operands leave the multiply-adds waiting on loads: the register-blocked tiling of
// gemm.glsl. A WX x WY workgroup of 256 invocations computes a BM x BN block (BM =
// WY * TM output channels, BN = WX * TN columns); each invocation owns TM x TN outputs,
// channels 4 * (ty + WY i) + 0..3 and columns 4 * (tx + WX j) + 0..3. Per step of BK input
// channels the workgroup stages a BK x BM slice of the weights and a BK x BN slice of
// X in shared memory as vec4s (k-major, one vec4 of padding per row); the next step's
// global loads are issued into registers before the current step's multiply-adds.
// Columns past J and channels past OC load zeros and store nothing; flattening the
// batch wastes no block on a plane's tail (EfficientNet's 7 x 7 planes: 49 columns).
//
// Defines: OUT_T, OUT4_T (its 4-vector), OUT_STORE(v), IN_T, IN4_T (IN_T's 4-vector),
// B_T (fp32 bias), TM, TN (4 or 8), WY (8 or 16; WX = 256 / WY), BK (16), CLAMP,
// RESIDUAL (R_T); weights prepacked fp32 vec4 [IC, ceil(OC / 4)] (kernels/
// conv_pointwise.py pack_weight: the 4 channels of a quad contiguous, zero-padded past
// OC). X loads and output stores: one 4-vector of 4 columns where P % 4 == 0 (the quad
// lies in one plane, aligned), else 4 scalars. Sizes come from the metadata
// (resizable in batch and spatial sizes). Specialization constant 3: SPATIAL (1 or 2).
// Grid: x over J / BN, y over OC / BM, z the splits.
//
// SPLIT_OUT (too few blocks to fill the GPU): specialization constant 4 is SPLITS;
// workgroup z = split sums input channels [split * KCS, (split + 1) * KCS), KCS =
// ceil(IC / SPLITS) rounded up to whole BK steps, and stores the raw fp32 sums at
// out_data[((n * SPLITS + split) * OC + oc) * P + p], conv2d_pw.glsl's SPLIT_OUT
// layout, which conv2d_pw_reduce.glsl sums in order and finishes with the epilogue.
// LAST_SUM (with SPLIT_OUT): no second pass. Each split stores its raw sums at that
// layout in part_data instead and counts itself in count_data[block] (block = y *
// gl_NumWorkGroups.x + x; an atomicAdd after a device-scope memory barrier); the
// split that counts last resets the counter to 0 for the next dispatch, adds every
// split's sums in split order from s = 0 (conv2d_pw_reduce.glsl's order and float
// operations: the same bits) and stores them through the epilogue into out_data /
// out4_data, the real output. count_data must hold zeros before the first dispatch.

layout(constant_id = 3) const int SPATIAL = 2;  // spatial dims: 1 (N, C, L) or 2
layout(constant_id = 4) const int SPLITS = 1;   // SPLIT_OUT: K splits across workgroups

TENSOR_OUT(out_data, OUT_T)
TENSOR_OUT(out4_data, OUT4_T)  // the output again, 4 elements a store (P % 4 == 0)
#include "conv_pw.h"

#define WX (256 / WY)
#define BM (WY * TM)
#define BN (WX * TN)
#define A_SLOTS (BK * BM / 4)  // weight vec4s of a step
#define B_SLOTS (BK * BN / 4)  // X column quads of a step
#define A_LOADS ((A_SLOTS + 255) / 256)  // a step's loads per invocation
#define B_LOADS ((B_SLOTS + 255) / 256)

shared vec4 a_tile[BK][BM / 4 + 1];
shared vec4 b_tile[BK][BN / 4 + 1];

void main() {
  const int P = size_at(out_meta, 0) * (SPATIAL == 2 ? size_at(out_meta, 1) : 1);
  const int OC = size_at(out_meta, SPATIAL);
  const int N = size_at(out_meta, SPATIAL + 1);
  const int IC = size_at(in_meta, SPATIAL);
  const int J = N * P;
  const int OC4 = (OC + 3) >> 2;
  const int row0 = int(gl_WorkGroupID.y) * BM;
  const int col0 = int(gl_WorkGroupID.x) * BN;
  if (col0 >= J || row0 >= OC) {
    return;  // the whole workgroup: past the current sizes (the grid is the bound's)
  }
#ifdef SPLIT_OUT
  const int split = int(gl_WorkGroupID.z);
  const int KCS = ((IC + SPLITS - 1) / SPLITS + BK - 1) / BK * BK;
  const int k_begin = min(IC, split * KCS);
  const int k_end = min(IC, k_begin + KCS);
#else
  const int k_begin = 0;
  const int k_end = IC;
#endif
  const int tx = int(gl_LocalInvocationID.x);
  const int ty = int(gl_LocalInvocationID.y);
  const int tid = ty * WX + tx;

  // Load slot s = tid + 256 l (< A_SLOTS / B_SLOTS): weights k = s / (BM / 4), quad
  // s % (BM / 4); X k = s / (BN / 4), column quad s % (BN / 4). 256 is a multiple of
  // BM / 4 and of BN / 4, so an invocation's quads are the same in every slot and step.
  const int aq = row0 / 4 + tid % (BM / 4);
  const bool a_live = aq < OC4;
  const int bc = col0 + 4 * (tid % (BN / 4));
  int b_at[4];  // X offsets of the quad's columns at channel 0; -1 past J
  [[unroll]] for (int e = 0; e < 4; ++e) {
    const int j = bc + e;
    b_at[e] = j < J ? (j / P) * IC * P + j % P : -1;
  }
  const bool quads = (P & 3) == 0;  // uniform: the quad is one aligned vec4

  vec4 acc[TM][TN / 4];
  [[unroll]] for (int i = 0; i < TM; ++i) {
    [[unroll]] for (int j = 0; j < TN / 4; ++j) {
      acc[i][j] = vec4(0.0);
    }
  }
  vec4 a_next[A_LOADS];
  vec4 b_next[B_LOADS];

#define LOAD(k0) \
  [[unroll]] for (int l = 0; l < A_LOADS; ++l) { \
    const int k = (k0) + (tid + l * 256) / (BM / 4); \
    a_next[l] = (a_live && k < k_end && tid + l * 256 < A_SLOTS) ? w_data[k * OC4 + aq] \
                                                                 : vec4(0.0); \
  } \
  [[unroll]] for (int l = 0; l < B_LOADS; ++l) { \
    const int k = (k0) + (tid + l * 256) / (BN / 4); \
    if (k >= k_end || tid + l * 256 >= B_SLOTS) { \
      b_next[l] = vec4(0.0); \
    } else if (quads) { \
      b_next[l] = b_at[0] >= 0 ? vec4(in4_data[(b_at[0] + k * P) >> 2]) : vec4(0.0); \
    } else { \
      [[unroll]] for (int e = 0; e < 4; ++e) { \
        b_next[l][e] = b_at[e] >= 0 ? float(in_data[b_at[e] + k * P]) : 0.0; \
      } \
    } \
  }
#define STORE \
  [[unroll]] for (int l = 0; l < A_LOADS; ++l) { \
    const int s = tid + l * 256; \
    if (s < A_SLOTS) { \
      a_tile[s / (BM / 4)][s % (BM / 4)] = a_next[l]; \
    } \
  } \
  [[unroll]] for (int l = 0; l < B_LOADS; ++l) { \
    const int s = tid + l * 256; \
    if (s < B_SLOTS) { \
      b_tile[s / (BN / 4)][s % (BN / 4)] = b_next[l]; \
    } \
  }

  LOAD(k_begin)
  for (int k0 = k_begin; k0 < k_end; k0 += BK) {
    STORE
    barrier();
    if (k0 + BK < k_end) {  // uniform: the next slice's loads overlap this one's math
      LOAD(k0 + BK)
    }
    [[unroll]] for (int k = 0; k < BK; ++k) {
      vec4 av[TM / 4];
      vec4 bv[TN / 4];
      [[unroll]] for (int i = 0; i < TM / 4; ++i) {
        av[i] = a_tile[k][ty + WY * i];
      }
      [[unroll]] for (int j = 0; j < TN / 4; ++j) {
        bv[j] = b_tile[k][tx + WX * j];
      }
      [[unroll]] for (int i = 0; i < TM / 4; ++i) {
        [[unroll]] for (int e = 0; e < 4; ++e) {
          [[unroll]] for (int j = 0; j < TN / 4; ++j) {
            acc[4 * i + e][j] += av[i][e] * bv[j];
          }
        }
      }
    }
    barrier();
  }

  // Column j of split s's sums in the scratch layout, at m = 0: [(n * SPLITS + s) *
  // OC + m] * P + p for image n = j / P, pixel p = j % P.
#define split_at(j, s) (((j) / P * SPLITS + (s)) * OC * P + (j) % P)
#ifdef LAST_SUM
  // This split's sums into part_data; the last split of the block to count adds all
  // of them, in split order, into acc. FOR_OWN(s, BODY): BODY for each output of
  // this invocation inside the sizes, at = split_at of its column for split s, m its
  // channel, acc[i][jq][f] its sum.
#define FOR_OWN(s, BODY)                                                     \
  [[unroll]] for (int jq = 0; jq < TN / 4; ++jq) {                           \
    const int j0 = col0 + 4 * (tx + WX * jq);                                \
    [[unroll]] for (int f = 0; f < 4; ++f) {                                 \
      if (j0 + f < J) {                                                      \
        const int at = split_at(j0 + f, s);                                  \
        [[unroll]] for (int i = 0; i < TM; ++i) {                            \
          const int m = row0 + 4 * (ty + WY * (i >> 2)) + (i & 3);           \
          if (m < OC) {                                                      \
            BODY;                                                            \
          }                                                                  \
        }                                                                    \
      }                                                                      \
    }                                                                        \
  }
  FOR_OWN(split, part_data[at + m * P] = acc[i][jq][f])
  LAST_SPLIT_COUNT(gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x, tid == 0,
                   SPLITS)
  [[unroll]] for (int i = 0; i < TM; ++i) {
    [[unroll]] for (int j = 0; j < TN / 4; ++j) {
      acc[i][j] = vec4(0.0);
    }
  }
  for (int s = 0; s < SPLITS; ++s) {
    FOR_OWN(s, acc[i][jq][f] += part_data[at + m * P])
  }
#endif
  // Column j of out: image n = j / P, pixel p = j % P, at out[(n * OC + m) * P + p]
  // (RAW_SPLIT: the scratch's [(n * SPLITS + split) * OC + m] * P + p); column_at(j)
  // is that offset at m = 0.
#ifdef RAW_SPLIT
#define column_at(j) split_at(j, split)
#else
#define column_at(j) ((j) / P * OC * P + (j) % P)
#endif
  // One 4-vector store per quad where P % 4 == 0 (its 4 columns are 4 aligned pixels
  // of one plane), else 4 scalar stores; each element's epilogue and rounding alike.
  [[unroll]] for (int jq = 0; jq < TN / 4; ++jq) {
    const int j0 = col0 + 4 * (tx + WX * jq);
    int at0[4];  // column j0 + f's offset at m = 0; -1 past J
    [[unroll]] for (int f = 0; f < 4; ++f) {
      at0[f] = j0 + f < J ? column_at(j0 + f) : -1;
    }
    [[unroll]] for (int i = 0; i < TM / 4; ++i) {
      [[unroll]] for (int e = 0; e < 4; ++e) {
        const int m = row0 + 4 * (ty + WY * i) + e;
        if (m < OC) {
          const vec4 a = acc[4 * i + e][jq];
          vec4 v;  // the stored values, in fp32 (exact from OUT_T)
#ifdef RAW_SPLIT
          v = a;
#else
          const float bias = float(b_data[m]);
          [[unroll]] for (int f = 0; f < 4; ++f) {
            v[f] = at0[f] < 0 ? 0.0
                 : float(OUT_STORE(conv_epilogue(a[f] + bias, at0[f] + m * P)));
          }
#endif
          if (quads) {
            // Through vec4: 16-bit storage alone has no f16vec4 constructor from
            // 16-bit scalars.
            if (at0[0] >= 0) {
              out4_data[(at0[0] + m * P) >> 2] = OUT4_T(v);
            }
          } else {
            [[unroll]] for (int f = 0; f < 4; ++f) {
              if (at0[f] >= 0) {
                out_data[at0[f] + m * P] = OUT_T(v[f]);
              }
            }
          }
        }
      }
    }
  }
}
