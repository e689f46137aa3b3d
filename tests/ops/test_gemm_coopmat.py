"""The GEMM core's cooperative-matrix form (gemm_coopmat.glsl) against eager fp16, and
the choice of it (kernels/gemm.py ``select``).

The choice tests are pure Python (a capability table made up here) and run everywhere.
The kernel tests run on devices whose capability table has cooperative matrices with
the 16 x 16 x 16 FLOAT16 -> FLOAT32 shape and one fixed subgroup size (the H200), and
skip with the reason elsewhere: lavapipe has no VK_KHR_cooperative_matrix, and a device
created under the validation layer (the test suite's default, VKDELEGATE_VALIDATION=1)
leaves the feature off (runtime/device.py); run them with VKDELEGATE_VALIDATION=0.
Shapes: ragged edges in M, N and K (partial blocks, K not a multiple of BK or of the 8
elements of a vector load, so the scalar-load path), aligned sizes (vector loads, a
partial block in N), both blocks, b [K, N] and [N, K], batch broadcast, bias
broadcast with alpha/beta, beta = 0 with a NaN bias.

fp16 tolerance: the products of fp16 inputs are exact in fp32 and summed in fp32 (the
tensor cores' accumulator; eager's CPU fp16 matmul also accumulates in fp32), then
rounded once to fp16, whose spacing is 2^-10 |v| (about 1e-3 |v|). A different
summation order changes the fp32 sum by at most about K * 2^-24 * sum |a b| (K <= 520
here: below 4e-5 * sum |a b|, and sum |a b| is a few times |v| or, near a
cancellation, below 1 for these 1/sqrt(K)-scaled unit-normal inputs), so the two
sides differ by about one fp16 step of the result plus at most ~1e-4: inside
rtol = atol = 1e-2 with a tenfold margin, which still catches a wrong tile, row,
column or K step (errors of order |v|).
"""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.ops.harness import check_op
from vkdelegate.capabilities import Capabilities, CooperativeMatrixShape
from vkdelegate.kernels import gemm, gemm_core, gemm_tiles
from vkdelegate.shaders.variants import all_variants, requirements

MM, BMM, ADDMM, LINEAR = ("aten.mm.default", "aten.bmm.default", "aten.addmm.default",
                          "aten.linear.default")
F16 = dict(rtol=1e-2, atol=1e-2)
SHAPE = CooperativeMatrixShape(16, 16, 16, "FLOAT16_KHR", "FLOAT16_KHR", "FLOAT32_KHR",
                               "FLOAT32_KHR")
COOP_CAPS = Capabilities(api_version=(1, 3), subgroup_size=32, min_subgroup_size=32,
                         max_subgroup_size=32, cooperative_matrix_shapes=(SHAPE,),
                         features=frozenset(gemm_core.COOPMAT_REQUIRES + ("maintenance4",)))


def _info(caps=COOP_CAPS, type_="discrete"):
    return SimpleNamespace(type=type_, capabilities=caps)


def test_select_picks_coopmat_where_the_table_has_it():
    info = _info()
    form = gemm.select(info, 4096, 4096, 4096, plain=False, dtype="float16", nk=True)
    assert form.shader == gemm_core.COOPMAT_SHADER
    assert form.block == gemm_tiles.DEFAULT.coop_large
    assert form.threads == 8 * 32  # 2 x 4 subgroups of 64 x 64 outputs
    small = gemm.select(info, 64, 256, 4096, plain=True, dtype="float16")
    assert small.shader == gemm_core.COOPMAT_SHADER
    assert small.block == gemm_tiles.DEFAULT.coop_small and small.threads == 4 * 32
    # The variant recorded is a declared one, and it requires the features.
    defines = gemm_core.coopmat_defines("float16", "float16", "float16", None, True,
                                        form.block, form.threads)
    assert (gemm_core.COOPMAT_SHADER, defines) in all_variants(COOP_CAPS)
    assert set(requirements(gemm_core.COOPMAT_SHADER, defines)) == \
        set(gemm_core.COOPMAT_REQUIRES)


@pytest.mark.parametrize("why,caps,dtype,m", [
    ("fp32 data", COOP_CAPS, "float32", 512),
    ("one row: the GEMV path", COOP_CAPS, "float16", 1),
    ("no cooperativeMatrix", COOP_CAPS.without("cooperativeMatrix"), "float16", 512),
    ("fp16 stored as fp32", COOP_CAPS.without("storageBuffer16BitAccess"), "float16", 512),
    ("no 16x16x16 fp16->fp32 shape", Capabilities(
        **{**vars(COOP_CAPS), "cooperative_matrix_shapes": (
            CooperativeMatrixShape(16, 8, 16, "FLOAT16_KHR", "FLOAT16_KHR", "FLOAT16_KHR",
                                   "FLOAT16_KHR"),)}), "float16", 512),
    ("varying subgroup size", Capabilities(**{**vars(COOP_CAPS), "max_subgroup_size": 64}),
     "float16", 512),
])
def test_select_keeps_the_portable_core(why, caps, dtype, m):
    form = gemm.select(_info(caps), m, 512, 512, plain=False, dtype=dtype)
    assert form.shader in (gemm_core.CORE_SHADER, gemm_core.GEMV_SHADER), why


