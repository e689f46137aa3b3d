"""Convolution: aten.convolution.default, ET-VK's et_vk.conv_with_clamp.default and our
vkdelegate.padded_conv_with_clamp / vkdelegate.conv_add (backend/custom_ops.py).

Schema: convolution(input, weight, bias?, stride, padding, dilation, transposed,
output_padding, groups); conv_with_clamp appends output_min?, output_max? (ET-VK's
fused ReLU/ReLU6/clamp epilogue, same shader with CLAMP defined); padded_conv_with_clamp
appends padding_end (TF SAME, from passes/fold_conv_padding.py), conv_add a tensor
``other`` added after the clamp (a residual, from passes/fuse_conv_add.py).

Semantics: 1-D (N, C, L) and 2-D (N, C, H, W) inputs, any batch, stride, padding,
dilation and groups, transposed with output_padding, bias or none; fp32 and fp16
(accumulated in fp32). Shaders chosen at load: pointwise convolutions (1x1, stride 1,
no padding, groups 1, constant weight) run kernels/conv_pointwise.py's implicit GEMM
(conv2d_pw.glsl; for few output blocks its split-K form, conv2d_pw.glsl SPLIT_OUT then
conv2d_pw_reduce.glsl; planes of a pixel count not a multiple of 4 as one GEMM over
the batch, conv2d_pw_tiled.glsl) on GPUs; everything else, and pointwise on CPU drivers, runs
conv2d.glsl with three paths: pointwise (a tiled GEMM over pixels; on CPU drivers its
weights and vec4 input loads through uniform texel buffers where the device can view
them, PW_TEXEL: runtime/texel.py), direct (general,
depthwise included: one channel per invocation when the output channels per group are
not a multiple of 4) and transposed (a gather over input positions).
Constant weights are prepacked once at load as fp32 [OC/T, IC/groups, KH, KW, T]
(T = output channels per invocation) so the T weights of one tap are one contiguous
read; a weight computed at run time is read as stored. Resizable in batch and spatial
sizes; the channel count must be static.
"""
from __future__ import annotations

import functools

import numpy as np

from vkdelegate.kernels import conv_columns, conv_pointwise, gemm, loop_limit
from vkdelegate.kernels.conv_geometry import (conv_shape, expand as _expand, pack_weight,
                                              shader_geometry)
from vkdelegate.kernels.rules import same_dtype, static_channels
from vkdelegate.kernels.workgroup import workgroup_for
from vkdelegate.ops.registry import NodeSpec, OpSpec, register
from vkdelegate.runtime.dtypes import STORAGE_PROFILES, device_dtype, storage_defines
from vkdelegate.runtime.param_block import ParamBlock, tensor_meta_block
from vkdelegate.shaders.bindings import Bindings, shader_bindings
from vkdelegate.shaders.variants import declare_grid, flag_defines

SHADER = gemm.CONV_SHADER  # the pointwise form is chosen by gemm.select
DTYPES = frozenset({"float32", "float16"})
CONV = "aten.convolution.default"
CONV_CLAMP = "et_vk.conv_with_clamp.default"  # schema, CPU kernel: backend/custom_ops.py
# conv_with_clamp's arguments + padding_end (begin and end padding differ): ours.
PADDED_CONV = "vkdelegate.padded_conv_with_clamp.default"
# conv_with_clamp's arguments + other: clamp(conv(x)) + other (a fused residual add).
CONV_ADD = "vkdelegate.conv_add.default"
INF = float("inf")  # an absent clamp bound: clamping to +-inf keeps +-inf results


def _shape(args):
    x, w, _bias, stride, padding, dilation, transposed, output_padding, groups = args[:9]
    return conv_shape(x.shape, w.shape, stride, padding, dilation, bool(transposed),
                      output_padding, groups)


