"""Layer, RMS, group and instance norm (norm.glsl) on Vulkan against eager: every
output (mean and rstd too), weight/bias present or None, odd sizes, rows from 1 to
4097 elements (both row forms), fp16, size-0 dims, resize, whole nn modules."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.export import Dim

from tests.ops.harness import check_op

aten = torch.ops.aten
LN = "aten.native_layer_norm.default"
GN = "aten.native_group_norm.default"
BN = "aten._native_batch_norm_legit.no_stats"
RMS = "aten.rms_norm.default"
# fp32: two-pass statistics in fp32 as ATen's CPU kernels; results differ in the last
# bits only (rstd of rows of ~4000 elements: the sums' rounding order).
FP32_TOL = dict(rtol=1e-5, atol=1e-5)
# fp16 data, fp32 statistics, one rounding: eager rounds the same fp32 values, but the
# normalized values (|y| up to ~4, weights ~N(0,1)) are within an fp16 ulp (~4e-3 at 4).
FP16_TOL = dict(rtol=4e-3, atol=4e-3)


def _affine(shape, weight: bool, bias: bool, dtype=torch.float32):
    return (torch.randn(shape, dtype=dtype) if weight else None,
            torch.randn(shape, dtype=dtype) if bias else None)


@pytest.mark.parametrize("shape,k", [((3, 5, 7), 1), ((3, 5, 7), 2), ((3, 5, 7), 3),
                                     ((1,), 1), ((2, 1, 1), 1), ((4, 0), 1),
                                     ((0, 6), 1), ((2, 3, 1, 5, 1, 3), 3)])
@pytest.mark.parametrize("weight,bias", [(True, True), (False, False), (True, False),
                                         (False, True)])
def test_native_layer_norm(shape, k, weight, bias):
    torch.manual_seed(0)
    w, b = _affine(shape[len(shape) - k:], weight, bias)
    check_op(lambda x: aten.native_layer_norm.default(x, list(x.shape[x.dim() - k:]), w, b,
                                                     1e-5),
             (torch.randn(shape) * 3 + 1,), ops=[LN], **FP32_TOL)


@pytest.mark.parametrize("n", [1, 2, 15, 16, 17, 63, 64, 65, 257, 1000, 1023, 1025, 4097])
def test_layer_norm_row_lengths(n):
    # Rows of n elements: the per-invocation form, and the cooperative one on GPUs
    # (rows.cooperative) past 4 * WG_REDUCE; values far from 0 (mean 5) test the
    # two-pass variance.
    torch.manual_seed(0)
    w, b = _affine((n,), True, True)
    check_op(lambda x: aten.native_layer_norm.default(x, [n], w, b, 1e-5),
             (torch.randn(3, n) + 5,), ops=[LN], **FP32_TOL)


def test_layer_norm_fp16():
    torch.manual_seed(0)
    w, b = _affine((37,), True, True, torch.float16)
    check_op(lambda x: aten.native_layer_norm.default(x, [37], w, b, 1e-5),
             (torch.randn(4, 3, 37).half() * 2,), ops=[LN], **FP16_TOL)


def test_layer_norm_statistics_used_by_the_graph():
    torch.manual_seed(0)

    def fn(x):
        out, mean, rstd = aten.native_layer_norm.default(x, [6, 5], None, None, 1e-3)
        return out * 2, mean + 1, rstd * 0.5
    check_op(fn, (torch.randn(2, 4, 6, 5),), ops=[LN], **FP32_TOL)


def test_layer_norm_module_and_resize():
    # nn.LayerNorm exports as aten.layer_norm, kept whole (ops_to_preserve).
    torch.manual_seed(0)
    ln = nn.LayerNorm(24)
    with torch.no_grad():
        ln.weight.normal_()
        ln.bias.normal_()
    n, t = Dim("n", min=1, max=8), Dim("t", min=1, max=50)
    check_op(ln, (torch.randn(2, 9, 24),), ops=["aten.layer_norm.default"],
             dynamic_shapes={"input": {0: n, 1: t}},
             resize_inputs=[(torch.randn(8, 50, 24),), (torch.randn(1, 1, 24),)],
             **FP32_TOL)


@pytest.mark.parametrize("shape,groups", [((2, 6, 5, 7), 3), ((2, 6, 5, 7), 1),
                                          ((2, 6, 5, 7), 6), ((3, 4), 2), ((1, 8, 33), 4),
                                          ((2, 4, 0), 2), ((0, 4, 3), 2),
                                          ((1, 4, 2, 3, 2), 2)])
@pytest.mark.parametrize("affine", [(True, True), (False, False), (False, True)])
def test_native_group_norm(shape, groups, affine):
    torch.manual_seed(0)
    w, b = _affine((shape[1],), *affine)
    hw = 1
    for s in shape[2:]:
        hw *= s
    check_op(lambda x: aten.native_group_norm.default(x, w, b, shape[0], shape[1], hw,
                                                     groups, 1e-5),
             (torch.randn(shape) * 2 - 1,), ops=[GN], **FP32_TOL)


def test_group_norm_module_fp16_and_long_groups():
    torch.manual_seed(0)
    gn = nn.GroupNorm(4, 8)
    with torch.no_grad():
        gn.weight.normal_()
        gn.bias.normal_()
    gn_op = ["aten.group_norm.default"]
    check_op(gn, (torch.randn(2, 8, 40, 41),), ops=gn_op, **FP32_TOL)  # 3280 per group
    check_op(gn.half(), (torch.randn(2, 8, 9, 7).half(),), ops=gn_op, **FP16_TOL)


def test_group_norm_resize():
    torch.manual_seed(0)
    n, h = Dim("n", min=1, max=4), Dim("h", min=1, max=12)
    # nn.GroupNorm is kept whole as aten.group_norm (native_group_norm's N and HxW
    # would be symbolic arguments, which a delegate cannot take).
    check_op(nn.GroupNorm(2, 4), (torch.randn(2, 4, 5, 3),), ops=["aten.group_norm.default"],
             dynamic_shapes={"input": {0: n, 2: h}},
             resize_inputs=[(torch.randn(4, 4, 12, 3),), (torch.randn(1, 4, 1, 3),)],
             **FP32_TOL)


@pytest.mark.parametrize("module,shape", [
    (nn.InstanceNorm1d(4), (2, 4, 9)), (nn.InstanceNorm1d(4, affine=True), (2, 4, 9)),
    (nn.InstanceNorm2d(3), (2, 3, 5, 6)), (nn.InstanceNorm2d(3, affine=True), (1, 3, 70, 70)),
])
def test_instance_norm_modules(module, shape):
    # nn.InstanceNorm exports as views around _native_batch_norm_legit.no_stats (and
    # repeats of the affine parameters): every node runs on Vulkan.
    torch.manual_seed(0)
    if module.affine:
        with torch.no_grad():
            module.weight.normal_()
            module.bias.normal_()
    program = check_op(module, (torch.randn(shape) + 2,), ops=[BN], **FP32_TOL)
    report = program.methods["forward"].report
    assert not report.cpu_nodes, str(report)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_batch_statistics_op(dtype):
    # The op itself (N > 1: a channel's elements are strided) with all three outputs.
    torch.manual_seed(0)
    w, b = _affine((5,), True, True, dtype)
    tol = FP32_TOL if dtype == torch.float32 else FP16_TOL
    check_op(lambda x: aten._native_batch_norm_legit.no_stats(x, w, b, True, 0.1, 1e-5),
             (torch.randn(3, 5, 4, 7).to(dtype),), ops=[BN], **tol)
    check_op(lambda x: aten._native_batch_norm_legit.no_stats(x, None, None, True, 0.1,
                                                              1e-3),
             (torch.randn(4, 5).to(dtype),), ops=[BN], **tol)


@pytest.mark.parametrize("shape,k", [((3, 8), 1), ((2, 3, 5, 7), 2), ((1,), 1),
                                     ((2, 4097), 1), ((0, 4), 1)])
@pytest.mark.parametrize("weight", [True, False])
def test_rms_norm(shape, k, weight):
    torch.manual_seed(0)
    norm = shape[len(shape) - k:]
    w = torch.randn(norm) if weight else None
    check_op(lambda x: (F.rms_norm(x, norm, w, 1e-6), F.rms_norm(x, norm, w)),
             (torch.randn(shape) * 3,), ops=[RMS], **FP32_TOL)


def test_rms_norm_module_fp16_and_resize():
    torch.manual_seed(0)
    rms = nn.RMSNorm(32)
    with torch.no_grad():
        rms.weight.normal_()
    n = Dim("n", min=1, max=20)
    check_op(rms, (torch.randn(5, 32),), ops=[RMS], dynamic_shapes={"x": {0: n}},
             resize_inputs=[(torch.randn(20, 32),), (torch.randn(1, 32),)], **FP32_TOL)
    check_op(rms.half(), (torch.randn(3, 7, 32).half(),), ops=[RMS], **FP16_TOL)


def test_fp16_modules_and_ops():
    # fp16 forms of the ops the other tests run in fp32: nn.LayerNorm (aten.layer_norm)
    # and native_group_norm with its statistics.
    torch.manual_seed(0)
    ln = nn.LayerNorm([5, 6]).half()
    with torch.no_grad():
        ln.weight.normal_()
        ln.bias.normal_()
    check_op(ln, (torch.randn(3, 5, 6).half(),), ops=["aten.layer_norm.default"],
             **FP16_TOL)
    w, b = _affine((6,), True, True, torch.float16)
    check_op(lambda x: aten.native_group_norm.default(x, w, b, 2, 6, 20, 3, 1e-5),
             (torch.randn(2, 6, 4, 5).half(),), ops=[GN], **FP16_TOL)


@pytest.mark.parametrize("subgroup", [True, False])
@pytest.mark.parametrize("n,rows", [(2048, (1,)), (2050, (1,)), (3000, (2, 3)),
                                    (7, (4,)), (8192, (1,))])
def test_vector_row_form(monkeypatch, n, rows, subgroup):
    # The GPUs' vector row form (kernels/rows.vector_rows), forced on lavapipe: RMS
    # norm (one token of a decode step: 1 x 2048) and layer norm with its statistics,
    # 4-element accesses (n % 4 == 0, 3000 not a power of two) and scalar ones (2050,
    # 7), fp32 and fp16, with subgroupAdd and with the shared-memory tree.
    from vkdelegate.kernels import norm_dispatch  # norm.glsl's dispatch (ops/families/norm.py's)
    monkeypatch.setattr(norm_dispatch, "vector_rows", lambda info, n: True)
    if not subgroup:
        monkeypatch.setattr(norm_dispatch, "has_subgroup_arithmetic", lambda info: False)
    torch.manual_seed(0)
    w, b = _affine((n,), True, True)
    x = torch.randn(*rows, n) * 3 + 2
    check_op(lambda x: (F.rms_norm(x, [n], w, 1e-6), F.rms_norm(x, [n])), (x,),
             ops=[RMS], **FP32_TOL)
    check_op(lambda x: aten.native_layer_norm.default(x, [n], w, b, 1e-5), (x,),
             ops=[LN], **FP32_TOL)
    wh, bh = w.half(), b.half()
    check_op(lambda x: (F.rms_norm(x, [n], wh, 1e-6),
                        aten.native_layer_norm.default(x, [n], None, bh, 1e-5)),
             (x.half(),), ops=[RMS, LN], **FP16_TOL)
