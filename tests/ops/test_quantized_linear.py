"""torchao-quantized linears lowered to the fused quantized ops, against eager execution
of the same quantized model.

Tolerances: the lowering's dequantized weights are bit-equal to torchao's (the pass
checks that), so in fp32 the outputs differ from eager only by summation order:
outputs of magnitude ~1 from K <= 256 products, 2e-5. The int8 weight-only scheme
applies the per-channel scale after the sum on both sides. 8da4w quantizes the
activation on the GPU with 1 / scale, correctly rounded since 2026-12-07 (qlinear.h's
div_rn; before, a Newton step a driver's division could leave an ulp off, which may
round one activation value to the neighbouring quantum); the tests keep that quantum
as a margin in atol (scale_x * max|w|, what it moves an output by) until a GPU run
has confirmed that no value lands there. fp16 activations:
eager rounds its fp16 product once more than our fp32 accumulation: 1e-2 (as the fp16
linear tests).
"""
import pytest
import torch

from tests.ops.harness import check_op, delegated_nodes
from vkdelegate.backend.quantize import quantize_for_vulkan
from tests.torch_version import needs_torch_213

pytest.importorskip("torchao")

INT8PACK, Q4GSW, DQ8CA = ("aten._weight_int8pack_mm.default", "et_vk.linear_q4gsw.default",
                          "et_vk.linear_dq8ca_q4gsw.default")
UNFUSED = {"aten.mm.default", "aten.addmm.default", "aten.linear.default"}


@pytest.fixture(autouse=True)
def _forms_by_rows(monkeypatch):
    """The GEMV form for up to GEMV_ROWS rows on every device, linear_qw.glsl's GEMM
    form past them (a CPU driver's own texel form refused: it has its tests in
    test_quantized_texel.py), so that both forms run here."""
    from vkdelegate.ops.families import quantized_linear as family

    monkeypatch.setattr(family, "use_gemv", lambda info, m: m <= family.GEMV_ROWS)
    monkeypatch.setattr(family, "texel_form", lambda *args: False)


def _mlp(k, hidden, n, dtype=torch.float32, bias=True):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(k, hidden, bias=bias), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, n)).to(dtype).eval()


def _check_fused(program, op):
    ops = [name for name, _ in delegated_nodes(program)]
    assert ops.count(op) == 2, ops
    assert not UNFUSED & set(ops), ops
    assert not program.report.cpu_nodes, str(program.report)
    # The partition report names the fused op, not a dequantize chain.
    reported = [d.op for d in program.report.decisions]
    assert reported.count(op) == 2 and not UNFUSED & set(reported), reported


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("rows", [1, 3, 9], ids=["gemv", "gemv3", "gemm"])
def test_int8_weight_only(rows, dtype):
    # Odd K (37) and N (29, 11): the int8 weight is read one byte at a time.
    model = quantize_for_vulkan(_mlp(37, 29, 11, dtype), "int8")
    tol = 2e-5 if dtype == torch.float32 else 1e-2
    program = check_op(model, (torch.randn(rows, 37).to(dtype),), ops=[INT8PACK],
                       rtol=tol, atol=tol)
    _check_fused(program, INT8PACK)


def test_int8_weight_only_words_and_rank3():
    # K % 4 == 0: the GEMV reads the int8 weight as 32-bit words; a [2, 3, K] input.
    model = quantize_for_vulkan(_mlp(64, 48, 20), "int8")
    program = check_op(model, (torch.randn(2, 3, 64),), ops=[INT8PACK], rtol=2e-5,
                       atol=2e-5)
    _check_fused(program, INT8PACK)


@pytest.mark.parametrize("shape", [(5, 40), (2, 3, 40)], ids=["2d", "3d"])
def test_intx_int8_per_channel(shape):
    # IntxWeightOnlyConfig(int8, PerAxis(0)): dequantize -> linear, fused into
    # _weight_int8pack_mm + add of the bias (a 3-d input viewed to 2-d and back).
    from torchao.quantization import IntxWeightOnlyConfig, quantize_
    from torchao.quantization.granularity import PerAxis

    model = _mlp(40, 24, 13)
    quantize_(model, IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0)))
    program = check_op(model, (torch.randn(shape),), ops=[INT8PACK], rtol=2e-5, atol=2e-5)
    _check_fused(program, INT8PACK)


@pytest.mark.parametrize("group", [32, 64, 128, 256])
@pytest.mark.parametrize("rows", [1, 2, 7], ids=["gemv", "gemv2", "gemm"])
def test_int4_group_wise(group, rows):
    # N odd (37 hidden, 13 out): edge tiles and a partly used GEMV workgroup.
    model = quantize_for_vulkan(_mlp(256, 256, 13), "int4", group_size=group)
    program = check_op(model, (torch.randn(rows, 256),), ops=[Q4GSW], rtol=2e-5,
                       atol=2e-5)
    _check_fused(program, Q4GSW)


