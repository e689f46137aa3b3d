"""linear_qw_gemv.glsl's HALF_DOT form (quantized_linear.VHALF, the default on devices
with shaderFloat16: int4 weights with fp16 x, each block's products in packed fp16
arithmetic, summed in fp16 over VHWORDS words, then in fp32) on every epilogue a decode
step uses, forced as tests/ops/test_quantized_gemv.py forces the vectorized GEMV, which
runs its plain int4 cases in it too.

Tolerances. Against eager (or the op's CPU kernel): the fp16 tolerances of each form's
own tests (1e-2 plain, 2e-2 with the norm or the SwiGLU chain). Against the fp32 form
(VHALF off, the same summation order over blocks): HALF_DOT rounds x (times the norm
weight) to fp16 once (2^-11 relative), each product (of the weights / 64) to fp16
(2^-11) and each partial sum of up to 4 * VHWORDS products per lane (2^-11 of the
partial sum); over K = 2048
products of outputs of about unit size that is a few 1e-3 absolute at most: 2^-7
relative and absolute (the fp16 output's own step is 2^-10 to 2^-11 there). The fused
forms also bit for bit against their unfused programs in the same form (SwiGLU,
ROTARY: each row summed as the plain product sums it).
"""
import pytest
import torch

from tests.ops import coverage
from tests.ops import test_linear_add as add_tests
from tests.ops import test_quantized_rms_norm as rms_tests
from tests.ops import test_quantized_rotary_cache as rotary_tests
from tests.ops import test_quantized_swiglu as swiglu_tests
from tests.ops.harness import check_op, spy_dispatches
from tests.ops.test_quantized_sg_rows import run_in_form
from tests.ops.test_rotary_cache import _inputs as rotary_inputs
from tests.vulkan_skip import vulkan_unavailable

pytest.importorskip("torchao")

Q4 = "et_vk.linear_q4gsw.default"
CLOSE = dict(rtol=2 ** -7, atol=2 ** -7)


def _family():
    from vkdelegate.ops.families import quantized_linear as family

    return family


@pytest.fixture(params=[1, 4], ids=["hwords1", "hwords4"])
def half(monkeypatch, request) -> list:
    """The vectorized GEMV forced for up to GEMV_ROWS rows (not the texel form), in the
    HALF_DOT form (the GPUs' default) with ``request.param`` words per fp16 partial sum,
    and VMIN_GROUPS as it is (the products here have few outputs: 2 or 4 rows a
    workgroup); skipped on a
    device without shaderFloat16. Returns the list of the defines of each
    linear_qw_gemv dispatch recorded from now on, with "VHALF" added: the constant's
    value then."""
    from vkdelegate.runtime import default_device

    reason = vulkan_unavailable()
    if reason:
        pytest.skip(reason)
    family = _family()
    if default_device().info.capabilities.missing(("shaderFloat16",)):
        pytest.skip("HALF_DOT needs shaderFloat16")
    monkeypatch.setattr(family, "texel_form", lambda *args: False)
    monkeypatch.setattr(family, "use_gemv", lambda info, m: m <= family.GEMV_ROWS)
    monkeypatch.setattr(family, "VHALF", True)
    if request.param != family.VHWORDS:
        monkeypatch.setattr(coverage, "RECORD_VARIANTS", False)  # a --form row: undeclared
    monkeypatch.setattr(family, "VHWORDS", request.param)
    return spy_dispatches(monkeypatch, lambda shader, defines: None
                          if shader != "linear_qw_gemv"
                          else dict(defines, VHALF=family.VHALF))


def _check_forms(seen, *epilogues) -> None:
    """Every int4 linear_qw_gemv dispatch with fp16 x took HALF_DOT exactly while VHALF
    was on, some did, and each had the ``epilogues`` defines."""
    gemv = [d for d in seen if d is not None]
    assert any(d["VHALF"] for d in gemv), gemv
    for d in gemv:
        assert ("HALF_DOT" in d) == (d["VHALF"] and "W4" in d and "X16" in d), d
        for flag in ("ROTARY", "SWIGLU", "RMS_NORM", "HAS_RESIDUAL"):
            assert (flag in d) == (flag in epilogues), (flag, d)


def _against_fp32_form(monkeypatch, module, inputs, **options):
    """HALF_DOT's outputs and the fp32 form's, within CLOSE; returns HALF_DOT's."""
    got = run_in_form(monkeypatch, "VHALF", True, module, inputs, **options)
    want = run_in_form(monkeypatch, "VHALF", False, module, inputs, **options)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **CLOSE)
    return got


def _linear(k, n, bias):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(k, n, bias=bias)).half().eval()


@pytest.mark.parametrize("group,k", [(32, 2048), (128, 2048), (32, 2080), (256, 4096)])
def test_plain(half, monkeypatch, group, k):
    """One to four rows, N = 13 (bias) and 37, against eager and the fp32 form."""
    from vkdelegate.backend.quantize import quantize_for_vulkan

    for n in (13, 37):
        model = quantize_for_vulkan(_linear(k, n, n == 13), "int4", group_size=group)
        for rows in (1, 2, 3, 4):
            x = torch.randn(rows, k).half()
            check_op(model, (x,), ops=[Q4], rtol=1e-2, atol=1e-2)
            if rows in (1, 4):
                _against_fp32_form(monkeypatch, model, (x,))
    _check_forms(half)


