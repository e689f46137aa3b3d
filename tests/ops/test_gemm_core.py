"""The GPU GEMM kernels (gemm.glsl, the GEMM core, and gemv.glsl, the GEMV path)
against eager, on every device: on a CPU driver (lavapipe), whose tile-table row
picks the simple shaders, the tests put the GPU row in its place, so both kernels
run here as on the H200. Odd sizes (edge tiles in M, N and K), both blocks of the
core, batch broadcast, bias broadcast, alpha/beta, b as [K, N] and [N, K], vec4 and
scalar GEMV loads, fp16.

fp16 tolerance: both sides accumulate in fp32 (eager's CPU fp16 matmul too) and round
the result once to fp16, whose spacing is 2^-10 |v|; with different summation orders
the results differ by about one such step, far inside rtol = atol = 1e-2."""
import dataclasses

import numpy as np
import pytest
import torch

from tests.ops import coverage
from tests.ops.harness import check_op
from tests.runtime.graphs import GraphMaker, rand
from vkdelegate.kernels import gemm, gemm_core, gemm_tiles

MM, BMM, ADDMM, LINEAR = ("aten.mm.default", "aten.bmm.default", "aten.addmm.default",
                          "aten.linear.default")
F16 = dict(rtol=1e-2, atol=1e-2)


@pytest.fixture
def forms(monkeypatch):
    """Give every device type the GPU row of the tile table (or ``tiles``), without its
    cooperative-matrix form (tests/ops/test_gemm_coopmat.py tests that one), so that
    fp16 runs the portable core on every device; collect the forms recorded."""
    def use(tiles=gemm_tiles.DEFAULT):
        portable = dataclasses.replace(tiles, coopmat=False)
        monkeypatch.setattr(gemm, "tiles_for", lambda _type: portable)
        return seen

    seen, splits = [], []
    use.splits = splits
    record = gemm.record_core

    def spy(b, form, *args, **kwargs):
        seen.append((form.shader, form.block, form.tile))
        if form.splits > 1:
            splits.append(form.splits)
        return record(b, form, *args, **kwargs)

    monkeypatch.setattr(gemm, "record_core", spy)
    return use


LARGE = gemm_tiles.GemmTiles(large_min_groups=0)  # the 128 x 128 block always


class _ConstMM(torch.nn.Module):
    def __init__(self, k, n, dtype=torch.float32):
        super().__init__()
        self.register_buffer("w", torch.randn(k, n).to(dtype))

    def forward(self, x):
        return torch.mm(x, self.w)


#: Core blocks besides the table's 64 x 64 / 128 x 128 (benchmarks/gemm.py's H200 sweep):
#: 128 x 256 (the GPU row's fp32 block, large_fp32) and 256 x 128 outputs per workgroup,
#: BK 8 and 16.
OTHER = [(8, 16, 16), (16, 8, 16), (8, 16, 8), (16, 8, 8)]


def test_gpu_row_blocks_per_dtype():
    """The GPU row: fp32 takes 128 x 256 blocks where they alone fill the device (256
    of them), else the 128 x 128 / 64 x 64 choice fp16 makes too."""
    row = gemm_tiles.DEFAULT
    assert row.core_block(1, 4096, 4096, "float32") == (8, 16, 16)
    assert row.core_block(1, 4096, 4096, "float16") == (8, 8, 16)
    assert row.core_block(1, 2048, 2048, "float32") == (8, 8, 16)  # 128 such blocks
    assert row.core_block(1, 256, 4096, "float32") == (4, 4, 16)
    assert row.core_block(4, 1024, 2048, "float32") == (8, 16, 16)  # batch counts
    assert gemm_tiles.TABLE["cpu"].core_block(1, 4096, 4096, "float32") == (8, 8, 16)


@pytest.mark.parametrize("tiles,block", [(gemm_tiles.DEFAULT, (4, 4, 16)),
                                         (LARGE, (8, 8, 16))] +
                         [(gemm_tiles.GemmTiles(large=b, large_min_groups=0), b)
                          for b in OTHER],
                         ids=["small", "large"] + ["x".join(map(str, b)) for b in OTHER])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_mm_edge_tiles(monkeypatch, forms, tiles, block, dtype):
    if block not in gemm_core._BLOCKS:  # benchmark forms, not the table's: not declared
        monkeypatch.setattr(coverage, "RECORD_VARIANTS", False)
    seen = forms(tiles)
    torch.manual_seed(0)
    tol = F16 if dtype == torch.float16 else {}
    # 131 x 37 x 70: partial blocks in M and N, K not a multiple of BK.
    check_op(torch.mm, (torch.randn(131, 37).to(dtype), torch.randn(37, 70).to(dtype)),
             ops=[MM], **tol)
    check_op(_ConstMM(37, 70, dtype), (torch.randn(131, 37).to(dtype),), ops=[MM], **tol)
    assert seen and all(s == ("gemm", block, 1) for s in seen)


