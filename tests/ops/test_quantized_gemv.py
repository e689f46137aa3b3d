"""The vectorized quantized GEMV (linear_qw_gemv.glsl: 16-byte weight blocks, the int4
group scale once per block, subgroup or shared-memory reduction) against eager
execution of torchao's quantized linears (their dequantized weights).

Shapes: K past one workgroup's sweep (VWG blocks of 32 int4 / 16 int8 values) with a
partial last sweep, N = 13 (not a multiple of VROWS: a partly used workgroup), one and
three rows. Tolerances as tests/ops/test_quantized_linear.py: fp32 differs from eager by
summation order only (outputs ~1 from K ~ 4600 products: 2e-5 relative + absolute);
fp16 activations: eager rounds its product to fp16 (2^-11 relative) and its int4
weights to fp16 before the product, which this form skips (the scale is applied to
the block's sum: at most 2^-12 of each product): 1e-2, as the fp16 linear tests.
8da4w: as test_quantized_linear (its margin of one activation quantum).
"""
import pytest
import torch

from tests.ops import coverage
from tests.ops.harness import check_op, spy_dispatches
from tests.ops.test_quantized_linear import _one_quantum
from vkdelegate.backend.quantize import quantize_for_vulkan

pytest.importorskip("torchao")

INT8PACK, Q4GSW = "aten._weight_int8pack_mm.default", "et_vk.linear_q4gsw.default"
DQ8CA = "et_vk.linear_dq8ca_q4gsw.default"


@pytest.fixture(params=["direct", "staged", "sg_rows", "half", "half_sg_rows"])
def family(monkeypatch, request):
    """The quantized-linear family with the GEMV forms on every device (a CPU driver
    gets the GEMM form by default), in its DIRECT form (x loaded per invocation), the
    staged one (x in shared memory per sweep), SG_ROWS (VSG_ROWS: a subgroup per
    output over its whole K; where the device has subgroup arithmetic, else DIRECT)
    or HALF_DOT (VHALF: int4 with fp16 x in packed fp16 arithmetic; DIRECT with 4 words
    per fp16 partial sum, the most the form allows, or SG_ROWS with 1), and a count of
    linear_qw_gemv dispatches (SG_ROWS: each checked to take it; ``family.halves``:
    the HALF_DOT forms chosen)."""
    from vkdelegate.ops.families import quantized_linear as family

    monkeypatch.setattr(family, "use_gemv", lambda info, m: m <= family.GEMV_ROWS)
    form = request.param
    direct, sg, half = form != "staged", form.endswith("sg_rows"), form.startswith("half")
    # HALF_DOT's partial sums: 4 words in the DIRECT form (the most rounding), 1 in SG_ROWS
    hwords = {"half": 4, "half_sg_rows": 1}.get(form, family.VHWORDS)
    if (direct, sg, half, hwords) != (family.VDIRECT, family.VSG_ROWS, family.VHALF,
                                      family.VHWORDS):
        monkeypatch.setattr(coverage, "RECORD_VARIANTS", False)  # --sweep forms: undeclared
    monkeypatch.setattr(family, "VDIRECT", direct)
    monkeypatch.setattr(family, "VSG_ROWS", sg)
    monkeypatch.setattr(family, "VHALF", half)
    monkeypatch.setattr(family, "VHWORDS", hwords)
    halves = []
    half_dot = family.half_dot

    def counted_half(defines):
        halves.append(defines["W4"])
        return half_dot(defines)

    monkeypatch.setattr(family, "half_dot", counted_half)
    family.halves = halves
    calls = []
    record = family._record_vector

    def counted(*args, **kwargs):
        calls.append(args[6])  # bits
        b = args[0]
        want = sg and family.has_subgroup_arithmetic(b.device.info)
        assert family.sg_rows(b.device.info) == want
        return record(*args, **kwargs)

    monkeypatch.setattr(family, "_record_vector", counted)
    family.calls = calls
    yield family
    del family.calls, family.halves


def _linear(k, n, dtype, bias=True):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(k, n, bias=bias)).to(dtype).eval()


def _tol(dtype):
    return 2e-5 if dtype == torch.float32 else 1e-2