@pytest.mark.parametrize("rows", [1, 6], ids=["gemv", "gemm"])
def test_int4_fp16(rows):
    model = quantize_for_vulkan(_mlp(128, 64, 37, torch.float16), "int4", group_size=64)
    program = check_op(model, (torch.randn(rows, 128).half(),), ops=[Q4GSW], rtol=1e-2,
                       atol=1e-2)
    _check_fused(program, Q4GSW)


def test_int4_without_bias_and_rank3():
    model = quantize_for_vulkan(_mlp(64, 96, 24, bias=False), "int4", group_size=32)
    program = check_op(model, (torch.randn(2, 5, 64),), ops=[Q4GSW], rtol=2e-5, atol=2e-5)
    _check_fused(program, Q4GSW)


def _one_quantum(model, x):
    """scale_x * max|w_dq| of the first layer: what one activation rounded to the
    neighbouring int8 quantum changes an output by."""
    scale = (x.amax(-1).clamp(min=0) - x.amin(-1).clamp(max=0)) / 255
    w = model[0].weight.dequantize()
    return float(scale.max() * w.abs().max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("group,rows", [(32, 1), (64, 6), (128, 2)])
def test_8da4w(group, rows, dtype):
    # fp16: torchao's activation chain runs in fp16 (its qparams, the quantization of x
    # and the dequantization each rounded to fp16): the fused ops reproduce the first
    # two exactly (test_8da4w_fp16_quantizes_x_as_eager) and skip the last.
    model = quantize_for_vulkan(_mlp(128, 128, 40, dtype), "8da4w", group_size=group)
    torch.manual_seed(1)
    x = torch.randn(rows, 128).to(dtype)
    tol = 2e-5 if dtype == torch.float32 else 1e-2
    program = check_op(model, (x,), ops=[DQ8CA], rtol=tol,
                       atol=tol + _one_quantum(model, x.float()))
    _check_fused(program, DQ8CA)


@pytest.mark.parametrize("rows", [1, 5], ids=["gemv", "gemm"])
def test_8da4w_fp16_quantizes_x_as_eager(rows):
    """An fp16 activation's int8 values are eager's: x * fp16(1 / scale) rounded to
    fp16 before its round (values past 64 are multiples of 1/16 in fp16, so a
    quantization in fp32 differs from eager's at about 1 in 16 of them). The reference
    is exact: eager's int8 activation and int4 weight values, their integer products
    per group times both fp16 scales in float64, rounded once to fp16; our kernel sums
    the same integers and scales each group's sum in fp32 (relative error ~K/gs *
    2^-24), so every output is within one fp16 ulp of it (a moved activation value
    shifts an output by several: x's range / 255 * |w|, ~2^-9 of it here)."""
    from vkdelegate.backend.custom_ops import _choose_qparams_per_token

    k, n, group = 256, 48, 32
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(k, n, bias=False)).half().eval()
    quantize_for_vulkan(model, "8da4w", group_size=group)
    x = (torch.randn(rows, k) * torch.linspace(0.5, 3, k)).half()
    program = check_op(model, (x,), ops=[DQ8CA], rtol=1e-2, atol=1e-2)
    with torch.no_grad():
        got = program(x)
    program.close()
    scale, zp = _choose_qparams_per_token(x)
    s, z = scale.unsqueeze(-1), zp.unsqueeze(-1).half()
    q = torch.clamp(torch.round(x * (torch.reciprocal(s) * 1.0)) + z, -128, 127)
    w = model[0].weight
    qw = w.qdata.double().reshape(n, k // group, group)
    prods = ((q.double() - z.double()).reshape(rows, 1, k // group, group) * qw).sum(-1)
    want = (prods * w.scale.double()).sum(-1) * scale.double().unsqueeze(-1)
    ulp = torch.finfo(torch.float16).eps * want.abs().clamp(min=2 ** -14)
    err = (got.double() - want).abs()
    assert bool((err <= ulp).all()), (err / ulp).max()


def test_quantize_for_vulkan_rejects_bad_arguments():
    from vkdelegate.errors import VkDelegateError

    with pytest.raises(VkDelegateError, match="scheme 'int3'"):
        quantize_for_vulkan(_mlp(8, 8, 8), "int3")
    with pytest.raises(VkDelegateError, match="group size 48"):
        quantize_for_vulkan(_mlp(96, 8, 8), "int4", group_size=48)
    # A string that reads as an allowed size: its repr, so the message is not "32: ...
    # expected one of (32, ...)" (a new user's trial).
    with pytest.raises(VkDelegateError, match=r"group size '32': expected one of the "
                                              r"ints \(32, 64, 128, 256\)"):
        quantize_for_vulkan(_mlp(96, 8, 8), "int4", group_size="32")
    with pytest.raises(VkDelegateError, match="group size 32: int8 weights are quantized "
                                              "per output channel"):
        quantize_for_vulkan(_mlp(64, 8, 8), "int8", group_size=32)
    # No layer the group size divides: refused, nothing changed (it was a float model).
    model = _mlp(40, 24, 8)
    with pytest.raises(VkDelegateError, match=r"int4 with group size 64: no linear "
                                              r"layer's in_features is a multiple of it "
                                              r"\(0 \(in_features 40\), 2 \(in_features "
                                              r"24\)\), so none would be quantized"):
        quantize_for_vulkan(model, "int4", group_size=64)
    assert type(model[0].weight) is torch.nn.Parameter


def test_layers_not_divisible_by_the_group_stay_float():
    with pytest.warns(UserWarning, match=r"int4 with group size 64: 1 of 2 linear layers "
                                         r"stay in floating point, their in_features not "
                                         r"a multiple of it: 2 \(in_features 40\)") as got:
        model = quantize_for_vulkan(_mlp(64, 40, 24), "int4", group_size=64)
    assert got[0].filename == __file__  # the user's call, not vkdelegate's code
    assert type(model[0].weight) is not torch.nn.Parameter  # a torchao tensor
    assert type(model[2].weight) is torch.nn.Parameter  # in_features 40
    # filter_fn's choices are the caller's: no warning for them.
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quantize_for_vulkan(_mlp(64, 40, 24), "int4", group_size=64,
                            filter_fn=lambda m, fqn: fqn == "0")


def test_q4gsw_with_executorch_padding():
    # ExecuTorch's serialized graphs pad the scales and the bias past N (to 4) and may
    # carry weight rows longer than K / 2: N = 13 outputs, scales [2, 16], bias [16],
    # weights [13, 40] (80 values for K = 64).
    from vkdelegate.backend.custom_ops import LINEAR_Q4GSW
    from vkdelegate.backend.passes.quantized_linear import pack_4bit

    torch.manual_seed(0)
    q = torch.randint(-8, 8, (13, 80), dtype=torch.int8)
    weights = pack_4bit(q)
    scales = torch.rand(2, 16) / 10
    bias = torch.randn(16)
    op = LINEAR_Q4GSW.overload()
    x = torch.randn(3, 64)
    # The CPU kernel (eager here) against the dequantization written out.
    w = q[:, :64].float().view(13, 2, 32) * scales[:, :13].t().unsqueeze(-1)
    torch.testing.assert_close(op(x, weights, scales, 32, bias),
                               torch.nn.functional.linear(x, w.view(13, 64), bias[:13]))
    for rows in (1, 6):
        check_op(lambda x: op(x, weights, scales, 32, bias), (torch.randn(rows, 64),),
                 ops=[Q4GSW], rtol=2e-5, atol=2e-5)


@needs_torch_213
def test_pt2e_static_int8():
    # PT2E (prepare_pt2e / convert_pt2e with torchao's X86InductorQuantizer; torchao
    # 0.18 has no XNNPACK quantizer): static uint8 activations, int8 per-channel
    # weights. quantized_decomposed's ops decompose to ATen (the activations'
    # quantize / dequantize run as elementwise ops), the weights' dequantize_per_channel
    # + linear becomes _weight_int8pack_mm. Same tolerance as the int8 weight-only case.
    from torchao.quantization.pt2e import allow_exported_model_train_eval
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as x86

    model = _mlp(64, 48, 40)
    x = torch.randn(5, 64)
    graph = torch.export.export(model, (x,)).module()
    quantizer = x86.X86InductorQuantizer()
    quantizer.set_global(x86.get_default_x86_inductor_quantization_config())
    graph = prepare_pt2e(graph, quantizer)
    graph(x)  # calibration
    converted = convert_pt2e(graph)
    allow_exported_model_train_eval(converted)  # check_op calls .eval()
    program = check_op(lambda t: converted(t), (x,), ops=[INT8PACK], rtol=2e-5, atol=2e-5)
    _check_fused(program, INT8PACK)


@pytest.mark.parametrize("scheme", ["int8", "int4", "8da4w"])
@pytest.mark.parametrize("rows", [1, 3])
def test_gemm_form_of_few_rows(monkeypatch, scheme, rows):
    # linear_qw.glsl's GEMM form with one row per invocation (M_TILE 1; what a CPU
    # driver ran for a decode step before its texel form). Tolerances as above.
    from vkdelegate.ops.families import quantized_linear as family

    monkeypatch.setattr(family, "use_gemv", lambda info, m: False)
    model = quantize_for_vulkan(_mlp(64, 64, 24), scheme,
                                group_size=None if scheme == "int8" else 32)
    x = torch.randn(rows, 64)
    atol = 2e-5 + (_one_quantum(model, x) if scheme == "8da4w" else 0)
    op = {"int8": INT8PACK, "int4": Q4GSW, "8da4w": DQ8CA}[scheme]
    program = check_op(model, (x,), ops=[op], rtol=2e-5, atol=atol)
    _check_fused(program, op)
