"""linear_qw_gemv.glsl's TILES form (quantized_linear.VTILES): a workgroup of TILES
tiles of WG invocations, each computing exactly what one workgroup computes without it,
so that a product launches 1 / TILES as many workgroups. Forced as
tests/ops/test_quantized_sg_rows.py forces the vectorized GEMV (the GPUs' DIRECT form
on this device; a sweep form while VTILES is 1 by default: not declared), with 8da4w's
qparams in their GPU form (QX: the products read the quantized rows).

Each case bit for bit the same program with VTILES = 1 (a tile's loads, sums,
reduction and epilogue are the untiled workgroup's, on drivers that number a
workgroup's subgroups in invocation order, as lavapipe and NVIDIA's do), against eager
with the op's own tolerances for one case of each epilogue, at 2, 3 (tiles of a
workgroup not a power of two) and 4 tiles, with the last workgroup's tiles partly
past the outputs:

- plain int4 (group 32 with a bias, K = 2080: 65 blocks, a sweep's last blocks in part
  of a tile) and int8 (K = 2064), 8da4w (K = 4608, QX_IN), N = 37 and 13, one and three
  rows;
- the residual, the SwiGLU chain, the RMS norm folded in (with the SwiGLU chain), the
  rotary embedding and cache writes (with the norm).
"""
import pytest
import torch

from tests.ops import coverage
from tests.ops import test_linear_add as add_tests
from tests.ops import test_quantized_rms_norm as rms_tests
from tests.ops import test_quantized_rotary_cache as rotary_tests
from tests.ops import test_quantized_swiglu as swiglu_tests
from tests.ops.harness import check_op, spy_dispatches
from tests.ops.test_quantized_linear import _one_quantum
from tests.ops.test_quantized_sg_rows import run_in_form
from tests.ops.test_rotary_cache import _inputs as rotary_inputs
from tests.vulkan_skip import vulkan_unavailable

pytest.importorskip("torchao")

Q4, Q8, DQ8CA = ("et_vk.linear_q4gsw.default", "aten._weight_int8pack_mm.default",
                 "et_vk.linear_dq8ca_q4gsw.default")
TILES = [2, 3, 4]


def _family():
    from vkdelegate.ops.families import quantized_linear as family

    return family


@pytest.fixture
def tiled(monkeypatch) -> list:
    """The vectorized GEMV forced for up to GEMV_ROWS rows (DIRECT), 8da4w's qparams in
    their GPU form; skipped on a device without subgroup arithmetic (TILES needs it).
    Returns the defines of each linear_qw_gemv dispatch recorded from now on, with
    "VTILES": the constant's value then."""
    from vkdelegate.kernels import quantized_x
    from vkdelegate.ops.families import choose_qparams
    from vkdelegate.runtime import default_device

    reason = vulkan_unavailable()
    if reason:
        pytest.skip(reason)
    family = _family()
    if not family.has_subgroup_arithmetic(default_device().info):
        pytest.skip("TILES needs subgroup arithmetic")
    monkeypatch.setattr(family, "texel_form", lambda *args: False)
    monkeypatch.setattr(family, "use_gemv", lambda info, m: m <= family.GEMV_ROWS)
    monkeypatch.setattr(quantized_x, "gemv_device", lambda info: True)
    monkeypatch.setattr(choose_qparams, "workgroup", lambda info, k: 256)
    monkeypatch.setattr(coverage, "RECORD_VARIANTS", False)  # a sweep form
    return spy_dispatches(monkeypatch, lambda shader, defines: None
                          if shader != "linear_qw_gemv"
                          else dict(defines, VTILES=family.VTILES))


def _bitwise(tiled, monkeypatch, module, inputs, tiles: int, *epilogues, **options):
    """``module``'s outputs with VTILES = ``tiles`` bit for bit those with VTILES = 1;
    every product of the first run took TILES = ``tiles`` (with the ``epilogues``'
    defines), none of the second."""
    tiled.clear()
    got = run_in_form(monkeypatch, "VTILES", tiles, module, inputs, **options)
    want = run_in_form(monkeypatch, "VTILES", 1, module, inputs, **options)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)
    gemv = [d for d in tiled if d is not None]
    assert any(d["VTILES"] == tiles for d in gemv), gemv
    for d in gemv:
        assert d.get("TILES") == (str(tiles) if d["VTILES"] == tiles else None), d
        assert "DIRECT" in d and "SG_ROWS" not in d, d
        for flag in epilogues:
            assert flag in d, (flag, d)


def _linear(k, n, dtype, bias):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(k, n, bias=bias)).to(dtype).eval()


@pytest.mark.parametrize("tiles", TILES)
@pytest.mark.parametrize("scheme,k,dtype", [("int4", 2080, torch.float16),
                                            ("int8", 2064, torch.float32),
                                            ("8da4w", 4608, torch.float32)],
                         ids=["int4_fp16", "int8_fp32", "8da4w_fp32"])