@pytest.mark.parametrize("subgroup", [True, False], ids=["subgroup", "shared"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("group", [32, 64, 128, 256])
def test_int4_gemv(family, monkeypatch, group, dtype, subgroup):
    if not subgroup:
        monkeypatch.setattr(family, "has_subgroup_arithmetic", lambda info: False)
    k = 4608  # 144 blocks of 32: one full sweep of 128 invocations and a partial one
    model = quantize_for_vulkan(_linear(k, 13, dtype), "int4", group_size=group)
    for rows in (1, 3):
        x = torch.randn(rows, k).to(dtype)
        check_op(model, (x,), ops=[Q4GSW], rtol=_tol(dtype), atol=_tol(dtype))
    assert family.calls == [4, 4]
    assert len(family.halves) == (2 if family.VHALF and dtype == torch.float16 else 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_int4_gemv_second_iteration(family, dtype):
    # K = 8224: 257 blocks of 32, past two iterations of VUNROLL * VWG = 128 blocks
    # (DIRECT) / two sweeps (staged), and a third with one block; N = 13.
    k = 8224
    model = quantize_for_vulkan(_linear(k, 13, dtype), "int4", group_size=32)
    check_op(model, (torch.randn(1, k).to(dtype),), ops=[Q4GSW], rtol=_tol(dtype),
             atol=_tol(dtype))
    assert family.calls == [4]


@pytest.mark.parametrize("subgroup", [True, False], ids=["subgroup", "shared"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_int8_gemv(family, monkeypatch, dtype, subgroup):
    if not subgroup:
        monkeypatch.setattr(family, "has_subgroup_arithmetic", lambda info: False)
    k = 2064  # 129 blocks of 16
    model = quantize_for_vulkan(_linear(k, 13, dtype), "int8")
    for rows in (1, 4):
        check_op(model, (torch.randn(rows, k).to(dtype),), ops=[INT8PACK],
                 rtol=_tol(dtype), atol=_tol(dtype))
    assert family.calls == [8, 8]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("int_dot", [True, False], ids=["int_dot", "portable"])
@pytest.mark.parametrize("group", [32, 128, 256])
def test_8da4w_gemv(family, monkeypatch, group, int_dot, dtype):
    # The device's integer dot product (dotPacked4x8EXT, lavapipe has it) or, with the
    # integer-dot candidate dropped, the portable fp32 integer sums. fp16: x quantized
    # as torchao's fp16 chain rounds it (HALF_DOT is not an 8da4w form).
    if not int_dot:
        monkeypatch.setattr(family, "choose", lambda shader, candidates, caps:
                            dict(candidates[-1]))
    k = 4608
    model = quantize_for_vulkan(_linear(k, 13, dtype), "8da4w", group_size=group)
    torch.manual_seed(1)
    for rows in (1, 3):
        x = torch.randn(rows, k).to(dtype)
        check_op(model, (x,), ops=[DQ8CA], rtol=_tol(dtype),
                 atol=_tol(dtype) + _one_quantum(model, x.float()))
    assert family.calls == [4, 4]


def test_int4_without_bias_and_rank3(family):
    model = quantize_for_vulkan(_linear(256, 21, torch.float32, bias=False), "int4",
                                group_size=128)
    check_op(model, (torch.randn(1, 2, 256),), ops=[Q4GSW], rtol=2e-5, atol=2e-5)
    assert family.calls == [4]


@pytest.mark.parametrize("group,row_bytes", [(16, 32), (32, 40)])
def test_other_weights_take_the_word_form(family, group, row_bytes):
    # Where a 16-byte block would span two groups (groups of 16, as an ExecuTorch graph
    # may carry) or the weight rows are not whole blocks (ExecuTorch's padding, 40
    # bytes for K = 64), and int8 K % 16 != 0: linear_qw.glsl's GEMV form, still exact.
    from vkdelegate.backend.custom_ops import LINEAR_Q4GSW
    from vkdelegate.backend.passes.quantized_linear import pack_4bit

    torch.manual_seed(0)
    weights = pack_4bit(torch.randint(-8, 8, (13, 2 * row_bytes), dtype=torch.int8))
    scales, bias = torch.rand(64 // group, 13) / 10, torch.randn(13)
    op = LINEAR_Q4GSW.overload()
    check_op(lambda x: op(x, weights, scales, group, bias), (torch.randn(1, 64),),
             ops=[Q4GSW], rtol=2e-5, atol=2e-5)
    check_op(quantize_for_vulkan(_linear(40, 13, torch.float32), "int8"),
             (torch.randn(1, 40),), ops=[INT8PACK], rtol=2e-5, atol=2e-5)
    assert family.calls == []


# linear_qw_gemv.glsl's forms (DIRECT, VWG, VROWS, VUNROLL, VSG_ROWS) that
# benchmarks/quant_gemv.py --sweep times, each against eager: N = 64 (a multiple of
# every VROWS) has the int4 scales read by vector loads (SVEC) wherever VROWS holds
# whole loads (8 fp16 / 4 fp32 scales; never SG_ROWS), N = 13 by scalar loads; K =
# 4608 (144 blocks: a partial iteration). SG_ROWS (VROWS units per workgroup, DIRECT
# implied) where the device has subgroup arithmetic.
FORMS = [(False, 128, 8, 1, False), (False, 64, 16, 1, False), (True, 128, 8, 1, False),
         (True, 128, 4, 2, False), (True, 64, 8, 1, False), (True, 32, 4, 4, False),
         (True, 32, 2, 4, False), (True, 32, 8, 2, False),
         (True, 128, 8, 1, True), (True, 128, 16, 2, True), (True, 256, 32, 1, True),
         (True, 64, 3, 4, True)]


def _form_id(f):
    return f"{'sg_rows' if f[4] else 'direct' if f[0] else 'staged'}_wg{f[1]}_r{f[2]}_u{f[3]}"


@pytest.mark.parametrize("form", FORMS, ids=_form_id)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_int4_int8_forms(monkeypatch, dtype, form):
    from vkdelegate.ops.families import quantized_linear as family
    from vkdelegate.runtime import default_device
    monkeypatch.setattr(family, "VMIN_GROUPS", 0)  # VROWS whatever N: its runs of scales

    monkeypatch.setattr(family, "use_gemv", lambda info, m: m <= family.GEMV_ROWS)
    names = ("VDIRECT", "VWG", "VROWS", "VUNROLL", "VSG_ROWS")
    if form != tuple(getattr(family, name) for name in names):
        # --sweep forms, not the lowering's default: never declared
        monkeypatch.setattr(coverage, "RECORD_VARIANTS", False)
    for name, value in zip(names, form):
        monkeypatch.setattr(family, name, value)
    seen = []
    defines = family.vector_defines
    monkeypatch.setattr(family, "vector_defines",
                        lambda *a, **kw: seen.append(defines(*a, **kw)) or seen[-1])
    k = 4608
    torch.manual_seed(2)
    x = torch.randn(1, k).to(dtype)
    for n, group in ((64, 128), (13, 32)):
        model = quantize_for_vulkan(_linear(k, n, dtype), "int4", group_size=group)
        check_op(model, (x,), ops=[Q4GSW], rtol=_tol(dtype), atol=_tol(dtype))
    model = quantize_for_vulkan(_linear(k, 64, dtype), "int8")
    check_op(model, (x,), ops=[INT8PACK], rtol=_tol(dtype), atol=_tol(dtype))
    sg = form[4] and family.has_subgroup_arithmetic(default_device().info)
    whole = form[2] % (8 if dtype == torch.float16 else 4) == 0 and not sg
    assert ["SVEC" in d for d in seen] == [whole, False, False]
    assert all(("DIRECT" in d) == (form[0] or sg) and d["WG"] == str(form[1])
               and ("SG_ROWS" in d) == sg for d in seen)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_few_workgroups_take_fewer_rows(family, monkeypatch, dtype):
    """VMIN_GROUPS: a product of few outputs halves VROWS (8 -> 4 -> 2) until it has
    that many workgroups; N = 37, 13 and 3 rows of int4 (group 32, SVEC where the run
    allows it) and int8, against eager, each dispatch's ROWS and grid as computed
    (SG_ROWS keeps VROWS)."""
    from vkdelegate.runtime import default_device

    monkeypatch.setattr(family, "VMIN_GROUPS", 10)
    monkeypatch.setattr(coverage, "RECORD_VARIANTS", False)  # not the default
    seen = []
    defines = family.vector_defines
    monkeypatch.setattr(family, "vector_defines",
                        lambda *a, **kw: seen.append(defines(*a, **kw)) or seen[-1])
    sg = family.sg_rows(default_device().info)
    k = 2080
    torch.manual_seed(4)
    for n, want in ((37, 4), (13, 2), (3, 2)):
        model = quantize_for_vulkan(_linear(k, n, dtype), "int4", group_size=32)
        x = torch.randn(2, k).to(dtype)
        check_op(model, (x,), ops=[Q4GSW], rtol=_tol(dtype), atol=_tol(dtype))
        model = quantize_for_vulkan(_linear(k, n, dtype), "int8")
        check_op(model, (x,), ops=[INT8PACK], rtol=_tol(dtype), atol=_tol(dtype))
        assert [d["ROWS"] for d in seen] == [str(8 if sg else want)] * 2, (n, seen)
        seen.clear()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_short_rows_take_fitted_workgroups(family, monkeypatch, dtype):
    """VWG_FIT: rows of at most that many weight blocks take workgroups of VWG_FIT
    invocations (none idles), longer rows VWG; int4 K = 2048 (64 blocks) and 2080 (65),
    int8 K = 1024 (64) and 2048 (128), against eager, each dispatch's WG and workgroup
    size as computed (SG_ROWS keeps VWG)."""
    from vkdelegate.runtime import default_device

    assert 0 < family.VWG_FIT < family.VWG  # the default fits the 1B decode's K = 2048
    seen = spy_dispatches(monkeypatch, lambda shader, defines, sizes: (
        defines["WG"], sizes[1][0]) if shader == "linear_qw_gemv" else None, sizes=True)
    sg = family.sg_rows(default_device().info)
    fit = family.VWG if sg else family.VWG_FIT
    torch.manual_seed(5)
    for bits, k, want in ((4, 2048, fit), (4, 2080, family.VWG), (8, 1024, fit),
                          (8, 2048, family.VWG)):
        model = quantize_for_vulkan(_linear(k, 24, dtype), "int4" if bits == 4 else "int8",
                                    group_size=32 if bits == 4 else None)
        x = torch.randn(1, k).to(dtype)
        check_op(model, (x,), ops=[Q4GSW if bits == 4 else INT8PACK], rtol=_tol(dtype),
                 atol=_tol(dtype))
        assert [d for d in seen if d] == [(str(want), want)], (bits, k, seen)
        seen.clear()
