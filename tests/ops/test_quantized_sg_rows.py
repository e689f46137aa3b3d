"""linear_qw_gemv.glsl's SG_ROWS form (quantized_linear.VSG_ROWS: each subgroup owns
whole outputs and walks their whole K, lanes striding by the subgroup size, the sums
reduced by subgroupAdd alone) on every epilogue, forced as
tests/ops/test_quantized_gemv.py forces the vectorized GEMV (a --sweep form while
VSG_ROWS is off by default: not declared). tests/ops/test_quantized_gemv.py runs its
plain int4 / int8 / 8da4w cases in it too.

Each case against eager (or the op's CPU kernel) with the tolerances of the form's
own tests, and against the other vectorized form (VSG_ROWS off, the default DIRECT
form) within rounding (the same per-block math, another summation order: fp32 2e-5;
fp16 one step of the output's rounding, 2^-9, 2^-8 through the SwiGLU chain's
roundings); the fused forms also bit for bit against their unfused programs in the
same form (SwiGLU, ROTARY: each row summed as the plain product sums it):

- plain int4 (group sizes 32 with a bias, 128 without) and int8, fp32 and fp16 x,
  one to four rows, N = 13 and 37 (workgroups partly past N), K = 2048 (64 int4 / 128
  int8 blocks: lavapipe's subgroups of 8 lanes end together) and K = 2080 (int4: 65
  blocks) / 2064 (int8: 129 blocks), whose blocks end mid-subgroup;
- the residual (vkdelegate.linear_q4gsw_add, weight_int8pack_mm_add);
- the SwiGLU chain (linear_q4gsw_swiglu, weight_int8pack_mm_swiglu);
- the RMS norm folded in (rms_norm_linear_q4gsw, rms_norm_weight_int8pack_mm and
  their SwiGLU forms);
- the rotary embedding and cache writes (rms_norm_linear_q4gsw_rotary_cache,
  rms_norm_weight_int8pack_mm_rotary_cache), with an odd half head dim and a last
  workgroup partly past the units;
- VROWS below and above the subgroups of a workgroup (3 units: most subgroups idle).
"""
import pytest
import torch

from tests.ops import coverage
from tests.ops import test_linear_add as add_tests
from tests.ops import test_quantized_rms_norm as rms_tests
from tests.ops import test_quantized_rotary_cache as rotary_tests
from tests.ops import test_quantized_swiglu as swiglu_tests
from tests.ops.harness import check_op, spy_dispatches
from tests.ops.test_rotary_cache import _inputs as rotary_inputs
from tests.vulkan_skip import vulkan_unavailable
from vkdelegate import VulkanPartitioner, to_backend

pytest.importorskip("torchao")

Q4, Q8 = "et_vk.linear_q4gsw.default", "aten._weight_int8pack_mm.default"
DTYPES = [torch.float32, torch.float16]
DTYPE_IDS = ["fp32", "fp16"]


def _family():
    from vkdelegate.ops.families import quantized_linear as family

    return family


@pytest.fixture
def sg(monkeypatch) -> list:
    """The vectorized GEMV forced for up to GEMV_ROWS rows (not the texel form), in
    the SG_ROWS form; skipped on a device without subgroup arithmetic (which keeps the
    workgroup forms). Returns the list of the defines of each linear_qw_gemv dispatch
    recorded from now on, with "VSG_ROWS" added: the constant's value then."""
    from vkdelegate.runtime import default_device

    reason = vulkan_unavailable()
    if reason:
        pytest.skip(reason)
    family = _family()
    if not family.has_subgroup_arithmetic(default_device().info):
        pytest.skip("SG_ROWS needs subgroup arithmetic")
    monkeypatch.setattr(family, "texel_form", lambda *args: False)
    monkeypatch.setattr(family, "use_gemv", lambda info, m: m <= family.GEMV_ROWS)
    monkeypatch.setattr(family, "VSG_ROWS", True)
    monkeypatch.setattr(coverage, "RECORD_VARIANTS", False)  # a --sweep form
    return spy_dispatches(monkeypatch, lambda shader, defines: None
                          if shader != "linear_qw_gemv"
                          else dict(defines, VSG_ROWS=family.VSG_ROWS))


def _check_forms(seen, *epilogues) -> None:
    """Every linear_qw_gemv dispatch took SG_ROWS exactly while VSG_ROWS was on, some
    did, and each had the ``epilogues`` defines (and no other epilogue's)."""
    gemv = [d for d in seen if d is not None]
    assert any(d["VSG_ROWS"] for d in gemv), gemv
    for d in gemv:
        assert ("SG_ROWS" in d) == d["VSG_ROWS"], d
        assert ("SVEC" in d) <= (not d["VSG_ROWS"]), d
        for flag in ("ROTARY", "SWIGLU", "RMS_NORM", "HAS_RESIDUAL"):
            assert (flag in d) == (flag in epilogues), (flag, d)


