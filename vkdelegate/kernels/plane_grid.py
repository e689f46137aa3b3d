"""The (column, row, plane) grid of shaders with one invocation per output element
over the last two dims (pool2d.glsl, upsample2d.glsl through plane_grid.h).

Torch-free. Used by the pooling and upsampling op families.
"""
from __future__ import annotations

import math

from vkdelegate.kernels.workgroup import workgroup_for


def plane_grid(b, out) -> tuple[tuple, tuple, bool]:
    """(grid, workgroup, plane loop) for ``out`` (a (C, H, W) or (N, C, H, W) tensor of
    the node builder ``b``) at its upper-bound sizes: grid (columns, rows, planes) in
    invocations, its z capped at the device's workgroup-count limit, in which case
    (plane loop True) the shader's PLANE_LOOP variant strides over the planes."""
    *planes, h, w = out.max_shape
    grid = (w, h, math.prod(planes))
    local = workgroup_for(grid)
    limit = b.device.info.max_workgroup_count[2] * local[2]
    return (w, h, min(grid[2], limit)), local, grid[2] > limit
