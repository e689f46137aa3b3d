"""The GEMM tile table: per device type, which kernel and block a product gets.

``kernels/gemm.py`` asks ``tiles_for(info.type)`` for the row of the device it records
on (None: the simple shaders matmul.glsl / linear.glsl for every product). GPUs get
the GEMM core (gemm.glsl) and the GEMV path (gemv.glsl) with the blocks below.
CPU drivers (llvmpipe) get the core's 128 x 128 block for aten.mm only: there it
took 1/12 (256^3) to 1/14 (512^3) of matmul.glsl's time with b at run time, while
linear.glsl stayed as fast as the core for the other products and much faster than
the GEMV path for one row (benchmarks/gemm.py; numbers in docs/PERF.md).
Torch-free; registers no op.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GemmTiles:
    """One device type's blocks. ``large`` and ``small``: (TM, TN, BK) of the GEMM
    core (outputs per invocation in M and N, K step; a 16 x 16 workgroup computes
    16 TM x 16 TN outputs). ``large`` is used once the product has at least
    ``large_min_groups`` such blocks (enough to fill the device), else ``small``.
    ``gemv_rows``: outputs per workgroup of the GEMV path for [N, K] weights.
    ``plain_only``: only aten.mm products (two matrices, no batch, bias or scaling)
    take the core; ``gemv``: one-row products take the GEMV path (else, one row
    keeps the simple shaders); ``vec_load``: the core's vec4 global loads (gemm.glsl
    VEC_LOAD)."""

    large: tuple = (8, 8, 16)
    small: tuple = (4, 4, 16)
    large_min_groups: int = 256
    gemv_rows: int = 4
    plain_only: bool = False
    gemv: bool = True
    vec_load: bool = True

    def core_block(self, batch: int, m: int, n: int) -> tuple:
        """(TM, TN, BK) for a [batch, m, n] output."""
        tm, tn, _ = self.large
        groups = batch * -(-m // (16 * tm)) * -(-n // (16 * tn))
        return self.large if groups >= self.large_min_groups else self.small


#: Device type (DeviceInfo.type: "cpu", "discrete", "integrated", "virtual", "other")
#: -> its tiles.
TABLE: dict = {"cpu": GemmTiles(large_min_groups=0, plain_only=True, gemv=False)}
DEFAULT = GemmTiles()


def tiles_for(device_type: str) -> "GemmTiles | None":
    """The row of ``device_type``: TABLE's entry, DEFAULT for a type it lacks."""
    return TABLE.get(device_type, DEFAULT)
