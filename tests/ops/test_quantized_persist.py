"""linear_qw_gemv.glsl's PERSIST form (quantized_linear.VPERSIST: at most that many
workgroups a row, each over tiles g, g + groups, ..., x converted once and the next
tile's weights requested before the current tile's products), forced as
tests/ops/test_quantized_gemv.py forces the vectorized GEMV (a tuning form while
VPERSIST is off by default: not declared).

Each tile's sums, reduction and epilogue are the workgroup form's, so every case is
compared bit for bit with the default form (VPERSIST 0) and against eager (or the op's
CPU kernel) with the tolerances of the form's own tests. VPERSIST = 3 workgroups
against 4 to 19 tiles, so that each workgroup runs several and the last round is
partial:

- plain int4 (group 32 with a bias, 128 without; K = 2048: 64 blocks, one per
  invocation of a VWG_FIT workgroup) and int8 (K = 1024 and 2048: 64 and 128 blocks), fp32 and
  fp16 x, one to four rows, N = 13 and 37; 8da4w (group 32 and 128);
- the residual, the SwiGLU chain, the RMS norm folded in (and its SwiGLU form), the
  rotary embedding with its cache writes;
- K = 4128 (129 int4 blocks, past a workgroup of VWG = 128): the workgroup form, not
  PERSIST.
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

Q4, Q8 = "et_vk.linear_q4gsw.default", "aten._weight_int8pack_mm.default"
DQ8CA = "et_vk.linear_dq8ca_q4gsw.default"
DTYPES = [torch.float32, torch.float16]
DTYPE_IDS = ["fp32", "fp16"]
GROUPS = 3  # VPERSIST in these tests: fewer workgroups than tiles


def _family():
    from vkdelegate.ops.families import quantized_linear as family

    return family


@pytest.fixture
def persist(monkeypatch) -> list:
    """The vectorized GEMV forced for up to GEMV_ROWS rows (not the texel form), the
    DIRECT workgroup form (not SG_ROWS), VPERSIST = GROUPS. Returns the list of each
    dispatch's (defines, workgroups in x, VPERSIST then) recorded from now on (None
    for shaders other than linear_qw_gemv)."""
    reason = vulkan_unavailable()
    if reason:
        pytest.skip(reason)
    family = _family()
    monkeypatch.setattr(family, "texel_form", lambda *args: False)
    monkeypatch.setattr(family, "use_gemv", lambda info, m: m <= family.GEMV_ROWS)
    monkeypatch.setattr(family, "VSG_ROWS", False)
    monkeypatch.setattr(family, "VDIRECT", True)
    monkeypatch.setattr(family, "VPERSIST", GROUPS)
    monkeypatch.setattr(coverage, "RECORD_VARIANTS", False)  # a tuning form
    return spy_dispatches(monkeypatch, lambda shader, defines, sizes: (
        dict(defines), sizes[0][0] // sizes[1][0], family.VPERSIST)
        if shader == "linear_qw_gemv" else None, sizes=True)


def _check_forms(seen, *epilogues, persistent=True) -> None:
    """Every linear_qw_gemv dispatch took PERSIST exactly while VPERSIST was on
    (``persistent``: the product's rows allow it) with at most GROUPS workgroups a row,
    some did (``persistent``), and each had the ``epilogues`` defines (and no
    other's)."""
    seen = [s for s in seen if s is not None]
    assert any(on for *_, on in seen) and \
        any("PERSIST" in d for d, *_ in seen) == persistent, seen
    for d, groups, on in seen:
        assert ("PERSIST" in d) == (persistent and on > 0), d
        assert groups <= GROUPS or "PERSIST" not in d, (groups, d)
        for flag in ("ROTARY", "SWIGLU", "RMS_NORM", "HAS_RESIDUAL"):
            assert (flag in d) == (flag in epilogues), (flag, d)


def _bitwise_default_form(monkeypatch, module, inputs, **options) -> None:
    """PERSIST's outputs equal the default form's (VPERSIST 0) bit for bit."""
    got = run_in_form(monkeypatch, "VPERSIST", GROUPS, module, inputs, **options)
    want = run_in_form(monkeypatch, "VPERSIST", 0, module, inputs, **options)
    for g, w in zip(got, want):
        assert torch.equal(g, w), (g - w).abs().max()


def _linear(k, n, dtype, bias):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(k, n, bias=bias)).to(dtype).eval()


def _tol(dtype):  # tests/ops/test_quantized_gemv.py's
    return 2e-5 if dtype == torch.float32 else 1e-2


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("scheme,k", [("int4_g32", 2048), ("int4_g128", 2048),
                                      ("int8", 1024), ("int8", 2048)],
                         ids=["int4_g32", "int4_g128", "int8_k1024", "int8_k2048"])
def test_plain(persist, monkeypatch, scheme, k, dtype):
    """One to four rows, N = 13 and 37, against eager and the default form's bits."""
    from vkdelegate.backend.quantize import quantize_for_vulkan

    for n in (13, 37):
        bias = scheme == "int4_g32" and n == 13
        if scheme == "int8":
            model = quantize_for_vulkan(_linear(k, n, dtype, False), "int8")
        else:
            model = quantize_for_vulkan(_linear(k, n, dtype, bias), "int4",
                                        group_size=int(scheme[len("int4_g"):]))
        for rows in (1, 2, 3, 4):
            x = torch.randn(rows, k).to(dtype)
            check_op(model, (x,), ops=[Q8 if scheme == "int8" else Q4], rtol=_tol(dtype),
                     atol=_tol(dtype))
            if rows in (1, 4):
                _bitwise_default_form(monkeypatch, model, (x,))
    _check_forms(persist)


@pytest.mark.parametrize("group", [32, 128])
def test_8da4w(persist, monkeypatch, group):
    """8da4w (x quantized per row as it is loaded, integer sums per block), K = 2048,
    N = 37, one and three rows: eager within one activation quantum, the default
    form's bits."""
    from vkdelegate.backend.quantize import quantize_for_vulkan

    model = quantize_for_vulkan(_linear(2048, 37, torch.float32, True), "8da4w",
                                group_size=group)
    torch.manual_seed(1)
    for rows in (1, 3):
        x = torch.randn(rows, 2048)
        check_op(model, (x,), ops=[DQ8CA], rtol=2e-5, atol=2e-5 + _one_quantum(model, x))
        _bitwise_default_form(monkeypatch, model, (x,))
    _check_forms(persist)


def test_forms_are_chosen_before_persist(persist, monkeypatch):
    """``choose`` sees the declared forms (HALF_DOT, INT_DOT: their feature
    requirements), PERSIST is added after it: an fp16 int4 product and an 8da4w one."""
    from vkdelegate.backend.quantize import quantize_for_vulkan

    family = _family()
    asked = []
    choose = family.choose
    monkeypatch.setattr(family, "choose", lambda shader, candidates, caps: (
        asked.extend(candidates), choose(shader, candidates, caps))[1])
    fp16 = quantize_for_vulkan(_linear(2048, 13, torch.float16, False), "int4",
                               group_size=32)
    check_op(fp16, (torch.randn(1, 2048).half(),), ops=[Q4], rtol=1e-2, atol=1e-2)
    dq = quantize_for_vulkan(_linear(2048, 13, torch.float32, False), "8da4w",
                             group_size=32)
    x = torch.randn(1, 2048)
    check_op(dq, (x,), ops=[DQ8CA], rtol=2e-5, atol=2e-5 + _one_quantum(dq, x))
    assert {"HALF_DOT", "INT_DOT"} <= {k for d in asked for k in d}, asked
    assert not any("PERSIST" in d for d in asked), asked
    _check_forms(persist)


def test_long_rows_keep_the_workgroup_form(persist):
    """K = 4128: 129 int4 blocks, more than a workgroup of VWG invocations reads once,
    so the product keeps the workgroup form (its grid whole)."""
    from vkdelegate.backend.quantize import quantize_for_vulkan

    model = quantize_for_vulkan(_linear(4128, 37, torch.float16, True), "int4",
                                group_size=32)
    check_op(model, (torch.randn(1, 4128).half(),), ops=[Q4], rtol=1e-2, atol=1e-2)
    _check_forms(persist, persistent=False)
    (d, groups, _), = [s for s in persist if s is not None]
    assert groups == -(-37 // int(d["ROWS"]))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("scheme", ["int4", "int8"])
def test_residual(persist, monkeypatch, scheme, dtype):
    """linear(x) + r, K = 2048, N = 13, one and four rows."""
    from vkdelegate.backend.quantize import quantize_for_vulkan

    torch.manual_seed(0)
    k = 2048
    module = add_tests._Residual(k, 13, bias=scheme == "int4").to(dtype).eval()
    if scheme == "int4":
        model, op = quantize_for_vulkan(module, "int4", group_size=32), add_tests.Q4_FUSED
    else:
        model, op = quantize_for_vulkan(module, "int8"), add_tests.Q8_FUSED
    for rows in (1, 4):
        inputs = add_tests._inputs(rows, k, 13, dtype)
        check_op(model, inputs, ops=[op], rtol=_tol(dtype), atol=_tol(dtype))
        _bitwise_default_form(monkeypatch, model, inputs)
    _check_forms(persist, "HAS_RESIDUAL")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("scheme", ["int4_g32", "int4_g128", "int8"])
def test_swiglu(persist, monkeypatch, scheme, dtype):
    """The merged gate/up product with the chain in the epilogue, K = 2048, F = 13:
    the unfused program's bits, eager's values, the default form's bits."""
    swiglu_tests._check_fused(scheme, dtype, 13, k=2048, bias=scheme == "int4_g32")
    persist.clear()
    module = swiglu_tests._quantized(scheme, 2048, 13, dtype, scheme == "int4_g32")
    _bitwise_default_form(monkeypatch, module, (torch.randn(1, 1, 2048).to(dtype),))
    _check_forms(persist, "SWIGLU")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("scheme,steps,bias", rms_tests.CASES, ids=rms_tests.CASE_IDS)
def test_rms_norm(persist, monkeypatch, scheme, steps, bias, dtype):
    """K = 2048, N = F = 37, one to four rows, against the op's CPU kernel and the
    default form's bits."""
    module = rms_tests._Op(scheme, 2048, 37, dtype, rms_tests._steps(steps, dtype), bias,
                           s_scale=0.1 if scheme == "int8" else 0.3).eval()
    torch.manual_seed(1)
    for rows in (1, 2, 3, 4):
        x = rms_tests._x(scheme, rows, 2048, dtype, 3.0)
        check_op(module, (x,), ops=[module.op], **rms_tests._tol(dtype))
        if rows in (1, 3):
            _bitwise_default_form(monkeypatch, module, (x,))
    _check_forms(persist, "RMS_NORM", *(["SWIGLU"] if steps is not None else []))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("scheme,bias", rotary_tests.CASES, ids=rotary_tests.CASE_IDS)
def test_rotary(persist, monkeypatch, scheme, bias, dtype):
    """The norm, merged q/k/v product, rotary and cache writes in one dispatch (K =
    2048, 8 q heads and 2 kv heads of 64): eager's values, the default form's bits."""
    torch.manual_seed(0)
    module = rotary_tests._module(scheme, dtype, bias, k=2048, hq=8, hkv=2, d=64)
    inputs = rotary_inputs(module, dtype, 7)
    check_op(module, inputs, ops=[rotary_tests.FUSED[scheme]], **rotary_tests._tol(dtype))
    _bitwise_default_form(monkeypatch, module, inputs)
    _check_forms(persist, "ROTARY", "RMS_NORM")


def test_rotary_odd_half_and_partial_tile(persist, monkeypatch):
    """D = 6 (D/2 = 3), 3 q heads and 1 kv head: 15 units, the last tile partly past
    them; int4 with a bias, the norm folded in."""
    torch.manual_seed(2)
    module = rotary_tests._module("int4_g32", torch.float32, True, k=64, hq=3, hkv=1, d=6)
    inputs = rotary_inputs(module, torch.float32, 5)
    check_op(module, inputs, ops=[rotary_tests.FUSED["int4_g32"]])
    _bitwise_default_form(monkeypatch, module, inputs)
    _check_forms(persist, "ROTARY", "RMS_NORM")