def _padded_shape(args):
    """padded_conv_with_clamp: the input padded by ``padding`` (before) and
    ``padding_end`` (after) each spatial dim, then an unpadded convolution."""
    x, w, _bias, stride, begin, dilation = args[:6]
    groups, end = args[8], args[11]
    spatial = [x.shape[2 + i] + begin[i] + end[i] for i in range(2)]
    return conv_shape(tuple(x.shape[:2]) + tuple(spatial), w.shape, stride, [0, 0],
                      dilation, False, [0, 0], groups)


# ---- partition-time rules -------------------------------------------------------------
def _spatial_rank(node: NodeSpec):
    x, w = node.args[0], node.args[1]
    n = x.rank - 2
    if n not in (1, 2):
        return f"only 1-D and 2-D convolutions (input of rank {x.rank})"
    if w.rank != x.rank:
        return f"weight of rank {w.rank} for an input of rank {x.rank}"
    for name, i in (("stride", 3), ("padding", 4), ("dilation", 5)):
        values = node.args[i]
        if not isinstance(values, list) or len(values) not in (1, n) or \
                not all(isinstance(v, int) for v in values):
            return f"{name} {values!r} is not a list of {n} ints"
    if any(v < 1 for v in node.args[3] + node.args[5]) or any(v < 0 for v in node.args[4]):
        return "stride and dilation must be >= 1 and padding >= 0"
    return None


def _static_weight(node: NodeSpec):
    if node.args[1].is_dynamic:
        return "dynamic weight sizes"
    return None


def _groups(node: NodeSpec):
    x, w, groups = node.args[0], node.args[1], node.args[8]
    if not isinstance(groups, int) or groups < 1 or x.rank < 3:
        return f"groups {groups} is not a positive int"
    transposed = node.args[6]
    ic, oc = x.shape[1], (w.shape[1] * groups if transposed else w.shape[0])
    icg = w.shape[0] // groups if transposed else w.shape[1]
    if ic % groups or oc % groups or ic != icg * groups:
        return f"groups {groups} does not fit {ic} input and {oc} output channels"
    return None


#: Floats of the direct path's per-invocation row segment (conv2d.glsl ``seg[SEG]``, an
#: array sized by specialization constants): a crafted stride of 65,537 made it 460,000
#: floats, which hung pipeline creation for minutes and grew past 20 GB.
MAX_SEGMENT = 4096
#: Statements of the tap loops the LONG_LOOPS form unrolls, KH x (SEG + KW x PX):
#: pipeline creation on llvmpipe takes about 1 s at this size and grows with it.
MAX_UNROLLED = 4096
INT32_MAX = (1 << 31) - 1
#: Non-pointwise convolutions with constant weights take kernels/conv_columns.py's
#: shader (a test switches it off to compare with conv2d.glsl).
USE_COLUMNS = True


def _segment(kernel, stride, dilation, px: int) -> int:
    """Input columns the PX outputs of one invocation touch (the seg array)."""
    return (px - 1) * stride[1] + (kernel[1] - 1) * dilation[1] + 1