def test_large_activations(half, monkeypatch, request):
    """Outliers of 60000 (VHWORDS 1: no finite fp16 x overflows a partial sum of 4
    products of the weights / 64) and 30000 (4 words: overflow from 32752) among
    N(0, 1) values: eager's values within its tolerance scaled by the output's size."""
    from vkdelegate.backend.quantize import quantize_for_vulkan

    model = quantize_for_vulkan(_linear(2048, 37, False), "int4", group_size=32)
    torch.manual_seed(3)
    x = torch.randn(1, 2048)
    big = {1: 60000.0, 4: 30000.0}[request.node.callspec.params["half"]]
    x[0, ::97] = big * torch.sign(torch.randn(22))
    x = x.half()
    want = model(x).float()
    assert torch.isfinite(want).all()
    program = check_op(model, (x,), ops=[Q4], rtol=1e-2, atol=1e-2 * float(want.abs().max()))
    assert program is not None
    _check_forms(half)


def test_residual(half, monkeypatch):
    """linear(x) + r: the residual added in the epilogue, K = 2080, N = 13."""
    from vkdelegate.backend.quantize import quantize_for_vulkan

    torch.manual_seed(0)
    module = add_tests._Residual(2080, 13, bias=True).half().eval()
    model = quantize_for_vulkan(module, "int4", group_size=32)
    for rows in (1, 4):
        inputs = add_tests._inputs(rows, 2080, 13, torch.float16)
        program = check_op(model, inputs, ops=[add_tests.Q4_FUSED], rtol=1e-2, atol=1e-2)
        assert add_tests.ADD not in add_tests._ops(program)
        _against_fp32_form(monkeypatch, model, inputs)
    _check_forms(half, "HAS_RESIDUAL")


@pytest.mark.parametrize("scheme", ["int4_g32", "int4_g128"])
def test_swiglu(half, monkeypatch, scheme):
    """The merged gate/up product with the chain in the epilogue, F = 13: bitwise the
    unfused program in HALF_DOT, eager's values, the fp32 form's within CLOSE."""
    swiglu_tests._check_fused(scheme, torch.float16, 13, k=2048, bias=scheme == "int4_g32")
    fused = [d for d in half if d is not None]
    assert "SWIGLU" in fused[0] and "SWIGLU" not in fused[1], fused  # then the unfused
    assert all("HALF_DOT" in d for d in fused), fused
    half.clear()
    module = swiglu_tests._quantized(scheme, 2048, 13, torch.float16, scheme == "int4_g32")
    _against_fp32_form(monkeypatch, module, (torch.randn(1, 1, 2048).half(),))
    _check_forms(half, "SWIGLU")


@pytest.mark.parametrize("scheme,steps,bias", [c for c in rms_tests.CASES if c[0] != "int8"],
                         ids=[i for c, i in zip(rms_tests.CASES, rms_tests.CASE_IDS)
                              if c[0] != "int8"])
def test_rms_norm(half, monkeypatch, scheme, steps, bias):
    """K = 2048, N = F = 37, one to four rows, against the op's CPU kernel and the fp32
    form."""
    dtype = torch.float16
    module = rms_tests._Op(scheme, 2048, 37, dtype, rms_tests._steps(steps, dtype), bias,
                           s_scale=0.3).eval()
    torch.manual_seed(1)
    for rows in (1, 2, 3, 4):
        x = rms_tests._x(scheme, rows, 2048, dtype, 3.0)
        check_op(module, (x,), ops=[module.op], **rms_tests._tol(dtype))
        if rows in (1, 3):
            _against_fp32_form(monkeypatch, module, (x,))
    _check_forms(half, "RMS_NORM", *(["SWIGLU"] if steps is not None else []))


@pytest.mark.parametrize("scheme,bias", [c for c in rotary_tests.CASES if c[0] != "int8"],
                         ids=[i for c, i in zip(rotary_tests.CASES, rotary_tests.CASE_IDS)
                              if c[0] != "int8"])
def test_rotary(half, monkeypatch, scheme, bias):
    """The norm, merged q/k/v product, rotary and cache writes in one dispatch (K =
    2048: 8 q heads and 2 kv heads of 64): eager's values, the unfused pair's bits in
    HALF_DOT, the fp32 form's within CLOSE."""
    torch.manual_seed(0)
    module = rotary_tests._module(scheme, torch.float16, bias, k=2048, hq=8, hkv=2, d=64)
    inputs = rotary_inputs(module, torch.float16, 7)
    check_op(module, inputs, ops=[rotary_tests.FUSED[scheme]],
             **rotary_tests._tol(torch.float16))
    _check_forms(half, "ROTARY", "RMS_NORM")
    half.clear()
    rotary_tests._bitwise_unfused(module, inputs, scheme)
    assert [("ROTARY" in d, "HALF_DOT" in d) for d in half if d is not None] == \
        [(True, True), (False, True)], half
    half.clear()
    _against_fp32_form(monkeypatch, module, inputs)
    _check_forms(half, "ROTARY", "RMS_NORM")


def test_int4_fp16_decoder_greedy_matches_eager(half, request):
    """A small fp16 Llama quantized int4 (group 32) through vkdelegate.llm with every
    decode product in HALF_DOT: greedy tokens equal HF generate of the same quantized
    model for 32 steps (tests/llm/test_quantized_lower.py's check, fp16)."""
    if request.node.callspec.params["half"] != 1:
        pytest.skip("one partial-sum length is enough for the whole decoder")
    from tests.llm.models import VOCAB, hf_greedy, make_model
    from vkdelegate.llm import generate, lower

    torch.manual_seed(0)
    model = make_model("llama").half()
    program = lower(model, 48, quantization="int4", group_size=32)
    try:
        prompt = torch.randint(0, VOCAB, (8,),
                               generator=torch.Generator().manual_seed(3)).tolist()
        assert generate(program, prompt, 32) == hf_greedy(model, prompt, 32)
    finally:
        program.close()
    assert any("HALF_DOT" in d for d in half if d is not None)
