"""gemv.glsl's TILES form (gemm_core.GEMV_TILES; shaders/glsl/tiles.h): the one-row
product with b [N, K] in workgroups of TILES tiles of 128 invocations, each computing
exactly what one workgroup computes without it. Every device type gets the tile
table's GPU row (the GEMV path for one row) as tests/ops/test_linear_add.py forces
it; a sweep form while GEMV_TILES is 1 by default (not declared).

Each case bit for bit the same program with GEMV_TILES = 1 (a tile's loads, sums,
reduction and epilogue are the untiled workgroup's, on drivers that number a
workgroup's subgroups in invocation order, as lavapipe and NVIDIA's do) at 2, 3 and 4
tiles, with N such that the last workgroup's tiles are partly past the outputs, and
against eager (the ops' own tolerances) at 2 tiles: the plain linear (scalar, vec4
and, in fp16, vec8 loads), the residual, the RMS norm folded in, the SwiGLU chain,
and the norm, q/k/v product, rotary and cache writes in one dispatch.
"""
import dataclasses

import pytest
import torch

from tests.ops import coverage
from tests.ops import test_linear_add as add_tests
from tests.ops import test_linear_swiglu as swiglu_tests
from tests.ops import test_rms_norm_linear as norm_tests
from tests.ops import test_rotary_cache as rotary_tests
from tests.ops.harness import check_op, spy_dispatches
from tests.vulkan_skip import vulkan_unavailable
from vkdelegate import VulkanPartitioner, to_backend

TILES = [2, 3, 4]


def _core():
    from vkdelegate.kernels import gemm_core

    return gemm_core


@pytest.fixture
def tiled(monkeypatch) -> list:
    """The tile table's GPU row on this device without its cooperative-matrix form;
    skipped without subgroup arithmetic (TILES needs it). Returns the defines of each
    gemv dispatch from now on, with "GEMV_TILES": the constant's value then."""
    from vkdelegate.kernels import gemm, gemm_tiles
    from vkdelegate.runtime import default_device

    reason = vulkan_unavailable()
    if reason:
        pytest.skip(reason)
    core = _core()
    if not core.has_subgroup_arithmetic(default_device().info):
        pytest.skip("TILES needs subgroup arithmetic")
    portable = dataclasses.replace(gemm_tiles.DEFAULT, coopmat=False)
    monkeypatch.setattr(gemm, "tiles_for", lambda _type: portable)
    monkeypatch.setattr(coverage, "RECORD_VARIANTS", False)  # a sweep form
    return spy_dispatches(monkeypatch, lambda shader, defines: None if shader != "gemv"
                          else dict(defines, GEMV_TILES=core.GEMV_TILES))


def _run(monkeypatch, module, inputs, tiles: int, **options) -> tuple:
    monkeypatch.setattr(_core(), "GEMV_TILES", tiles)
    try:
        program = to_backend(torch.export.export(module, inputs), VulkanPartitioner(options))
        try:
            out = program(*inputs)
        finally:
            program.close()
    finally:
        monkeypatch.setattr(_core(), "GEMV_TILES", 1)
    return out if isinstance(out, tuple) else (out,)


def _bitwise(tiled, monkeypatch, module, inputs, tiles: int, *flags, **options) -> None:
    """``module``'s outputs at GEMV_TILES = ``tiles`` bit for bit those at 1; every
    gemv dispatch of the first run had TILES = ``tiles`` (and ``flags``), none of the
    second; some ran."""
    tiled.clear()
    got = _run(monkeypatch, module, inputs, tiles, **options)
    want = _run(monkeypatch, module, inputs, 1, **options)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)
    gemv = [d for d in tiled if d is not None]
    assert any(d["GEMV_TILES"] == tiles for d in gemv), gemv
    for d in gemv:
        assert d.get("TILES") == (str(tiles) if d["GEMV_TILES"] == tiles else None), d
        for flag in flags:
            assert flag in d, (flag, d)


def _against_eager(monkeypatch, module, inputs, ops, **tol) -> None:
    monkeypatch.setattr(_core(), "GEMV_TILES", 2)
    try:
        check_op(module, inputs, ops=ops, **tol)
    finally:
        monkeypatch.setattr(_core(), "GEMV_TILES", 1)