def run_in_form(monkeypatch, name: str, value, module, inputs, **options) -> tuple:
    """The outputs of ``module`` lowered and run with the quantized-linear family's
    constant ``name`` set to ``value`` (its value before restored after)."""
    family = _family()
    saved = getattr(family, name)
    monkeypatch.setattr(family, name, value)
    try:
        program = to_backend(torch.export.export(module, inputs), VulkanPartitioner(options))
        try:
            out = program(*inputs)
        finally:
            program.close()
    finally:
        monkeypatch.setattr(family, name, saved)
    return out if isinstance(out, tuple) else (out,)


def _run(monkeypatch, module, inputs, sg: bool, **options) -> tuple:
    """The outputs of ``module`` lowered and run with VSG_ROWS = ``sg``."""
    return run_in_form(monkeypatch, "VSG_ROWS", sg, module, inputs, **options)


def _close(dtype, chain=False) -> dict:
    """SG_ROWS against the other vectorized form: the summation order only."""
    if dtype == torch.float32:
        return dict(rtol=2e-5, atol=2e-5)
    tol = 2 ** -8 if chain else 2 ** -9
    return dict(rtol=tol, atol=tol)


def _against_other_form(monkeypatch, module, inputs, dtype, chain=False, **options):
    """SG_ROWS's outputs and the default vectorized form's, within rounding; returns
    SG_ROWS's."""
    got = _run(monkeypatch, module, inputs, True, **options)
    want = _run(monkeypatch, module, inputs, False, **options)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **_close(dtype, chain))
    return got


def _linear(k, n, dtype, bias):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(k, n, bias=bias)).to(dtype).eval()


def _tol(dtype):  # tests/ops/test_quantized_gemv.py's
    return 2e-5 if dtype == torch.float32 else 1e-2


# ---- the plain product ----------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("scheme,k", [("int4_g32", 2048), ("int4_g128", 2048),
                                      ("int4_g32", 2080), ("int8", 2048), ("int8", 2064)],
                         ids=["int4_g32_k2048", "int4_g128_k2048", "int4_g32_k2080",
                              "int8_k2048", "int8_k2064"])
def test_plain(sg, monkeypatch, scheme, k, dtype):
    """One to four rows, N = 13 and 37, against eager and the other form."""
    from vkdelegate.backend.quantize import quantize_for_vulkan

    for n in (13, 37):
        bias = scheme == "int4_g32" and n == 13
        if scheme == "int8":
            model = quantize_for_vulkan(_linear(k, n, dtype, False), "int8")
        else:
            model = quantize_for_vulkan(_linear(k, n, dtype, bias), "int4",
                                        group_size=int(scheme[len("int4_g"):]))
        for rows in (1, 2, 3, 4):
            x = (torch.randn(rows, k)).to(dtype)
            check_op(model, (x,), ops=[Q8 if scheme == "int8" else Q4], rtol=_tol(dtype),
                     atol=_tol(dtype))
            if rows in (1, 4):
                _against_other_form(monkeypatch, model, (x,), dtype)
    _check_forms(sg)


@pytest.mark.parametrize("rows_per_workgroup", [3, 32])
def test_units_per_workgroup(sg, monkeypatch, rows_per_workgroup):
    """VROWS = 3 (most of a workgroup's subgroups idle on narrow subgroups) and 32 (each
    subgroup several units): int4 fp16, N = 37, against eager and the other form."""
    from vkdelegate.backend.quantize import quantize_for_vulkan

    monkeypatch.setattr(_family(), "VROWS", rows_per_workgroup)
    model = quantize_for_vulkan(_linear(2080, 37, torch.float16, True), "int4", group_size=32)
    for rows in (1, 3):
        x = torch.randn(rows, 2080).half()
        check_op(model, (x,), ops=[Q4], rtol=1e-2, atol=1e-2)
    _against_other_form(monkeypatch, model, (x,), torch.float16)
    _check_forms(sg)
    assert {d["ROWS"] for d in sg if d and d["VSG_ROWS"]} == {str(rows_per_workgroup)}


# ---- the residual ---------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("scheme", ["int4", "int8"])
def test_residual(sg, monkeypatch, scheme, dtype):
    """linear(x) + r: the residual added in the epilogue, K = 2080 (int4) / 2064
    (int8), N = 13, one and four rows."""
    from vkdelegate.backend.quantize import quantize_for_vulkan

    torch.manual_seed(0)
    k = 2080 if scheme == "int4" else 2064
    module = add_tests._Residual(k, 13, bias=scheme == "int4").to(dtype).eval()
    if scheme == "int4":
        model, op = quantize_for_vulkan(module, "int4", group_size=32), add_tests.Q4_FUSED
    else:
        model, op = quantize_for_vulkan(module, "int8"), add_tests.Q8_FUSED
    for rows in (1, 4):
        inputs = add_tests._inputs(rows, k, 13, dtype)
        program = check_op(model, inputs, ops=[op], rtol=_tol(dtype), atol=_tol(dtype))
        ops = add_tests._ops(program)
        assert op in ops and add_tests.ADD not in ops, ops  # (int8: torchao's views)
        _against_other_form(monkeypatch, model, inputs, dtype)
    _check_forms(sg, "HAS_RESIDUAL")