def test_plain(tiled, monkeypatch, scheme, k, dtype, tiles):
    """N = 37 and 13 (the last workgroup's tiles partly or wholly past N), one and three
    rows; eager's values at 2 tiles."""
    from vkdelegate.backend.quantize import quantize_for_vulkan

    for n in (37, 13):
        if scheme == "int4":
            model = quantize_for_vulkan(_linear(k, n, dtype, n == 13), "int4", group_size=32)
        else:
            model = quantize_for_vulkan(_linear(k, n, dtype, False), scheme)
        for rows in (1, 3):
            torch.manual_seed(rows)
            x = torch.randn(rows, k).to(dtype)
            if tiles == 2:
                op = {"int4": Q4, "int8": Q8, "8da4w": DQ8CA}[scheme]
                tol = 2e-5 if dtype == torch.float32 else 1e-2
                extra = _one_quantum(model, x.float()) if scheme == "8da4w" else 0.0
                monkeypatch.setattr(_family(), "VTILES", 2)
                check_op(model, (x,), ops=[op], rtol=tol, atol=tol + extra)
                monkeypatch.setattr(_family(), "VTILES", 1)
            _bitwise(tiled, monkeypatch, model, (x,), tiles,
                     *(["QX_IN"] if scheme == "8da4w" else []))


@pytest.mark.parametrize("tiles", TILES)
def test_residual(tiled, monkeypatch, tiles):
    """linear(x) + r in the epilogue, int4 fp16, K = 2080, N = 13, one and four rows."""
    from vkdelegate.backend.quantize import quantize_for_vulkan

    torch.manual_seed(0)
    module = add_tests._Residual(2080, 13, bias=True).half().eval()
    model = quantize_for_vulkan(module, "int4", group_size=32)
    for rows in (1, 4):
        _bitwise(tiled, monkeypatch, model, add_tests._inputs(rows, 2080, 13, torch.float16),
                 tiles, "HAS_RESIDUAL")


@pytest.mark.parametrize("tiles", TILES)
def test_swiglu(tiled, monkeypatch, tiles):
    """The merged gate/up product with the chain in the epilogue, int4 fp16, F = 13."""
    module = swiglu_tests._quantized("int4_g32", 2048, 13, torch.float16, True)
    _bitwise(tiled, monkeypatch, module, (torch.randn(1, 1, 2048).half(),), tiles, "SWIGLU")


@pytest.mark.parametrize("tiles", TILES)
def test_rms_norm_swiglu(tiled, monkeypatch, tiles):
    """The norm folded into the gate/up product with its chain, int4 fp16, F = 37, one
    and three rows; eager's (the op's CPU kernel's) values at 2 tiles."""
    scheme, steps, bias = next(c for c in rms_tests.CASES if c[0].startswith("int4")
                               and c[1] is not None)
    dtype = torch.float16
    module = rms_tests._Op(scheme, 2048, 37, dtype, rms_tests._steps(steps, dtype), bias,
                           s_scale=0.3).eval()
    torch.manual_seed(1)
    for rows in (1, 3):
        x = rms_tests._x(scheme, rows, 2048, dtype, 3.0)
        if tiles == 2:
            monkeypatch.setattr(_family(), "VTILES", 2)
            check_op(module, (x,), ops=[module.op], **rms_tests._tol(dtype))
            monkeypatch.setattr(_family(), "VTILES", 1)
        _bitwise(tiled, monkeypatch, module, (x,), tiles, "RMS_NORM", "SWIGLU")


@pytest.mark.parametrize("tiles", TILES)
def test_rotary(tiled, monkeypatch, tiles):
    """The norm, merged q/k/v product, rotary and cache writes in one dispatch (8 q
    heads and 2 kv heads of 64), int4 fp16."""
    scheme, bias = next(c for c in rotary_tests.CASES if c[0].startswith("int4"))
    torch.manual_seed(0)
    module = rotary_tests._module(scheme, torch.float16, bias, k=2048, hq=8, hkv=2, d=64)
    inputs = rotary_inputs(module, torch.float16, 7)
    _bitwise(tiled, monkeypatch, module, inputs, tiles, "ROTARY", "RMS_NORM")


def test_workgroup_tiles_only_in_the_direct_form(monkeypatch):
    """VTILES where kernels/workgroup.workgroup_tiles allows it (tests/ops/
    test_gemv_tiles.py), never in SG_ROWS or the staged form."""
    from tests.ops.test_gemv_tiles import _Info

    family = _family()
    monkeypatch.setattr(family, "VTILES", 4)
    assert family.workgroup_tiles(64, False, _Info()) == 4
    assert family.workgroup_tiles(64, True, _Info()) == 1  # SG_ROWS
    assert family.workgroup_tiles(64, False, _Info(largest=128)) == 1  # a tile in a subgroup
    monkeypatch.setattr(family, "VDIRECT", False)
    assert family.workgroup_tiles(64, False, _Info()) == 1  # the staged form
