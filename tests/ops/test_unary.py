"""Elementwise unary ops on Vulkan against eager: every claimed dtype, edge values
(NaN, infinities, zeros, half-way points), prime and size-0/size-1 shapes, resize."""
import pytest
import torch
import torch.nn.functional as F
from torch.export import Dim

from tests.ops.harness import check_op

NAN, INF = float("nan"), float("inf")
# fp16 has an 11-bit significand (relative spacing 2**-10 ~ 1e-3); results computed in
# fp32 and rounded once may differ from eager's by one fp16 ulp.
FP16_TOL = dict(rtol=2e-3, atol=2e-3)
# These tests are about each op's own kernel (unary_op.glsl): chains of them stay
# unfused here (tests/ops/test_fused_elementwise.py runs the same ops fused).
UNFUSED = {"fuse_elementwise": False}


def _data(dtype, shape=(3, 5, 7), low=-4.0, high=4.0):
    if dtype in (torch.int32, torch.int8, torch.int64):
        return torch.randint(-100, 100, shape, dtype=dtype)
    if dtype == torch.uint8:
        return torch.randint(0, 255, shape, dtype=dtype)
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    return (torch.rand(shape) * (high - low) + low).to(dtype)


def _tol(dtype):
    return FP16_TOL if dtype == torch.float16 else {}


# (aten op, function, dtypes, input range)
CASES = [
    ("aten.relu.default", torch.relu, [torch.float32, torch.float16, torch.int32,
                                        torch.int8, torch.uint8], (-4, 4)),
    ("aten.hardtanh.default", F.relu6, [torch.float32, torch.float16], (-3, 9)),
    ("aten.hardtanh.default", lambda x: F.hardtanh(x, -2.5, 1.5),
     [torch.float32], (-4, 4)),
    ("aten.hardswish.default", F.hardswish, [torch.float32, torch.float16], (-5, 5)),
    ("aten.clamp.default", lambda x: x.clamp(-1, 2), [torch.float32, torch.float16,
                                                      torch.int32, torch.int64], (-4, 4)),
    ("aten.clamp.default", lambda x: x.clamp(min=0.5), [torch.float32], (-4, 4)),
    ("aten.clamp.default", lambda x: x.clamp(max=-3), [torch.int32, torch.int64], (-4, 4)),
    # A bound beyond the int32 range (int64 is held in int32 on the device).
    ("aten.clamp.default", lambda x: x.clamp(min=-2 ** 40, max=50), [torch.int64], (-4, 4)),
    ("aten.leaky_relu.default", F.leaky_relu, [torch.float32, torch.float16], (-4, 4)),
    ("aten.leaky_relu.default", lambda x: F.leaky_relu(x, 0.3), [torch.float32], (-4, 4)),
    ("aten.elu.default", F.elu, [torch.float32, torch.float16], (-4, 4)),
    ("aten.elu.default", lambda x: F.elu(x, alpha=0.7), [torch.float32], (-1e-4, 1e-4)),
    ("aten.elu.default", torch.selu, [torch.float32], (-4, 4)),
    ("aten.gelu.default", F.gelu, [torch.float32, torch.float16], (-6, 6)),
    ("aten.gelu.default", lambda x: F.gelu(x, approximate="tanh"),
     [torch.float32, torch.float16], (-6, 6)),
    ("aten.neg.default", torch.neg, [torch.float32, torch.float16, torch.int32,
                                     torch.int8, torch.int64], (-4, 4)),
    ("aten.abs.default", torch.abs, [torch.float32, torch.float16, torch.int32,
                                     torch.int8, torch.int64], (-4, 4)),
    ("aten.sign.default", torch.sign, [torch.float32, torch.float16, torch.int32,
                                       torch.int64], (-2, 2)),
    ("aten.sigmoid.default", torch.sigmoid, [torch.float32, torch.float16], (-20, 20)),
    ("aten.tanh.default", torch.tanh, [torch.float32, torch.float16], (-20, 20)),
    ("aten.exp.default", torch.exp, [torch.float32, torch.float16], (-10, 10)),
    ("aten.log.default", torch.log, [torch.float32, torch.float16], (0.01, 100)),
    ("aten.sqrt.default", torch.sqrt, [torch.float32, torch.float16], (0, 100)),
    ("aten.log10.default", torch.log10, [torch.float32, torch.float16], (0.01, 1000)),
    ("aten.rsqrt.default", torch.rsqrt, [torch.float32, torch.float16], (0.01, 100)),
    ("aten.reciprocal.default", torch.reciprocal, [torch.float32, torch.float16], (0.1, 9)),
    ("aten.erf.default", torch.erf, [torch.float32, torch.float16], (-3, 3)),
    ("aten.sin.default", torch.sin, [torch.float32, torch.float16], (-6, 6)),
    ("aten.cos.default", torch.cos, [torch.float32, torch.float16], (-6, 6)),
    ("aten.round.default", torch.round, [torch.float32, torch.float16], (-9, 9)),
    ("aten.floor.default", torch.floor, [torch.float32, torch.float16], (-9, 9)),
    ("aten.ceil.default", torch.ceil, [torch.float32, torch.float16], (-9, 9)),
    ("aten.logical_not.default", torch.logical_not,
     [torch.float32, torch.float16, torch.int32, torch.int8, torch.bool], (-1, 1)),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int32, torch.int8,
                                   torch.uint8, torch.bool, torch.int64], ids=str)