@pytest.mark.parametrize("tiles", TILES)
@pytest.mark.parametrize("dtype,k", [(torch.float32, 37), (torch.float32, 52),
                                     (torch.float16, 64), (torch.float16, 2048)],
                         ids=["fp32_scalar", "fp32_vec4", "fp16_vec8", "fp16_k2048"])
def test_plain(tiled, monkeypatch, dtype, k, tiles):
    """N = 29 and 70 (the last workgroup's tiles partly past N)."""
    for n in (29, 70):
        torch.manual_seed(n)
        module = torch.nn.Sequential(torch.nn.Linear(k, n)).to(dtype).eval()
        x = torch.randn(1, k).to(dtype)
        if tiles == 2:
            _against_eager(monkeypatch, module, (x,), ["aten.linear.default"],
                           **add_tests._tol(dtype))
        _bitwise(tiled, monkeypatch, module, (x,), tiles, "B_NK")


@pytest.mark.parametrize("tiles", TILES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_residual(tiled, monkeypatch, dtype, tiles):
    torch.manual_seed(0)
    module = add_tests._Residual(64, 29, bias=True).to(dtype)
    inputs = add_tests._inputs(1, 64, 29, dtype)
    if tiles == 2:
        _against_eager(monkeypatch, module, inputs, [add_tests.FUSED], **add_tests._tol(dtype))
    _bitwise(tiled, monkeypatch, module, inputs, tiles, "HAS_RESIDUAL")


@pytest.mark.parametrize("tiles", TILES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_rms_norm(tiled, monkeypatch, dtype, tiles):
    torch.manual_seed(0)
    module = norm_tests._Block(64, 29, bias=True).to(dtype)
    x = norm_tests._x(1, 64, dtype)
    if tiles == 2:
        _against_eager(monkeypatch, module, (x,), [norm_tests.FUSED], **norm_tests._tol(dtype))
    _bitwise(tiled, monkeypatch, module, (x,), tiles, "RMS_NORM")


@pytest.mark.parametrize("tiles", TILES)
@pytest.mark.parametrize("dtype,steps", swiglu_tests.CASES[:2], ids=swiglu_tests.IDS[:2])
def test_swiglu(tiled, monkeypatch, dtype, steps, tiles):
    torch.manual_seed(0)
    module = swiglu_tests._LinearSwiglu(64, 13, steps, True, dtype)
    x = torch.randn(1, 1, 64).to(dtype)
    if tiles == 2:
        _against_eager(monkeypatch, module, (x,), [swiglu_tests.FUSED],
                       **swiglu_tests._tol(dtype))
    _bitwise(tiled, monkeypatch, module, (x,), tiles, "SWIGLU")


@pytest.mark.parametrize("tiles", TILES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_rotary(tiled, monkeypatch, dtype, tiles):
    """4 q heads and 2 kv heads of 8: 32 units, the last workgroup's tiles partly past
    them."""
    torch.manual_seed(0)
    module = rotary_tests.Attention(dtype=dtype)
    inputs = rotary_tests._inputs(module, dtype)
    if tiles == 2:
        _against_eager(monkeypatch, module, inputs, [rotary_tests.FUSED],
                       **rotary_tests._tol(dtype))
    _bitwise(tiled, monkeypatch, module, inputs, tiles, "ROTARY")


class _Info:
    """What workgroup_tiles reads of a DeviceInfo."""

    def __init__(self, ops=("arithmetic",), largest=32, invocations=1024):
        from vkdelegate.capabilities import Capabilities

        self.subgroup_ops = list(ops)
        self.capabilities = Capabilities(max_subgroup_size=largest)
        self.max_workgroup_invocations = invocations


def test_workgroup_tiles_only_where_a_tile_is_whole_subgroups():
    from vkdelegate.kernels.workgroup import workgroup_tiles

    assert workgroup_tiles(4, 128, _Info()) == 4
    assert workgroup_tiles(1, 128, _Info()) == 1
    assert workgroup_tiles(4, 128, _Info(ops=())) == 1  # no subgroupAdd
    assert workgroup_tiles(4, 64, _Info(largest=128)) == 1  # a tile inside a subgroup
    assert workgroup_tiles(4, 128, _Info(invocations=256)) == 1  # too large a workgroup
    assert workgroup_tiles(2, 128, _Info(invocations=256)) == 2
