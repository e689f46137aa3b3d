"""The column convolution kernel: conv2d_col.glsl.

A non-transposed 2-D (or 1-D) convolution with a constant weight, depthwise layers
(MobileNet / EfficientNet) and small dense kernels alike, runs in output columns:
``ROWS`` (CPU drivers) or ``GPU_ROWS`` outputs down one column per invocation for 1
or 4 output channels, adjacent
invocations on adjacent columns, the filter taps of one input channel in registers
(see the shader's header). Measured on llvmpipe it took about half of conv2d.glsl's
direct-path time for EfficientNet-Lite0's depthwise layers (docs/PERF.md). On CPU
drivers the input and weights are read as uniform texel buffers where the device can
view them (COL_TEXEL; runtime/texel.py): depthwise layers 20-30% faster on llvmpipe.
Torch-free; registers no op (ops/families/convolution.py records it, prepacking the
weight with kernels/conv_geometry.py's ``pack_weight``, and keeps conv2d.glsl for
transposed convolutions, weights computed at run time, pointwise layers and windows
too large to unroll).
"""
from __future__ import annotations

from vkdelegate.kernels import loop_limit
from vkdelegate.kernels.workgroup import workgroup_for
from vkdelegate.runtime.dtypes import STORAGE_PROFILES, device_dtype, storage_defines
from vkdelegate.runtime.param_block import ParamBlock, tensor_meta_block
from vkdelegate.shaders.bindings import Bindings, shader_bindings
from vkdelegate.shaders.variants import declare_grid, flag_defines

SHADER = "conv2d_col"
#: Outputs per invocation (a column) on CPU drivers, and the most on any device. On
#: llvmpipe 8 took 0.75-0.85x the time of 4 for EfficientNet-Lite0's depthwise layers
#: and the small conv net's 3 x 3 ones; 16 was no better than 8.
ROWS = 8
#: Outputs per invocation on GPUs: more invocations for small planes. On the H200, 4
#: took EfficientNet-Lite0's 3 x 3 stem from 18.9 to 12.0 us (batch 1) and 41.8 to
#: 24.6 us (batch 8), its 16 column layers from 111 to 96 us at batch 1 (level at
#: batch 8); 2 was slower at batch 8 (238 us against 199).
GPU_ROWS = 4
#: Multiply-adds of one invocation's unrolled tap loops, (input rows) x KW x ROWS: 5 x 5
#: at stride 2 is 760; the kernels past it (7 x 7 at stride 2, 9 x 9) keep conv2d.glsl,
#: whose pipeline creation on llvmpipe grows less with the window.
MAX_UNROLLED = 1024
DTYPES = ("float32", "float16")
#: conv2d.glsl's parameter block (ops/families/convolution.py CONV_PARAMS).
PARAMS = ParamBlock("conv_block", [("channels", "ivec4"), ("clamp", "vec4")])


def applies(transposed: bool, packed: bool, kernel, stride, dilation) -> bool:
    """Whether a convolution (2-D geometry lists as conv2d.glsl gets them) takes this
    kernel: not transposed, a constant weight, and a window whose unrolled loops stay
    within MAX_UNROLLED."""
    if transposed or not packed:
        return False
    rows = (ROWS - 1) * stride[0] + (kernel[0] - 1) * dilation[0] + 1
    return rows * kernel[1] * ROWS <= MAX_UNROLLED


def rows_for(info) -> int:
    """Outputs per invocation on the device ``info`` (a DeviceInfo): ROWS on CPU
    drivers, GPU_ROWS elsewhere."""
    return ROWS if info.type == "cpu" else GPU_ROWS


def tile(ocg: int) -> int:
    """Output channels per invocation: 4 when the output channels per group allow."""
    return 4 if ocg % 4 == 0 else 1