def test_unary(dtype):
    """One program per dtype (export and lowering dominate a check's time): every case
    claiming ``dtype`` on its own input, outputs keyed so that a failure names the case."""
    torch.manual_seed(0)
    cases = [(f"{op[5:]}#{i}", op, fn, lohi) for i, (op, fn, dts, lohi) in enumerate(CASES)
             if dtype in dts]
    inputs = tuple(_data(dtype, low=lohi[0], high=lohi[1]) for _, _, _, lohi in cases)
    check_op(lambda *xs: {key: fn(x) for (key, _, fn, _), x in zip(cases, xs)}, inputs,
             ops=sorted({op for _, op, _, _ in cases}), **_tol(dtype))


EDGES = torch.tensor([NAN, INF, -INF, 0.0, -0.0, 0.5, 1.5, 2.5, -0.5, -2.5, 1e-30,
                      -1e30, 100.0, -100.0])


EDGE_OPS = [
    ("aten.relu.default", torch.relu),
    ("aten.hardtanh.default", F.relu6),
    ("aten.hardswish.default", F.hardswish),
    ("aten.clamp.default", lambda x: x.clamp(-1.0, 1.0)),
    ("aten.hardtanh.default", lambda x: F.hardtanh(x, -1.0, NAN)),
    ("aten.sigmoid.default", torch.sigmoid),
    ("aten.tanh.default", torch.tanh),
    ("aten.exp.default", torch.exp),
    ("aten.log.default", torch.log),
    ("aten.log10.default", torch.log10),
    ("aten.sqrt.default", torch.sqrt),
    ("aten.rsqrt.default", torch.rsqrt),
    ("aten.reciprocal.default", torch.reciprocal),
    ("aten.round.default", torch.round),
    ("aten.sign.default", torch.sign),
    # Eager's vectorized gelu gives NaN at +-inf (we give the limits): finite edges only.
    ("aten.gelu.default", lambda x: F.gelu(x.clamp(-1e30, 1e30))),
    ("aten.elu.default", F.elu),
    ("aten.logical_not.default", torch.logical_not),
]


def test_edge_values():
    """NaN, infinities, signed zeros, half-way points: one program, one output per op
    (a failure names the output index, i.e. the position in EDGE_OPS)."""
    fns = [fn for _, fn in EDGE_OPS]
    check_op(lambda x: tuple(fn(x) for fn in fns), (EDGES,),
             ops=sorted({op for op, _ in EDGE_OPS}), options=UNFUSED)


def _nan_bound_propagates() -> bool:
    """Whether this torch's eager clamp gives NaN for a NaN scalar bound (2.13 does;
    2.11's CPU kernel ignores the bound and returns x)."""
    return bool(torch.isnan(torch.tensor([1.0]).clamp(min=NAN)).all())


@pytest.mark.skipif(not _nan_bound_propagates(),
                    reason=f"torch {torch.__version__}'s eager clamp ignores a NaN scalar "
                           f"bound; we follow torch 2.13, which propagates it")
def test_clamp_nan_bound_gives_nan():
    check_op(lambda x: (x.clamp(min=NAN), x.clamp(max=NAN)), (EDGES,),
             ops=["aten.clamp.default"])


@pytest.mark.parametrize("shape", [(), (0,), (1,), (29,), (2, 0, 3), (1, 3, 1, 5, 1, 2)])
def test_shapes(shape):
    torch.manual_seed(0)
    check_op(F.gelu, (torch.randn(shape),), ops=["aten.gelu.default"])


def test_resize():
    torch.manual_seed(0)
    n = Dim("n", min=1, max=64)
    check_op(F.relu6, (torch.randn(3, 29) * 8,), ops=["aten.hardtanh.default"],
             dynamic_shapes=({1: n},), resize_inputs=[(torch.randn(3, 5) * 8,),
                                                      (torch.randn(3, 64) * 8,)])


def test_clamp_with_float_bound_on_int_stays_on_cpu():
    x = torch.arange(-3, 4, dtype=torch.int32)
    with pytest.raises(AssertionError, match="type promotion"):
        check_op(lambda t: t.clamp(min=0.5), (x,), ops=["aten.clamp.default"])