def test_cpu_row_never_takes_coopmat():
    # The CPU row (lavapipe's) keeps its shaders even with a coopmat table.
    assert gemm.select(_info(type_="cpu"), 256, 256, 256, plain=True,
                       dtype="float16").shader == gemm_core.CORE_SHADER
    assert gemm.select(_info(type_="cpu"), 256, 256, 256, plain=False,
                       dtype="float16").shader == gemm.LINEAR_SHADER


def test_select_skips_blocks_past_the_shared_memory_limit():
    # 128 x 256 x 32 double-buffered declares 60 KiB of shared memory: on a 48 KiB
    # device (the H200's Vulkan limit) that block falls back, a 64 x 64 one stays.
    big = (128, 256, 32, 64, 64, 2)
    assert gemm_core.coopmat_shared_bytes(big, True) == 16 * 2 * (128 * 5 + 256 * 5)
    assert gemm_core.coopmat_shared_bytes(big, False) == 16 * 2 * (128 * 5 + 32 * 33)
    assert gemm_core.coopmat_shared_bytes((64, 64, 32, 32, 32, 2), True) == 20480
    tiles = gemm_tiles.GemmTiles(coop_large=big, coop_large_min_groups=0)
    info = SimpleNamespace(type="discrete", capabilities=COOP_CAPS, max_shared_memory=49152)
    import unittest.mock
    with unittest.mock.patch.object(gemm, "tiles_for", lambda _type: tiles):
        form = gemm.select(info, 4096, 4096, 4096, plain=False, dtype="float16", nk=True)
        assert form.shader == gemm_core.CORE_SHADER
        info.max_shared_memory = 65536
        form = gemm.select(info, 4096, 4096, 4096, plain=False, dtype="float16", nk=True)
        assert form.shader == gemm_core.COOPMAT_SHADER and form.block == big


def test_real_device_choice_matches_its_table(vk_device):
    form = gemm.select(vk_device.info, 512, 512, 512, plain=True, dtype="float16")
    expected = (gemm_core.COOPMAT_SHADER
                if gemm_core.coopmat_subgroup(vk_device.capabilities)
                and gemm_tiles.tiles_for(vk_device.info.type).coopmat else None)
    if expected:
        assert form.shader == expected
    else:
        assert form.shader != gemm_core.COOPMAT_SHADER


@pytest.fixture
def coop(vk_device, monkeypatch):
    """Skip without cooperative matrices; else give the device type the GPU row (or
    ``tiles``) and collect the forms recorded."""
    if not gemm_core.coopmat_subgroup(vk_device.capabilities):
        pytest.skip(f"{vk_device.info.name}: no cooperative matrices usable (needs "
                    f"{', '.join(gemm_core.COOPMAT_REQUIRES)}, the 16x16x16 FLOAT16 -> "
                    f"FLOAT32 shape and a fixed subgroup size; validation turns the "
                    f"feature off)")
    seen = []

    def use(tiles=gemm_tiles.DEFAULT):
        monkeypatch.setattr(gemm, "tiles_for", lambda _type: tiles)
        return seen

    record = gemm.record_core

    def spy(b, form, *args, **kwargs):
        seen.append((form.shader, form.block))
        return record(b, form, *args, **kwargs)

    monkeypatch.setattr(gemm, "record_core", spy)
    return use


LARGE = gemm_tiles.GemmTiles(coop_large_min_groups=0)
BLOCKS = [(gemm_tiles.DEFAULT, gemm_tiles.DEFAULT.coop_small),
          (LARGE, gemm_tiles.DEFAULT.coop_large)]


def _h(*shape):
    return torch.randn(shape).to(torch.float16)


class _ConstMM(torch.nn.Module):
    def __init__(self, k, n):
        super().__init__()
        self.register_buffer("w", _h(k, n))

    def forward(self, x):
        return torch.mm(x, self.w)


@pytest.mark.parametrize("tiles,block", BLOCKS, ids=["small", "large"])
def test_mm_ragged_and_aligned(coop, tiles, block):
    seen = coop(tiles)
    torch.manual_seed(0)
    # Ragged: 131 x 37 x 70 (partial blocks in M and N; K = 37: scalar loads, a part
    # of the last BK step); aligned: K and N multiples of 8 (vector loads), N = 136
    # one column block and a part; K = 520 many K steps, the last one partial.
    for m, k, n in ((131, 37, 70), (200, 64, 136), (67, 520, 24)):
        check_op(torch.mm, (_h(m, k), _h(k, n) / k ** 0.5), ops=[MM], **F16)
    check_op(_ConstMM(37, 70), (_h(131, 37),), ops=[MM], **F16)
    assert seen and all(s == (gemm_core.COOPMAT_SHADER, block) for s in seen)