def _shader_bounds(node: NodeSpec):
    """ATen's window checks, int32 index arithmetic, and the sizes the shader's
    private array and unrolled loops may have (see MAX_SEGMENT, MAX_UNROLLED)."""
    x, w, out = node.args[0], node.args[1], node.outputs[0]
    transposed = bool(node.args[6])
    kernel, stride, pad, dil = shader_geometry(x.shape, w.shape, out.shape, node.args[3],
                                               node.args[4], node.args[5], transposed)
    if any(k < 1 for k in kernel):
        return f"kernel sizes {list(w.shape[2:])} must be >= 1"
    extents = [(k - 1) * d + 1 for k, d in zip(kernel, dil)]
    sizes = [1] * (4 - x.rank) + list(x.shape[2:])
    for i in range(2):
        span = max(sizes[i] + 2 * pad[i], (sizes[i] - 1) * stride[i]) + extents[i]
        if max(stride[i], pad[i], dil[i], span) > INT32_MAX:
            return (f"stride {stride[i]}, padding {pad[i]} and dilation {dil[i]} over an "
                    f"input of {sizes[i]} exceed the shader's int32 index range")
        if not transposed and extents[i] > sizes[i] + 2 * pad[i]:
            return (f"kernel extent {extents[i]} (kernel {kernel[i]}, dilation {dil[i]}) "
                    f"is larger than the padded input size {sizes[i] + 2 * pad[i]}")
    px = 8  # the larger of the shader's two output widths (PX)
    icg = x.shape[1] // max(int(node.args[8]), 1)
    long_loops = loop_limit.over_budget(
        _plain_loop_iterations(transposed, icg, kernel, stride, dil, px))
    seg = 0 if transposed else _segment(kernel, stride, dil, px)
    if seg > MAX_SEGMENT:
        return (f"a row segment of {seg} input columns per invocation (stride "
                f"{stride[1]}, kernel {kernel[1]}, dilation {dil[1]}): the shader holds "
                f"at most {MAX_SEGMENT}")
    unrolled = kernel[0] * (seg + kernel[1] * px)
    if long_loops and unrolled > MAX_UNROLLED:
        return (f"kernel {kernel[0]} x {kernel[1]} with {icg} input channels per group "
                f"needs {unrolled} unrolled tap statements, more than {MAX_UNROLLED}")
    return None


def _checked(rule):
    """Run ``rule`` only on nodes the earlier rules accept (it reads their fields)."""
    def run(node: NodeSpec):
        if _spatial_rank(node) or _groups(node) or not isinstance(node.args[6], int) \
                or not node.outputs:
            return None
        return rule(node)
    return run


RULES = (_spatial_rank, static_channels, _static_weight, same_dtype, _groups, _checked(_shader_bounds))