def test_hardswish_whole_and_hardsigmoid_silu_decompositions_run_on_vulkan():
    # hardswish is a registry op (kept whole, as ET-VK does); the others decompose.
    torch.manual_seed(0)
    x = torch.randn(5, 11) * 4
    check_op(F.hardswish, (x,), ops=["aten.hardswish.default"])
    check_op(F.hardsigmoid, (x,), ops=["aten.clamp.default"], options=UNFUSED)
    check_op(F.silu, (x,), ops=["aten.sigmoid.default"], options=UNFUSED)


def test_more_elementwise():
    # log1p/expm1 near 0 (where naive formulas lose digits), softplus and mish (exported
    # via log1p and where), log2/exp2/trunc, isnan and bitwise_not.
    torch.manual_seed(0)
    small = torch.tensor([1e-8, -1e-8, 1e-4, -3e-3, 0.3, -0.7, 5.0, -1.0, -2.0, 0.0, NAN,
                          INF, 50.0, -50.0])
    x = torch.randn(3, 29) * 4
    check_op(lambda s, t: {"log1p": torch.log1p(s), "expm1": torch.expm1(s),
                           "softplus": F.softplus(t), "mish": F.mish(t),
                           "log2": torch.log2(t.abs()), "exp2": torch.exp2(t),
                           "trunc": torch.trunc(t), "isnan": torch.isnan(s),
                           "fp16": torch.log1p(t.abs().half()), "fp16e": torch.expm1(
                               (t / 8).half())},
             (small, x), ops=["aten.log1p.default", "aten.expm1.default",
                              "aten.log2.default", "aten.exp2.default",
                              "aten.trunc.default", "aten.isnan.default"],
             rtol=2e-3, atol=2e-3, options=UNFUSED)
    # fp32-only tolerance for the accuracy claims near 0:
    check_op(lambda s: (torch.log1p(s), torch.expm1(s)), (small,),
             ops=["aten.log1p.default", "aten.expm1.default"], rtol=1e-5, atol=1e-12,
             options=UNFUSED)
    i = torch.randint(-100, 100, (5, 7), dtype=torch.int32)
    check_op(lambda n: (~n, ~(n > 0), torch.isnan(n.float())), (i,),
             ops=["aten.bitwise_not.default"], options=UNFUSED)
    check_op(lambda t: (torch.log2(t), torch.exp2(t), torch.trunc(t), torch.isnan(t)),
             (x.half(),), ops=["aten.log2.default", "aten.exp2.default",
                               "aten.trunc.default", "aten.isnan.default"], **FP16_TOL,
             options=UNFUSED)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("lambd", [0.5, 1.25])
def test_hardshrink_under_its_executorch_name(vk_device, dtype, lambd):
    """torch.export decomposes hardshrink (abs, le, where: those run on Vulkan); ET-VK's
    blobs keep it whole, so it is run from a one-node blob (with the edge values)."""
    from tests.ops.et_graphs import run_et_node

    torch.manual_seed(0)
    x = torch.cat([EDGES, _data(torch.float32, shape=(50,), low=-3, high=3),
                   torch.tensor([lambd, -lambd])]).to(dtype)
    run_et_node(vk_device, "aten.hardshrink.default", [x, lambd], F.hardshrink(x, lambd))


def test_isinf_and_zero_dim_operands_of_another_dtype():
    """isinf on fp32 and fp16 (infinities of both signs, NaN, the fp16 maximum); then
    T5's fp16 overflow clamp: an fp16 tensor clamped to 0-d float32 bounds picked by
    isinf(...).any() is float16 in ATen (the dimensioned operand wins), which the
    zero_dim_operands pass gives an explicit cast so that the clamp runs on Vulkan."""
    edges = torch.tensor([INF, -INF, NAN, 0.0, 65504.0, -65504.0, 1e38, 3.0])
    check_op(lambda t: (torch.isinf(t), torch.isinf(t.half())), (edges,),
             ops=["aten.isinf.default"], options=UNFUSED)

    def t5_clamp(h):
        top = torch.finfo(h.dtype).max
        bound = torch.where(torch.isinf(h).any(), top - 1000, top)
        return torch.clamp(h, min=-bound, max=bound) * 2

    h = (torch.randn(2, 7, 16) * 1e4).half()
    h[0, 1, 2] = INF
    check_op(t5_clamp, (h,), ops=["aten.isinf.default", "aten.clamp.Tensor"],
             options=UNFUSED)
    check_op(t5_clamp, ((torch.randn(2, 7, 16) * 3).half(),),
             ops=["aten.isinf.default", "aten.clamp.Tensor"], options=UNFUSED)
