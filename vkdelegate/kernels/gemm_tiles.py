"""The GEMM tile table: per device type, which kernel and block a product gets.

``kernels/gemm.py`` asks ``tiles_for(info.type)`` for the row of the device it records
on (None: the simple shaders matmul.glsl / linear.glsl for every product). GPUs get
the GEMM core (gemm.glsl) and the GEMV path (gemv.glsl) with the blocks below.
Where the device has cooperative matrices (16 x 16 x 16, FLOAT16 -> FLOAT32) fp16
products take the core's cooperative-matrix form (gemm_coopmat.glsl) with the
``coop_large`` / ``coop_small`` blocks instead.
CPU drivers (llvmpipe) get the core's 128 x 128 block for aten.mm only: there it
took 1/12 (256^3) to 1/14 (512^3) of matmul.glsl's time with b at run time, while
linear.glsl stayed as fast as the core for the other products and much faster than
the GEMV path for one row (benchmarks/gemm.py; numbers in docs/PERF.md).
Torch-free; registers no op.
"""
from __future__ import annotations

from dataclasses import dataclass


def core_groups(batch: int, m: int, n: int, block: tuple) -> int:
    """Workgroups of the GEMM core's (TM, TN, ...) ``block`` (16 x 16 invocations of
    TM x TN outputs each) over a [batch, m, n] output."""
    return batch * -(-m // (16 * block[0])) * -(-n // (16 * block[1]))


@dataclass(frozen=True)
class GemmTiles:
    """One device type's blocks. ``large`` and ``small``: (TM, TN, BK) of the GEMM
    core (outputs per invocation in M and N, K step; a 16 x 16 workgroup computes
    16 TM x 16 TN outputs). ``large`` is used once the product has at least
    ``large_min_groups`` such blocks (enough to fill the device), else ``small``.
    ``gemv_rows``: outputs per workgroup of the GEMV path for [N, K] weights.
    ``plain_only``: only aten.mm products (two matrices, no batch, bias or scaling)
    take the core; ``gemv``: one-row products take the GEMV path (else, one row
    keeps the simple shaders); ``vec_load``: where the core uses vec4 global loads
    (gemm.glsl VEC_LOAD): True (always), False (never) or the (graph dtype, b layout
    "kn"/"nk", block) triples that take them. Split-K: a product whose block gives at
    most a quarter of ``split_k_groups`` workgroups (0: never) and whose K is at least
    ``split_k_min_k`` has its K split in up to ``split_k_groups`` / groups parts
    (each of at least ``split_k_min_part`` k, at most 64 parts).
    ``coopmat``: fp16 products (m > 1) take gemm_coopmat.glsl where the device has
    cooperative matrices; ``coop_large`` / ``coop_small``: its (BM, BN, BK, WM, WN,
    STAGES) blocks (a BM x BN block per workgroup of (BM / WM) * (BN / WN) subgroups,
    each owning WM x WN outputs; K steps of BK; STAGES 2: double-buffered shared
    tiles), ``coop_large`` from ``coop_large_min_groups`` such blocks on.
    ``large_fp32``: where set, float32 products take this block instead of ``large``
    once it alone gives ``large_min_groups`` blocks (else ``large`` / ``small`` as
    above). ``coop_wg`` / ``coop_wg_small``: where set, (BM, BN, BK, UNROLL) blocks
    of gemm_coopmat_wg.glsl (workgroup-scope cooperative matrices with tensor
    addressing, VK_NV_cooperative_matrix2), which fp16 products of at least
    ``coop_wg_min_macs`` multiply-adds (batch * m * n * k at the upper bounds) take
    instead of gemm_coopmat.glsl on devices that have it: ``coop_wg`` from
    ``coop_wg_min_groups`` such blocks on, else ``coop_wg_small``."""

    large: tuple = (8, 8, 16)
    small: tuple = (4, 4, 16)
    large_min_groups: int = 256
    gemv_rows: int = 4
    plain_only: bool = False
    gemv: bool = True
    vec_load: "bool | tuple" = True
    split_k_groups: int = 0
    split_k_min_k: int = 2048
    split_k_min_part: int = 256
    coopmat: bool = True
    coop_large: tuple = (128, 256, 32, 64, 64, 1)
    coop_small: tuple = (64, 64, 32, 32, 32, 2)
    coop_large_min_groups: int = 132
    large_fp32: "tuple | None" = None
    coop_wg: tuple = ()
    coop_wg_small: tuple = ()
    coop_wg_min_groups: int = 256
    coop_wg_min_macs: int = 1 << 29

    def core_block(self, batch: int, m: int, n: int, dtype: str = "float32") -> tuple:
        """(TM, TN, BK) for a [batch, m, n] output of graph dtype ``dtype``."""
        if dtype == "float32" and self.large_fp32 and \
                core_groups(batch, m, n, self.large_fp32) >= self.large_min_groups:
            return self.large_fp32
        large = core_groups(batch, m, n, self.large) >= self.large_min_groups
        return self.large if large else self.small

    def coop_block(self, batch: int, m: int, n: int) -> tuple:
        """(BM, BN, BK, WM, WN, STAGES) of gemm_coopmat.glsl for a [batch, m, n] output."""
        bm, bn = self.coop_large[:2]
        groups = batch * -(-m // bm) * -(-n // bn)
        return self.coop_large if groups >= self.coop_large_min_groups else self.coop_small

    def coop_wg_block(self, batch: int, m: int, n: int) -> tuple:
        """(BM, BN, BK, UNROLL) of gemm_coopmat_wg.glsl for a [batch, m, n] output,
        () where the row has none."""
        if not self.coop_wg:
            return ()
        bm, bn = self.coop_wg[:2]
        large = batch * -(-m // bm) * -(-n // bn) >= self.coop_wg_min_groups
        return self.coop_wg if large or not self.coop_wg_small else self.coop_wg_small

    def splits(self, batch: int, m: int, n: int, k: int, block: tuple) -> int:
        """How many parts split-K cuts K into for this product and ``block`` (1: none)."""
        groups = core_groups(batch, m, n, block)
        if not self.split_k_groups or groups * 4 > self.split_k_groups or \
                k < self.split_k_min_k:
            return 1
        return max(1, min(self.split_k_groups // groups, k // self.split_k_min_part, 64))

    def uses_vec_load(self, dtype: str, nk: bool, block: tuple) -> bool:
        """Whether the core's ``block`` for ``dtype`` data and b [N, K] (``nk``) or
        [K, N] takes VEC_LOAD's vec4 global loads."""
        if isinstance(self.vec_load, bool):
            return self.vec_load
        return (dtype, "nk" if nk else "kn", tuple(block)) in self.vec_load


#: Device type (DeviceInfo.type: "cpu", "discrete", "integrated", "virtual", "other")
#: -> its tiles.
TABLE: dict = {"cpu": GemmTiles(large_min_groups=0, plain_only=True, gemv=False,
                                vec_load=False, coopmat=False)}
#: The GPU row, from the H200 (4096^3, fp32/fp16, 5-run medians that moved up to 15%
#: between runs of one configuration): 128 x 128 blocks from 256 of them (1024 at
#: 4096^2: 22.7-27.5 TFLOP/s fp32 against 18.8-21.7 for 64 x 64), 64 x 64 below
#: (256 x 4096 x 4096: 64 large blocks, 15 against 17 TFLOP/s); BK 8 and 32, 64 x 128
#: and 128 x 64 blocks were no better. vec4 global loads only for fp16 [N, K] weights
#: in 128 x 128 blocks (30 against 21.8 TFLOP/s); elsewhere they were 10-20% slower.
#: Split-K aims at 264 workgroups (two per SM of the H200's 132).
#: Cooperative matrices (fp16), H200 4096^3 linear: 128 x 256 blocks of 8 subgroups
#: owning 64 x 64 each, BK 32, one shared buffer: 103 TFLOP/s (mm, b [K, N]: 70);
#: 256 x 128 the same; 128 x 128 with 64 x 32 per subgroup double-buffered 87 (mm 63),
#: with 64 x 64 per subgroup (4 subgroups) 73; BK 64 82-90; grouping block rows for
#: L2 and loading all B fragments before the products changed nothing. From one wave
#: of 132 such blocks on; below (256 x 4096 x 4096: 32 blocks) 64 x 64 blocks of 4
#: subgroups, 52 TFLOP/s against 38-40 for the large ones.
#: fp32 from 256 blocks of 128 x 256 outputs (16 x 16 invocations of 8 x 16, no vec4
#: loads): 4096^3 linear 46.1 TFLOP/s against 37.3 for 128 x 128 (mm 45.0 / 42.2;
#: 256 x 128 blocks 42.8 / 42.3; with vec4 loads 36.4 / 38.3); 256 x 4096 x 4096 keeps
#: the 64 x 64 blocks (29.4 against 11.1: 32 large blocks). Same run: cuBLAS 49.7 / 51.1
#: (docs/PERF.md, "The H200, 2026-12-02 evening: fp32 core blocks").
#: Split-K from K = 1024 (the dataclass's 2048 missed EfficientNet-Lite0's batch-8
#: classifier, 8 x 1280 -> 1000 fp32: 16 workgroups over K = 1280, 66.5 us on an
#: H100, docs/PERF.md "An H100, 2026-12-05 (fifth session)").
#: Workgroup-scope cooperative matrices (VK_NV_cooperative_matrix2, tensor-addressed
#: loads; H100, 2026-12-06, benchmarks/gemm.py forms wBMxBNxBKxUNROLL, fp16, TFLOP/s):
#: 4096^3 mm (b [K, N]) 128 x 256 x 32 unrolled 32: 300 (the subgroup form 214; 16:
#: 294, 8: 265, 1: 183; 256 x 128 272; BK 64 196-204), linear (b [N, K]) 263 (128 x 128
#: x 64 x 32: 271; the subgroup form 204); below 256 such blocks 128 x 128 x 64 x 16:
#: 256 x 4096 x 4096 122 (the subgroup form's 64 x 64 77, 128 x 256 64), 2048^3
#: linear 231 (101). From 2^29 multiply-adds (128 x 2048 x 2048: both forms 30).
DEFAULT = GemmTiles(vec_load=(("float16", "nk", (8, 8, 16)),), split_k_groups=264,
                    split_k_min_k=1024, large_fp32=(8, 16, 16),
                    coop_wg=(128, 256, 32, 32), coop_wg_small=(128, 128, 64, 16))


def tiles_for(device_type: str) -> "GemmTiles | None":
    """The row of ``device_type``: TABLE's entry, DEFAULT for a type it lacks."""
    return TABLE.get(device_type, DEFAULT)