def _padded_rule(node: NodeSpec):
    """padded_conv_with_clamp: 2-D, not transposed, two non-negative begin and end
    pads; the padded input must hold the kernel's extent (ATen's check on the padded
    tensor)."""
    x, w = node.args[0], node.args[1]
    begin, end = node.args[4], node.args[11] if len(node.args) > 11 else None
    if x.rank != 4 or node.args[6]:
        return "only 2-D, non-transposed convolutions"
    for name, pads in (("padding", begin), ("padding_end", end)):
        if not (isinstance(pads, (list, tuple)) and len(pads) == 2 and
                all(isinstance(p, int) and 0 <= p <= INT32_MAX // 4 for p in pads)):
            return f"{name} {pads!r}: two non-negative ints expected"
    dil = _expand(node.args[5], 2)
    for i in range(2):
        extent = (w.shape[2 + i] - 1) * dil[i] + 1
        if extent > x.shape[2 + i] + begin[i] + end[i]:
            return (f"kernel extent {extent} is larger than the padded input size "
                    f"{x.shape[2 + i] + begin[i] + end[i]}")
    return None


PADDED_RULES = (_padded_rule,) + RULES


# ---- runtime ------------------------------------------------------------------------
def _defines(out, x, w, bias, *, tile: int, packed: bool, mode: str, clamp: bool,
             long_loops: bool = False, residual=None, shifted: bool = False,
             texel: bool = False) -> dict:
    tensors = dict(OUT=out, IN=x, W=w, B=bias)
    if residual is not None:
        tensors["R"] = residual
    d = dict(storage_defines(**tensors), OC_TILE=str(tile),
             **flag_defines(LONG_LOOPS=long_loops, W_PACKED=packed, CLAMP=clamp,
                            TRANSPOSED=mode == "transposed", POINTWISE=mode == "pointwise",
                            RESIDUAL=residual is not None, PW_SHIFTED=shifted,
                            PW_TEXEL=texel))
    if mode == "pointwise":
        d["IN4_T"] = "f16vec4" if d["IN_T"] == "float16_t" else "vec4"
    return d


CONV_PARAMS = ParamBlock("conv_block", [
    ("channels", "ivec4"),  # input channels per group, output channels per group
    ("clamp", "vec4")])     # output min, output max (CLAMP only)


def _texel_formats(d) -> tuple:
    """(binding, texel format) of the pointwise form's PW_TEXEL inputs (defines ``d``
    without PW_TEXEL are enough): the packed fp32 weights (a vec4 of 4 output channels,
    or one), the input's vec4s (fp16 where the input is stored so)."""
    return (("w_data", "rgba32f" if d["OC_TILE"] == "4" else "r32f"),
            ("in4_data", "rgba16f" if d["IN4_T"] == "f16vec4" else "rgba32f"))


@shader_bindings(SHADER)
def _bindings(d) -> Bindings:
    # The pointwise form reads the input a second time as in4_data, 4 elements a load.
    return Bindings(outputs=("out_data",),
                    inputs=("in_data", "w_data", "b_data") +
                    (("in4_data",) if "POINTWISE" in d else ()) +
                    (("r_data",) if "RESIDUAL" in d else ()),
                    params=(tensor_meta_block("out_meta"), tensor_meta_block("in_meta"),
                            CONV_PARAMS),
                    texels=_texel_formats(d) if "PW_TEXEL" in d else ())


def _plain_loop_iterations(transposed: bool, icg: int, kernel, stride, dilation,
                           px: int) -> int:
    """Worst-case loop iterations per invocation of conv2d.glsl's direct and transposed
    paths without LONG_LOOPS, counting every loop as if the compiler unrolled none
    (llvmpipe's budget). The pointwise path's count is kernels/gemm.py's
    (GemmForm.iterations), where its form is chosen."""
    taps = kernel[1] * (1 + px)
    if not transposed:
        taps += (px - 1) * stride[1] + (kernel[1] - 1) * dilation[1] + 1  # row segment
    return icg * kernel[0] * (1 + taps) + px


def _build(b, node, clamp_ids=None, end_padded=False, residual_id=None):
    (x_id, w_id, bias_id, stride_id, pad_id, dil_id, tr_id, opad_id, groups_id,
     out_id) = list(node.args[:9]) + [node.args[-1]]
    x, w, out = b.tensor(x_id), b.tensor(w_id), b.tensor(out_id)
    residual = None if residual_id is None else b.tensor(residual_id)
    if residual is not None and (tuple(residual.max_shape) != tuple(out.max_shape) or
                                 residual.dtype != out.dtype):
        raise b.error(f"residual {list(residual.max_shape)} {residual.dtype} for an "
                      f"output {list(out.max_shape)} {out.dtype}")
    transposed, groups = bool(b.scalar(tr_id)), int(b.scalar(groups_id))
    n = x.ndim - 2
    if n not in (1, 2) or w.ndim != x.ndim or out.ndim != x.ndim:
        raise b.error(f"only 1-D and 2-D convolutions: input {list(x.max_shape)}, "
                      f"weight {list(w.max_shape)}")
    if len({x.dtype, w.dtype, out.dtype}) != 1:
        raise b.error(f"mixed dtypes {x.dtype}, {w.dtype}, {out.dtype}")
    # A 1-D convolution is a 2-D one of height 1; unused strides are 1 (see there).
    kernel, stride, pad, dil = shader_geometry(
        x.max_shape, w.max_shape, out.max_shape, b.int_list(stride_id),
        b.int_list(pad_id), b.int_list(dil_id), transposed)
    ic, oc = x.max_shape[1], out.max_shape[1]
    icg, ocg = ic // groups, oc // groups
    weight = b.constant_array(w)
    packed = weight is not None
    # The pointwise path reads input pixel i for output pixel i: no padding at all.
    pointwise = (packed and not transposed and kernel == [1, 1] and stride == [1, 1]
                 and pad == [0, 0] and groups == 1 and not end_padded)
    bias = b.value(bias_id)
    if bias is None or b.constant_array(bias) is not None:
        values = np.zeros(oc, np.float32) if bias is None else b.constant_array(bias)
        bias = b.prepacked(values.astype(np.float32).reshape(oc), "float32")
    lo, hi = -INF, INF
    if clamp_ids is not None:
        lo_v, hi_v = (b.scalar(i) for i in clamp_ids)
        lo = lo if lo_v is None else float(lo_v)
        hi = hi if hi_v is None else float(hi_v)
    # The new kernels read an fp32 bias (prepacked, or computed at run time in fp32); an
    # fp16 one keeps conv2d.glsl.
    fp32_bias = bias.dtype == "float32" and bias.device_dtype == "float32"
    if pointwise and conv_pointwise.use_gemm(b.device.info) and fp32_bias:
        # GPUs: the implicit GEMM of kernels/conv_pointwise.py.
        conv_pointwise.record(b, out, x, w, bias, lo, hi, clamp_ids is not None, n,
                              residual)
        return
    # Specialization constants 3..11: KH, KW, SH, SW, PH, PW, DH, DW, spatial dims.
    geometry = (kernel[0], kernel[1], stride[0], stride[1], pad[0], pad[1], dil[0], dil[1],
                n)
    if USE_COLUMNS and not pointwise and fp32_bias and \
            conv_columns.applies(transposed, packed, kernel, stride, dil):
        w = b.packed_constant(w, functools.partial(
            pack_weight, groups=groups, transposed=False, tile=conv_columns.tile(ocg)),
            "float32")
        conv_columns.record(b, out, x, w, bias, (icg, ocg), lo, hi, clamp_ids is not None,
                            geometry, residual)
        return
    mode = "transposed" if transposed else ("pointwise" if pointwise else "direct")
    if pointwise:
        # A GEMM over pixels: kernels/gemm.py picks its tile and loop form, as for
        # every other matrix product, and checks the loop budget.
        mx = out.max_shape
        pixels = mx[2] * mx[3] if n == 2 else mx[2]
        form = gemm.checked_select(b, pixels, oc, ic, plain=False, pointwise_conv=True,
                                   what=f"{icg} input channels per group")
        tile, long_loops = form.tile, form.long_k
    else:
        # A weight computed at run time is read as stored, one channel a time.
        tile = 4 if packed and ocg % 4 == 0 else 1
        # The shader's only data-sized loop runs over input channels (the tap loops
        # are unrolled in LONG_LOOPS): llvmpipe's loop limit.
        long_loops = loop_limit.over_budget(_plain_loop_iterations(
            transposed, icg, kernel, stride, dil, 4 if tile == 4 else 8))
        if long_loops:
            # The LONG_LOOPS form: only the channel loop counts.
            loop_limit.check(b, icg, f"{icg} input channels per group")
    if packed:
        w = b.packed_constant(w, functools.partial(
            pack_weight, groups=groups, transposed=transposed, tile=tile), "float32")
    params = b.params(CONV_PARAMS.pack(channels=[icg, ocg], clamp=[lo, hi]))
    mx = out.max_shape
    oh, ow = (mx[2], mx[3]) if n == 2 else (1, mx[2])
    px = gemm.CONV_PX if pointwise else (4 if tile == 4 else 8)  # outputs per invocation
    if pointwise:
        grid = (-(-(oh * ow) // px), oc // tile, mx[0])
    else:
        grid = (-(-ow // px), oh, mx[0] * (oc // tile))
    # Pointwise with input channels a multiple of 4: planes that are not a multiple of
    # 4 (7 x 7) are read as vec4s too (PW_SHIFTED; the input's size is then a multiple
    # of 4 elements, which the shader's clamp needs).
    shifted = pointwise and ic % 4 == 0
    defines = _defines(out, x, w, bias, tile=tile, packed=packed, mode=mode,
                       clamp=clamp_ids is not None, long_loops=long_loops,
                       residual=residual, shifted=shifted)
    # CPU drivers: the weights and the input's vec4s through texel views (PW_TEXEL)
    # where the device can view both, else storage buffers.
    if pointwise and all(b.texel_input(t, fmt) for t, (_, fmt) in
                         zip((w, x), _texel_formats(defines))):
        defines["PW_TEXEL"] = "1"
    b.dispatch(SHADER, defines,
               outputs=[out], inputs=[x, w, bias] + ([x] if pointwise else []) +
               ([residual] if residual is not None else []),
               params=[out.meta, x.meta, params],
               spec_constants=geometry,
               global_size=grid, local_size=workgroup_for(grid))


def _impl(b, node):
    _build(b, node)


def _impl_clamp(b, node):
    _build(b, node, clamp_ids=node.args[9:11])


def _impl_padded(b, node):
    # The shader reads zeros outside the input: begin padding is its PH/PW offset, the
    # end padding only makes the output (sized by the shape function) larger.
    end = b.int_list(node.args[11])
    if len(end) != 2 or min(end) < 0:
        raise b.error(f"padding_end {end}: two non-negative ints expected")
    _build(b, node, clamp_ids=node.args[9:11], end_padded=any(end))


def _impl_add(b, node):
    _build(b, node, clamp_ids=node.args[9:11], residual_id=node.args[11])


def _add_rule(node: NodeSpec):
    """conv_add: ``other`` has the output's shape and dtype (no broadcasting)."""
    other, out = node.args[11], node.outputs[0] if node.outputs else None
    if out is None or not hasattr(other, "shape") or tuple(other.shape) != \
            tuple(out.shape) or other.dtype != out.dtype:
        return "the added tensor must have the convolution output's shape and dtype"
    return None


register(OpSpec(name=CONV, dtypes=DTYPES, impl=_impl, shape_fn=_shape, rules=RULES,
                max_rank=4, notes="1-D/2-D, stride, padding, dilation, groups, "
                "transposed; pointwise and depthwise paths"))
register(OpSpec(name=CONV_CLAMP, dtypes=DTYPES, impl=_impl_clamp, shape_fn=_shape,
                rules=RULES, max_rank=4,
                notes="convolution with a fused clamp/ReLU/ReLU6 epilogue (ET-VK)"))
register(OpSpec(name=PADDED_CONV, dtypes=DTYPES, impl=_impl_padded, shape_fn=_padded_shape,
                rules=PADDED_RULES, max_rank=4,
                notes="2-D convolution of a zero-padded input, begin/end padding apart "
                      "(TF SAME), optional clamp; folded from constant_pad_nd"))
register(OpSpec(name=CONV_ADD, dtypes=DTYPES, impl=_impl_add, shape_fn=_shape,
                rules=RULES + (_add_rule,), max_rank=4,
                notes="convolution (optional clamp) + a residual of its output's shape, "
                      "added in the epilogue; fused from aten.add.Tensor"))


def _variant(profile, dtype: str, packed: bool, run_time_bias: bool, mode: str, tile: int,
             clamp: bool, long_loops: bool, residual: bool, shifted: bool, texel: bool):
    """A constant weight is prepacked fp32 (any tile and path); a weight computed at run
    time is read as stored, by the one-channel direct or transposed path only. A bias
    computed at run time keeps the input dtype; a constant one is fp32. PW_TEXEL: the
    pointwise path's form on CPU drivers."""
    if not packed and (tile != 1 or mode == "pointwise"):
        return None
    if residual and (not packed or run_time_bias):
        return None  # the residual add is declared for the usual constant-weight form
    if shifted and mode != "pointwise":
        return None
    if texel and mode != "pointwise":
        return None
    ddt, f32 = (dtype, device_dtype(dtype, profile)), ("float32", "float32")
    return _defines(ddt, ddt, f32 if packed else ddt, ddt if run_time_bias else f32,
                    tile=tile, packed=packed, mode=mode, clamp=clamp, long_loops=long_loops,
                    residual=ddt if residual else None, shifted=shifted, texel=texel)


declare_grid(SHADER, _variant, profile=STORAGE_PROFILES, dtype=DTYPES, packed=(True, False),
             run_time_bias=(False, True), mode=("direct", "transposed", "pointwise"),
             tile=(1, 4), clamp=(False, True), long_loops=(False, True),
             residual=(False, True), shifted=(False, True), texel=(False, True))