@pytest.mark.parametrize("vec_load", [True, False], ids=["vec_load", "scalar_load"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_aligned_sizes(forms, vec_load, dtype):
    # K and N multiples of 4: VEC_LOAD's vec4 loads (a, b [K, N] and b [N, K]), edge
    # tiles in M (130) and N (68 of a 128 block); and the scalar form on the same sizes.
    seen = forms(gemm_tiles.GemmTiles(large_min_groups=0, vec_load=vec_load))
    torch.manual_seed(0)
    tol = F16 if dtype == torch.float16 else {}
    check_op(torch.mm, (torch.randn(130, 64).to(dtype), torch.randn(64, 68).to(dtype)),
             ops=[MM], **tol)
    check_op(torch.nn.Linear(52, 68).to(dtype), (torch.randn(2, 65, 52).to(dtype),),
             ops=[LINEAR], **tol)
    assert seen and all(s == ("gemm", (8, 8, 16), 1) for s in seen)


def test_bmm_broadcast_and_resize(forms):
    seen = forms()
    torch.manual_seed(0)
    check_op(torch.matmul, (torch.randn(2, 1, 19, 5), torch.randn(4, 5, 23)), ops=[BMM])
    b, k = torch.export.Dim("b", max=4), torch.export.Dim("k", min=2, max=40)
    check_op(torch.bmm, (torch.randn(3, 21, 33), torch.randn(3, 33, 2)), ops=[BMM],
             dynamic_shapes=({0: b, 2: k}, {0: b, 1: k}),
             resize_inputs=(torch.randn(4, 21, 2), torch.randn(4, 2, 2)))
    assert seen and all(s[0] == "gemm" for s in seen)


@pytest.mark.parametrize("bias_shape", [(70,), (67, 1), (67, 70), ()])
def test_addmm_bias_alpha_beta(forms, bias_shape):
    seen = forms()
    torch.manual_seed(0)
    args = (torch.randn(bias_shape), torch.randn(67, 45), torch.randn(45, 70))
    check_op(lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=-2.0), args, ops=[ADDMM])
    nan_bias = torch.full((67, 70), float("nan"))  # beta = 0 ignores it (ATen)
    check_op(lambda c, a, b: torch.addmm(c, a, b, beta=0), (nan_bias,) + args[1:],
             ops=[ADDMM])
    assert seen and all(s[0] == "gemm" for s in seen)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_linear_rank3_bias(forms, dtype):
    seen = forms()
    torch.manual_seed(0)
    layer = torch.nn.Linear(50, 33).to(dtype)
    check_op(layer, (torch.randn(2, 9, 50).to(dtype),), ops=[LINEAR],
             **(F16 if dtype == torch.float16 else {}))
    assert seen and all(s[0] == "gemm" for s in seen)


@pytest.mark.parametrize("subgroup", [True, False], ids=["subgroup", "shared"])
@pytest.mark.parametrize("k", [64, 300, 2056, 4104, 37],
                         ids=["vec8", "vec4", "vec8_two_passes", "two_iterations", "scalar"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_gemv_linear(forms, monkeypatch, k, dtype, subgroup):
    # One row: the GEMV path over the [N, K] weight, N = 9 not a multiple of its
    # 4 rows per workgroup; K = 300 (vec4), 2056 (fp16: 8 per load, the third of the
    # GEMV_UNROLL loads of an iteration and a tail), 4104 (a second iteration: 513
    # uvec4s / 1026 vec4s per row past 512 per iteration) or 37 (scalar) ends inside a
    # pass of the 128 invocations, so some of them add nothing. The reduction by
    # subgroupAdd (lavapipe has subgroup arithmetic) and by the shared-memory tree.
    from vkdelegate.kernels import gemm_core

    if not subgroup:
        monkeypatch.setattr(gemm_core, "has_subgroup_arithmetic", lambda info: False)
    seen = forms()
    torch.manual_seed(0)
    tol = F16 if dtype == torch.float16 else {}
    check_op(torch.nn.Linear(k, 9).to(dtype), (torch.randn(1, k).to(dtype),), ops=[LINEAR],
             **tol)
    check_op(torch.nn.Linear(k, 9, bias=False).to(dtype), (torch.randn(3, 1, k).to(dtype),),
             ops=[LINEAR], **tol)
    check_op(_ConstMM(k, 9, dtype), (torch.randn(1, k).to(dtype),), ops=[MM], **tol)
    assert seen and all(s == ("gemv", (), 4) for s in seen)


@pytest.mark.parametrize("n", [70, 8], ids=["n70", "n8"])
def test_gemv_kn(forms, n):
    # b [K, N] read at run time (scalar loads), one row per batch; K = 37 is not a
    # multiple of the 16-way K split.
    seen = forms()
    torch.manual_seed(0)
    check_op(torch.mm, (torch.randn(1, 37), torch.randn(37, n)), ops=[MM])
    check_op(torch.bmm, (torch.randn(3, 1, 37), torch.randn(3, 37, n)), ops=[BMM])
    check_op(lambda c, a, b: torch.addmm(c, a, b, alpha=3.0),
             (torch.randn(n), torch.randn(1, 37), torch.randn(37, n)), ops=[ADDMM])
    assert seen and all(s[0] == "gemv" for s in seen)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_gemv_kn_constant_vec4(forms, vk_device, dtype):
    # A constant b [B, K, N] with N % 4 == 0: vec4 loads along N (export turns constant
    # operands into linear nodes, so the graph is built directly).
    seen = forms()
    rng = np.random.default_rng(0)
    a, w = rand(rng, (2, 1, 29), dtype), rand(rng, (2, 29, 12), dtype)
    gm = GraphMaker()
    x = gm.input((2, 1, 29), dtype)
    gm.output(gm.op(BMM, [x, gm.constant(w)], (2, 1, 12), dtype))
    with gm.build(vk_device) as graph:
        got = graph.execute([a])[0]
    expected = a.astype(np.float64) @ w.astype(np.float64)
    tol = 1e-2 if dtype == "float16" else 1e-4
    np.testing.assert_allclose(got.astype(np.float64), expected, rtol=tol, atol=tol)
    assert seen == [("gemv", (), 4)]


# Split-K on small sizes: parts of 16 k (rounded up to whole BK = 16 steps), so that
# K = 300 takes 18 parts of which the last ones are empty.
SPLIT = gemm_tiles.GemmTiles(split_k_groups=264, split_k_min_k=64, split_k_min_part=16,
                             vec_load=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_split_k(forms, dtype):
    seen = forms(SPLIT)
    torch.manual_seed(0)
    tol = F16 if dtype == torch.float16 else {}
    check_op(torch.mm, (torch.randn(37, 300).to(dtype), torch.randn(300, 23).to(dtype)),
             ops=[MM], **tol)
    check_op(lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=-2.0),
             (torch.randn(23).to(dtype), torch.randn(37, 300).to(dtype),
              torch.randn(300, 23).to(dtype)), ops=[ADDMM], **tol)
    # Constant [N, K] weight, K a multiple of 4 (vec4 loads in the fp16 large block).
    check_op(torch.nn.Linear(256, 20).to(dtype), (torch.randn(3, 7, 256).to(dtype),),
             ops=[LINEAR], **tol)
    assert seen and all(s[0] == "gemm" for s in seen) and len(forms.splits) == len(seen)


def test_split_k_batch_broadcast_and_resize(forms):
    seen = forms(SPLIT)
    torch.manual_seed(0)
    check_op(torch.matmul, (torch.randn(2, 1, 9, 150), torch.randn(3, 150, 11)), ops=[BMM])
    b, k = torch.export.Dim("b", max=4), torch.export.Dim("k", min=2, max=200)
    check_op(torch.bmm, (torch.randn(3, 6, 200), torch.randn(3, 200, 5)), ops=[BMM],
             dynamic_shapes=({0: b, 2: k}, {0: b, 1: k}),
             resize_inputs=(torch.randn(4, 6, 37), torch.randn(4, 37, 5)))
    assert seen and all(s[0] == "gemm" for s in seen) and len(forms.splits) == len(seen)
