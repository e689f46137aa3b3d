"""Convolution geometry shared by the convolution kernels and their op family: ATen's
output sizes, the 2-D window parameters the shaders get, and the prepacked weight
layout of conv2d.glsl and conv2d_col.glsl. Torch-free; registers no op."""
from __future__ import annotations

import numpy as np


def conv_output_size(size: int, k: int, s: int, p: int, d: int, transposed: bool,
                     output_padding: int) -> int:
    """One spatial output size, as ATen computes it."""
    if transposed:
        return (size - 1) * s - 2 * p + d * (k - 1) + output_padding + 1
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def expand(values, n: int) -> list[int]:
    """ATen broadcasts a one-element stride/padding/dilation list to every dim."""
    values = list(values or [])
    return values * n if len(values) == 1 else values


def conv_shape(x_shape, w_shape, stride, padding, dilation, transposed, output_padding,
               groups) -> tuple:
    """Output sizes of a convolution with input ``x_shape`` and weight ``w_shape``."""
    n = len(x_shape) - 2
    stride, padding = expand(stride, n), expand(padding, n)
    dilation, output_padding = expand(dilation, n), expand(output_padding or [0], n)
    oc = w_shape[1] * groups if transposed else w_shape[0]
    spatial = tuple(conv_output_size(x_shape[2 + i], w_shape[2 + i], stride[i], padding[i],
                                     dilation[i], transposed, output_padding[i])
                    for i in range(n))
    return (x_shape[0], oc) + spatial


def shader_geometry(x_shape, w_shape, out_shape, stride, padding, dilation,
                    transposed: bool):
    """(kernel, stride, padding, dilation) as conv2d.glsl gets them: 2-D lists (a 1-D
    convolution is a 2-D one of height 1), with the stride of a non-transposed dim
    whose output has one position set to 1 (it is never used, and a huge one would
    only size the row segment)."""
    n = len(x_shape) - 2
    stride, padding = expand(stride, n), expand(padding, n)
    dilation, kernel = expand(dilation, n), list(w_shape[2:])
    if not transposed:
        stride = [1 if o <= 1 else st for st, o in zip(stride, out_shape[2:])]
    if n == 1:
        return [1] + kernel, [1] + stride, [0] + padding, [1] + dilation
    return kernel, stride, padding, dilation


def pack_weight(weight: np.ndarray, groups: int, transposed: bool, tile: int) -> np.ndarray:
    """Weight (ATen layout, 1-D or 2-D) -> fp32 [OC/tile, IC/groups, KH, KW, tile]."""
    w = weight.astype(np.float32)
    if w.ndim == 3:
        w = w[:, :, None, :]  # 1-D convolution: KH = 1
    if transposed:
        ic, ocg, kh, kw = w.shape
        w = w.reshape(groups, ic // groups, ocg, kh, kw).transpose(0, 2, 1, 3, 4)
        w = w.reshape(groups * ocg, ic // groups, kh, kw)
    oc, icg, kh, kw = w.shape
    w = w.reshape(oc // tile, tile, icg, kh, kw).transpose(0, 2, 3, 4, 1)
    return np.ascontiguousarray(w)