@pytest.mark.parametrize("tiles,block", BLOCKS, ids=["small", "large"])
@pytest.mark.parametrize("k", [64, 50], ids=["vec", "scalar"])
def test_linear_nk_bias(coop, tiles, block, k):
    # b [N, K] read in place (nn.Linear's weight), bias [N] broadcast over rows (the
    # epilogue through shared memory), rank-3 input.
    seen = coop(tiles)
    torch.manual_seed(0)
    check_op(torch.nn.Linear(k, 72).to(torch.float16), (_h(2, 75, k),), ops=[LINEAR], **F16)
    check_op(torch.nn.Linear(k, 136, bias=False).to(torch.float16), (_h(130, k),),
             ops=[LINEAR], **F16)
    assert seen and all(s == (gemm_core.COOPMAT_SHADER, block) for s in seen)


#: Block geometries besides the table's (benchmarks/gemm.py's H200 sweep): BK 16 and
#: 64, 4 and 8 subgroups, 32 x 64 / 64 x 32 / 64 x 64 per subgroup, one and two stages.
OTHER_BLOCKS = [(128, 256, 16, 64, 64, 2), (256, 128, 16, 64, 64, 2),
                (128, 128, 32, 64, 32, 2), (128, 128, 32, 64, 64, 2),
                (128, 128, 64, 64, 64, 1), (64, 128, 32, 32, 64, 2),
                (128, 64, 32, 64, 32, 2), (64, 64, 64, 32, 32, 2)]


@pytest.mark.parametrize("block", OTHER_BLOCKS, ids=lambda b: "x".join(map(str, b)))
def test_other_blocks_ragged_and_aligned(coop, block):
    # Every block shape the shader takes, not only the table's: ragged M, N, K (K = 37
    # and 21 < BK: scalar loads, one partial K step), aligned K and N with a partial
    # block in N (vector loads, several K steps), b [K, N] and [N, K].
    seen = coop(gemm_tiles.GemmTiles(coop_large=block, coop_large_min_groups=0))
    torch.manual_seed(0)
    for m, k, n in ((131, 37, 70), (67, 21, 24), (200, 136, 264)):
        check_op(torch.mm, (_h(m, k), _h(k, n) / k ** 0.5), ops=[MM], **F16)
    check_op(torch.nn.Linear(136, 264).to(torch.float16), (_h(131, 136),), ops=[LINEAR],
             **F16)
    check_op(torch.nn.Linear(37, 70, bias=False).to(torch.float16), (_h(67, 37),),
             ops=[LINEAR], **F16)
    assert seen and all(s == (gemm_core.COOPMAT_SHADER, block) for s in seen)


def test_bmm_broadcast_and_resize(coop):
    seen = coop()
    torch.manual_seed(0)
    check_op(torch.matmul, (_h(2, 1, 19, 40), _h(4, 40, 23)), ops=[BMM], **F16)
    b, k = torch.export.Dim("b", max=4), torch.export.Dim("k", min=2, max=48)
    check_op(torch.bmm, (_h(3, 21, 48), _h(3, 48, 16)), ops=[BMM],
             dynamic_shapes=({0: b, 2: k}, {0: b, 1: k}),
             resize_inputs=(_h(4, 21, 5), _h(4, 5, 16)), **F16)
    assert seen and all(s[0] == gemm_core.COOPMAT_SHADER for s in seen)


@pytest.mark.parametrize("bias_shape", [(72,), (67, 1), (67, 72), ()])
def test_addmm_bias_alpha_beta(coop, bias_shape):
    seen = coop()
    torch.manual_seed(0)
    args = (_h(*bias_shape), _h(67, 48), _h(48, 72) / 7)
    check_op(lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=-2.0), args, ops=[ADDMM],
             **F16)
    nan_bias = torch.full((67, 72), float("nan"), dtype=torch.float16)  # beta = 0: ignored
    check_op(lambda c, a, b: torch.addmm(c, a, b, beta=0, alpha=0.5), (nan_bias,) + args[1:],
             ops=[ADDMM], **F16)
    assert seen and all(s[0] == gemm_core.COOPMAT_SHADER for s in seen)


def test_large_square_against_fp64(coop, vk_device):
    # 512^3 (the large block, whole tiles: the direct matrix stores) against an fp64
    # product, with the same fp16 bound as above (K = 512, entries scaled by 1/sqrt(K)).
    from tests.runtime.graphs import GraphMaker
    seen = coop(LARGE)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((512, 512)).astype(np.float16)
    w = (rng.standard_normal((512, 512)) / np.sqrt(512)).astype(np.float16)
    gm = GraphMaker()
    x, y = gm.input((512, 512), "float16"), gm.input((512, 512), "float16")
    gm.output(gm.op(MM, [x, y], (512, 512), "float16"))
    with gm.build(vk_device) as graph:
        got = graph.execute([a, w])[0]
    exact = a.astype(np.float64) @ w.astype(np.float64)
    np.testing.assert_allclose(got.astype(np.float64), exact, **F16)
    assert seen == [(gemm_core.COOPMAT_SHADER, gemm_tiles.DEFAULT.coop_large)]
