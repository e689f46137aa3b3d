"""Workgroup shapes for 3-D dispatch grids. Torch-free; registers no op."""
from __future__ import annotations


def workgroup_for(grid, invocations: int = 64) -> tuple:
    """A workgroup of ``invocations`` (a power of two) shaped to a 3-D ``grid``: x
    first, so that few invocations fall outside small grids. Shared by the CNN op
    families (convolution, batch norm, pooling, upsampling, GEMM) for their 3-D grids.

    grid: (x, y, z) extents in invocations. Returns (x, y, z) sizes whose product is
    ``invocations``."""
    sizes = []
    left = invocations
    for extent in grid[:2]:
        size = 1
        while size < extent and size < left:
            size *= 2
        sizes.append(size)
        left //= size
    sizes.append(left)
    return tuple(sizes)


def has_subgroup_arithmetic(info) -> bool:
    """Whether the subgroups of device ``info`` (a DeviceInfo) have arithmetic
    operations (subgroupAdd, subgroupMax; VK_SUBGROUP_FEATURE_ARITHMETIC_BIT): the
    SUBGROUP reductions of linear_qw_gemv.glsl, norm.glsl's row form and
    sdpa_decode.glsl and gemv.glsl, which otherwise reduce through a shared-memory tree."""
    return "arithmetic" in info.subgroup_ops