# ---- the SwiGLU chain -----------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("scheme,k", [("int4_g32", 2048), ("int4_g128", 2048),
                                      ("int8", 2064)])
def test_swiglu(sg, monkeypatch, scheme, k, dtype):
    """The merged gate/up product with the chain in the epilogue, F = 13: bitwise the
    unfused program (the merged product, its halves, the chain) in SG_ROWS, eager's
    values, and the other form's within rounding."""
    swiglu_tests._check_fused(scheme, dtype, 13, k=k, bias=scheme == "int4_g32")
    fused = [d for d in sg if d is not None]
    assert "SWIGLU" in fused[0] and "SWIGLU" not in fused[1], fused  # then the unfused
    assert all("SG_ROWS" in d for d in fused), fused
    sg.clear()
    module = swiglu_tests._quantized(scheme, k, 13, dtype, scheme == "int4_g32")
    _against_other_form(monkeypatch, module, (torch.randn(1, 1, k).to(dtype),), dtype,
                        chain=True)
    _check_forms(sg, "SWIGLU")


# ---- the RMS norm folded in -----------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("scheme,steps,bias", rms_tests.CASES, ids=rms_tests.CASE_IDS)
def test_rms_norm(sg, monkeypatch, scheme, steps, bias, dtype):
    """K = 2048 (scales giving outputs of about unit size), N = F = 37, one to four
    rows, against the op's CPU kernel and the other form."""
    module = rms_tests._Op(scheme, 2048, 37, dtype, rms_tests._steps(steps, dtype), bias,
                           s_scale=0.1 if scheme == "int8" else 0.3).eval()
    torch.manual_seed(1)
    for rows in (1, 2, 3, 4):
        x = rms_tests._x(scheme, rows, 2048, dtype, 3.0)
        check_op(module, (x,), ops=[module.op], **rms_tests._tol(dtype))
        if rows in (1, 3):
            _against_other_form(monkeypatch, module, (x,), dtype, chain=steps is not None)
    _check_forms(sg, "RMS_NORM", *(["SWIGLU"] if steps is not None else []))


# ---- the rotary epilogue --------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("scheme,bias", rotary_tests.CASES, ids=rotary_tests.CASE_IDS)
def test_rotary(sg, monkeypatch, scheme, bias, dtype):
    """The norm, merged q/k/v product, rotary and cache writes in one dispatch (K =
    2048: a decode layer's 8 q heads and 2 kv heads of 64): eager's values, the
    unfused pair's bits in SG_ROWS, the other form's within rounding."""
    torch.manual_seed(0)
    module = rotary_tests._module(scheme, dtype, bias, k=2048, hq=8, hkv=2, d=64)
    inputs = rotary_inputs(module, dtype, 7)
    check_op(module, inputs, ops=[rotary_tests.FUSED[scheme]], **rotary_tests._tol(dtype))
    _check_forms(sg, "ROTARY", "RMS_NORM")
    sg.clear()
    rotary_tests._bitwise_unfused(module, inputs, scheme)
    assert [("ROTARY" in d, "SG_ROWS" in d) for d in sg if d is not None] == \
        [(True, True), (False, True)], sg
    sg.clear()
    _against_other_form(monkeypatch, module, inputs, dtype)
    _check_forms(sg, "ROTARY", "RMS_NORM")


@pytest.mark.parametrize("scheme", ["int4_g32", "int8"])
def test_rotary_odd_half_and_partial_workgroup(sg, monkeypatch, scheme):
    """D = 6 (D/2 = 3), 3 q heads and 1 kv head: 15 units, the last workgroup's past
    the end; with the norm's own dispatch first (rms_norm_prologue off) too."""
    torch.manual_seed(2)
    module = rotary_tests._module(scheme, torch.float32, scheme != "int8", k=64, hq=3,
                                  hkv=1, d=6)
    inputs = rotary_inputs(module, torch.float32, 5)
    for options in ({}, {"rms_norm_prologue": False}):
        check_op(module, inputs, ops=[rotary_tests.FUSED[scheme]], options=options)
        rotary_tests._bitwise_unfused(module, inputs, scheme, options)
        sg.clear()
        _against_other_form(monkeypatch, module, inputs, torch.float32, **options)
        _check_forms(sg, "ROTARY", *([] if options else ["RMS_NORM"]))
