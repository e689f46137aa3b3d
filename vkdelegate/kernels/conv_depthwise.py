"""The depthwise convolution kernel: conv2d_dw.glsl.

A convolution whose groups equal its input and output channels (one filter per
channel, MobileNet / EfficientNet's depthwise layers) with a constant weight runs a
shader of its own: a column of ``ROWS`` outputs per invocation, adjacent invocations on
adjacent output columns, the channel's filter in registers (see the shader's header).
Torch-free; registers no op (ops/families/convolution.py records it and keeps the
general path, conv2d.glsl, for everything else).
"""
from __future__ import annotations

import numpy as np

from vkdelegate.kernels.workgroup import workgroup_for
from vkdelegate.runtime.dtypes import STORAGE_PROFILES, device_dtype, storage_defines
from vkdelegate.runtime.param_block import ParamBlock, tensor_meta_block
from vkdelegate.shaders.bindings import Bindings, shader_bindings
from vkdelegate.shaders.variants import declare_grid, flag_defines

SHADER = "conv2d_dw"
ROWS = 4  # outputs per invocation (a column)
#: Multiply-adds of one invocation's unrolled tap loops, (input rows) x KW x ROWS: the
#: kernels past it (larger than 7 x 7 at stride 1) keep conv2d.glsl, whose pipeline
#: creation on llvmpipe grows with the unrolled size.
MAX_UNROLLED = 512
DTYPES = ("float32", "float16")
#: conv2d.glsl's parameter block (ops/families/convolution.py CONV_PARAMS).
PARAMS = ParamBlock("conv_block", [("channels", "ivec4"), ("clamp", "vec4")])


def applies(transposed: bool, groups: int, ic: int, oc: int, kernel, stride,
            dilation, packed: bool) -> bool:
    """Whether a convolution (2-D geometry lists as conv2d.glsl gets them) takes this
    kernel: not transposed, groups == ic == oc, a constant weight, and a window whose
    unrolled loops stay within MAX_UNROLLED."""
    if transposed or not packed or not (groups == ic == oc):
        return False
    rows = (ROWS - 1) * stride[0] + (kernel[0] - 1) * dilation[0] + 1
    return rows * kernel[1] * ROWS <= MAX_UNROLLED


def defines(out, x, bias, clamp: bool, residual=None) -> dict:
    """Defines for out, x, bias (Tensors or (graph dtype, device dtype) pairs; the bias
    fp32), with CLAMP and RESIDUAL (``residual``: its tensor or pair)."""
    tensors = dict(OUT=out, IN=x, B=bias)
    if residual is not None:
        tensors["R"] = residual
    return dict(storage_defines(**tensors), ROWS=str(ROWS),
                **flag_defines(CLAMP=clamp, RESIDUAL=residual is not None))


@shader_bindings(SHADER)
def _bindings(d) -> Bindings:
    return Bindings(outputs=("out_data",),
                    inputs=("in_data", "w_data", "b_data") +
                    (("r_data",) if "RESIDUAL" in d else ()),
                    params=(tensor_meta_block("out_meta"), tensor_meta_block("in_meta"),
                            PARAMS))


def record(b, out, x, weight: np.ndarray, bias, lo: float, hi: float, clamp: bool,
           geometry: tuple, residual=None) -> None:
    """Record the depthwise convolution out = [residual +] clamp(x (*) weight + bias)
    on the node builder ``b``: x [N, C, *S], out [N, C, *S'], ``weight`` the constant
    host array [C, 1, KH(, KW)], ``bias`` a fp32 Tensor [C], ``geometry`` conv2d.glsl's
    specialization constants (KH, KW, SH, SW, PH, PW, DH, DW, spatial dims)."""
    mx = out.max_shape
    c = mx[1]
    w = b.prepacked(np.ascontiguousarray(weight.astype(np.float32).reshape(c, -1)),
                    "float32")
    params = b.params(PARAMS.pack(channels=[1, 1], clamp=[lo, hi]))
    oh, ow = (mx[2], mx[3]) if len(mx) == 4 else (1, mx[2])
    grid = (ow, -(-oh // ROWS), mx[0] * c)
    b.dispatch(SHADER, defines(out, x, bias, clamp, residual), outputs=[out],
               inputs=[x, w, bias] + ([residual] if residual is not None else []),
               params=[out.meta, x.meta, params], global_size=grid,
               local_size=workgroup_for(grid), spec_constants=geometry)


def _variant(profile, dtype: str, clamp: bool, residual: bool) -> dict:
    ddt = (dtype, device_dtype(dtype, profile))
    return defines(ddt, ddt, ("float32", "float32"), clamp, ddt if residual else None)


declare_grid(SHADER, _variant, profile=STORAGE_PROFILES, dtype=DTYPES,
             clamp=(False, True), residual=(False, True))
