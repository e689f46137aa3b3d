// Included first by every vkdelegate compute shader (after #version and the include
// directive extension): extensions, workgroup size and the shared helpers.
#ifndef VKDELEGATE_COMMON_H
#define VKDELEGATE_COMMON_H

// 8/16-bit storage types only where the variant uses them; the runtime enables the
// matching device features (see vkdelegate/runtime/dtypes.py for the fallback).
// [[unroll]] over the 8 metadata dims turns dynamic vector indexing into constants.
#extension GL_EXT_control_flow_attributes : require

#ifdef STORAGE_16BIT
#extension GL_EXT_shader_16bit_storage : require
#endif
#ifdef STORAGE_8BIT
#extension GL_EXT_shader_8bit_storage : require
#endif

// Workgroup size is specialization constants 0..2, chosen per op and shape at load.
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;

// Parameter blocks (tensor metadata, op parameters) are uniform buffers, or readonly
// storage buffers with PARAMS_IN_STORAGE (the runtime sets it on lavapipe: Mesa 22.x
// recompiles, and leaks, a shader at every dispatch whose branch or loop conditions
// read a uniform buffer; see docs/RUNTIME.md). Every block is made of vec4/ivec4
// rows, so std140 and std430 lay it out alike.
#ifdef PARAMS_IN_STORAGE
#define PARAM_BLOCK readonly buffer
#else
#define PARAM_BLOCK uniform
#endif

#include "tensor_meta.h"

// Bindings are named, never numbered: the op declares each variant's binding list in
// Python (vkdelegate/shaders/bindings.py) and the compiler gets BINDING_<name> = index
// defines from it. A name the Python side does not declare fails to compile.
#define TENSOR_OUT(name, T) \
  layout(set = 0, binding = BINDING_##name) writeonly buffer name##_buffer { T name[]; };
#define TENSOR_IN(name, T) \
  layout(set = 0, binding = BINDING_##name) readonly buffer name##_buffer { T name[]; };
// An input read as a uniform texel buffer (the variant's Bindings list it in
// ``texels`` with its format; vkdelegate/runtime/texel.py): texelFetch(name, i) gives
// texel i as a vec4 of fp32 (.x for the one-channel formats; fp16 formats converted
// exactly). On llvmpipe a texel fetch is one vectorised gather where a storage-buffer
// load at a run-time address is a loop over the SIMD lanes.
#define TEXEL_IN(name) \
  layout(set = 0, binding = BINDING_##name) uniform samplerBuffer name;
// The same for an integer format (rgba32ui): texelFetch gives the raw bits as a uvec4.
#define TEXEL_IN_UINT(name) \
  layout(set = 0, binding = BINDING_##name) uniform usamplerBuffer name;
// An op-owned parameter block, followed by its members in braces; the members mirror
// the op's ParamBlock declaration (a test compares the compiled offsets with it).
#define PARAMS(name) layout(set = 0, binding = BINDING_##name) PARAM_BLOCK name

// Linear invocation index over a grid of workgroups laid out in x then y: a 1-D range
// longer than maxComputeWorkGroupCount[0] * local size is split into rows.
uint linear_id() {
  return gl_GlobalInvocationID.x
      + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x;
}

// llvmpipe (lavapipe) silently ends an invocation's loops after LOOP_LIMIT iterations
// (its compiler's guard against endless loops: ONE counter per invocation, which every
// iteration of every loop decrements, so sequential passes and nested loops add up).
// Work that may run longer does several elements per iteration with an [[unroll]]ed
// inner loop or spreads over a workgroup, and the op checks the worst case at load
// (LOOP_LIMIT in vkdelegate/kernels/loop_limit.py, THREAD_MAX in kernels/rows.py).
#define LOOP_LIMIT 65535u

// v rounded to the nearest fp16 value (ties to even; fp16's subnormals, overflow to
// +-inf at 65520), kept in a float: how an fp16 tensor is stored on a device without
// 16-bit storage. Integer arithmetic on the bits, because NVIDIA's compiler folds
// unpackHalf2x16(packHalf2x16(v)) into v (seen on driver 580.159.04).
float round_to_half(float v) {
  const uint u = floatBitsToUint(v);
  const uint sign = u & 0x80000000u;
  const uint a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) {
    return v;  // inf, NaN
  }
  if (a >= 0x477ff000u) {
    return uintBitsToFloat(sign | 0x7f800000u);  // past 65504 + half an ulp
  }
  if (a < 0x38800000u) {  // below 2^-14: fp16 subnormals, multiples of 2^-24
    const float r = roundEven(uintBitsToFloat(a) * 16777216.0) * (1.0 / 16777216.0);
    return uintBitsToFloat(sign | floatBitsToUint(r));
  }
  // Normal: keep 10 of the 23 significand bits, rounding the other 13 to even.
  const uint rounded = (a + 0xfffu + ((a >> 13) & 1u)) & ~0x1fffu;
  return uintBitsToFloat(sign | rounded);
}

// A quiet NaN: GLSL leaves sqrt/log of negative numbers undefined, ATen gives NaN.
#define NAN_F uintBitsToFloat(0x7fc00000u)

#endif