def defines(out, x, bias, oc_tile: int, clamp: bool, residual=None,
            rows: int = ROWS, texel: bool = False) -> dict:
    """Defines for out, x, bias (Tensors or (graph dtype, device dtype) pairs; the bias
    fp32), ``oc_tile`` output channels and ``rows`` outputs per invocation, with CLAMP
    and RESIDUAL (``residual``: its tensor or pair); ``texel``: COL_TEXEL, the input
    and the weights read as uniform texel buffers (``texel_formats``)."""
    tensors = dict(OUT=out, IN=x, B=bias)
    if residual is not None:
        tensors["R"] = residual
    return dict(storage_defines(**tensors), ROWS=str(rows), OC_TILE=str(oc_tile),
                **flag_defines(CLAMP=clamp, RESIDUAL=residual is not None,
                               COL_TEXEL=texel))


def texel_formats(d) -> tuple:
    """(binding, texel format) of COL_TEXEL's inputs (defines ``d``): the input, one
    element a texel (fp16 where it is stored so), the packed fp32 weights (a vec4 of 4
    output channels, or one)."""
    return (("in_data", "r16f" if d["IN_T"] == "float16_t" else "r32f"),
            ("w_data", "rgba32f" if d["OC_TILE"] == "4" else "r32f"))


@shader_bindings(SHADER)
def _bindings(d) -> Bindings:
    return Bindings(outputs=("out_data",),
                    inputs=("in_data", "w_data", "b_data") +
                    (("r_data",) if "RESIDUAL" in d else ()),
                    params=(tensor_meta_block("out_meta"), tensor_meta_block("in_meta"),
                            PARAMS),
                    texels=texel_formats(d) if "COL_TEXEL" in d else ())


def record(b, out, x, w, bias, channels: tuple, lo: float, hi: float, clamp: bool,
           geometry: tuple, residual=None) -> None:
    """Record out = [residual +] clamp(conv(x, w) + bias) on the node builder ``b``:
    x [N, IC, *S], out [N, OC, *S'], ``w`` the prepacked fp32 weight Tensor
    [OC / T, IC / groups, KH, KW, T] (T = ``tile(OC / groups)``), ``bias`` a fp32
    Tensor [OC], ``channels`` (IC / groups, OC / groups), ``geometry`` conv2d.glsl's
    specialization constants (KH, KW, SH, SW, PH, PW, DH, DW, spatial dims). Raises
    DeviceLimitError (b.error) when the channel loop would pass llvmpipe's budget."""
    mx = out.max_shape
    icg, ocg = channels
    oc_tile = tile(ocg)
    loop_limit.check(b, icg + loop_limit.SLACK, f"{icg} input channels per group")
    params = b.params(PARAMS.pack(channels=[icg, ocg], clamp=[lo, hi]))
    oh, ow = (mx[2], mx[3]) if len(mx) == 4 else (1, mx[2])
    rows = rows_for(b.device.info)
    grid = (ow, -(-oh // rows), mx[0] * (mx[1] // oc_tile))
    d = defines(out, x, bias, oc_tile, clamp, residual, rows)
    # CPU drivers: the input and weights through texel views where the device can view
    # both (NodeBuilder.texel_input), else storage buffers.
    texel = all(b.texel_input(t, fmt) for t, (_, fmt) in zip((x, w), texel_formats(d)))
    b.dispatch(SHADER, defines(out, x, bias, oc_tile, clamp, residual, rows, texel),
               outputs=[out],
               inputs=[x, w, bias] + ([residual] if residual is not None else []),
               params=[out.meta, x.meta, params], global_size=grid,
               local_size=workgroup_for(grid), spec_constants=geometry)


def _variant(profile, dtype: str, oc_tile: int, clamp: bool, residual: bool,
             rows: int, texel: bool) -> dict:
    ddt = (dtype, device_dtype(dtype, profile))
    return defines(ddt, ddt, ("float32", "float32"), oc_tile, clamp,
                   ddt if residual else None, rows, texel)


declare_grid(SHADER, _variant, profile=STORAGE_PROFILES, dtype=DTYPES, oc_tile=(1, 4),
             clamp=(False, True), residual=(False, True), rows=(ROWS, GPU_ROWS),
             texel=(False, True))
