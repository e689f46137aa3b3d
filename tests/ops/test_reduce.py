"""Reductions on Vulkan against eager: every claimed dtype, any set of dims (negative,
all, none), keepdim both ways, ranks 0..6, size-1 and size-0 dims, NaN, resize."""
import pytest
import torch
from torch.export import Dim

from tests.ops.harness import check_op
from vkdelegate.kernels.rows import THREAD_MAX
from vkdelegate.ops.registry import NodeSpec, TensorSpec, lookup

# fp16 inputs, fp32 accumulation, one rounding to fp16 at the end: eager (which also
# accumulates in fp32 on the CPU) may differ by an fp16 ulp (~1e-3 relative) of the
# result; products of 5 factors compound the inputs' fp16 rounding.
FP16_TOL = dict(rtol=3e-3, atol=3e-3)
FLOATS = [torch.float32, torch.float16]
INTS = [torch.int32, torch.int64]


def _data(dtype, shape):
    if dtype == torch.int32:
        return torch.randint(-50, 50, shape, dtype=dtype)
    if dtype == torch.int64:  # wide, negative too (the device holds int32 values)
        return torch.randint(-2 ** 31 + 1, 2 ** 31 - 1, shape, dtype=dtype)
    return torch.randn(shape).to(dtype)


def _tol(dtype):
    return FP16_TOL if dtype == torch.float16 else {}


# (aten op, function of x, dtypes)
CASES = [
    ("aten.sum.dim_IntList", lambda x: x.sum((0, 2)), FLOATS),
    ("aten.sum.dim_IntList", lambda x: x.sum(-1, keepdim=True), FLOATS),
    ("aten.mean.dim", lambda x: x.mean((-1, -2), keepdim=True), FLOATS),
    ("aten.mean.dim", lambda x: x.mean(1), FLOATS),
    ("aten.mean.default", lambda x: x.mean(), FLOATS),
    ("aten.prod.dim_int", lambda x: x.prod(1), FLOATS),
    ("aten.prod.dim_int", lambda x: x.prod(-1, keepdim=True), [torch.float32]),
    ("aten.prod.default", lambda x: (x[0, :2] * 0.1 + 1).prod(), FLOATS),
    ("aten.amax.default", lambda x: x.amax((0, 2)), FLOATS + INTS),
    ("aten.amax.default", lambda x: x.amax(-1, keepdim=True), [torch.float32]),
    ("aten.amin.default", lambda x: x.amin(1), FLOATS + INTS),
    ("aten.max.default", lambda x: x.max(), FLOATS + INTS),
    ("aten.min.default", lambda x: x.min(), FLOATS + INTS),
    ("aten.var.correction", lambda x: x.var(1), FLOATS),
    ("aten.var.correction", lambda x: x.var((0, 2), correction=0, keepdim=True),
     [torch.float32]),
    ("aten.var.correction", lambda x: x.std(-1, correction=2), [torch.float32]),
    ("aten.argmax.default", lambda x: x.argmax(1), FLOATS + INTS),
    ("aten.argmax.default", lambda x: x.argmax(), [torch.float32]),
    ("aten.argmax.default", lambda x: x.argmax(-1, keepdim=True), [torch.float32]),
    ("aten.argmin.default", lambda x: x.argmin(0), FLOATS + INTS),
    ("aten.argmin.default", lambda x: x.argmin(), INTS),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int32, torch.int64],
                         ids=str)
def test_reduction(dtype):
    """One program per dtype (export and lowering dominate a check's time), outputs
    keyed so that a failure names the case."""
    torch.manual_seed(0)
    cases = [(f"{op[5:]}#{i}", op, fn) for i, (op, fn, dts) in enumerate(CASES)
             if dtype in dts]
    check_op(lambda x: {key: fn(x) for key, _, fn in cases}, (_data(dtype, (5, 3, 7)),),
             ops=sorted({op for _, op, _ in cases}), **_tol(dtype))


@pytest.mark.parametrize("shape,dims", [
    ((), None), ((1,), (0,)), ((29,), (0,)), ((3, 0, 5), (2,)), ((3, 0, 5), (1,)),
    ((2, 3, 1, 5, 1, 3), (1, 3, 5)), ((2, 3, 1, 5, 1, 3), (0, -1)),
])
def test_shapes(shape, dims):
    torch.manual_seed(0)
    x = torch.randn(shape)
    if dims is None:
        fn = lambda t: (t.sum(), t.mean(), t.amax(), t.argmax(), t.var())  # noqa: E731
        ops = ["aten.mean.default", "aten.amax.default", "aten.argmax.default"]
    elif 0 in shape:
        fn = lambda t: (t.sum(dims), t.mean(dims), t.var(dims), t.prod(dims[0]))  # noqa
        ops = ["aten.mean.dim", "aten.var.correction", "aten.prod.dim_int"]
    else:
        fn = lambda t: (t.sum(dims), t.mean(dims, keepdim=True), t.amax(dims),  # noqa
                        t.amin(dims, keepdim=True), t.var(dims))
        ops = ["aten.mean.dim", "aten.amax.default", "aten.amin.default"]
    check_op(fn, (x,), ops=ops)


def test_empty_reduction_rule():
    # torch.export itself refuses argmax over an empty dim; a blob from elsewhere is
    # still refused by the rule (the partitioner and the runtime both apply it).
    spec = lookup("aten.amax.default")
    node = NodeSpec("aten.amax.default", (TensorSpec("float32", (3, 0, 2)), [1], False),
                    (TensorSpec("float32", (3, 2)),))
    assert any("empty dim" in r for r in spec.check(node))
    node = NodeSpec("aten.amax.default", (TensorSpec("float32", (3, 0, 2)), [2], False),
                    (TensorSpec("float32", (3, 0)),))
    assert spec.check(node) == []


def test_nan_and_ties():
    # NaN propagates through amax/amin, argmax/argmin point at the first NaN; ties give
    # the first index; a one-element var with correction 1 is NaN.
    x = torch.tensor([[1.0, 3.0, 3.0, -2.0, -2.0],
                      [1.0, float("nan"), 7.0, float("nan"), 0.0],
                      [0.0, 0.0, 0.0, 0.0, 0.0]])
    check_op(lambda t: (t.amax(1), t.amin(1), t.argmax(1), t.argmin(1), t.mean(1),
                        t[:, :1].var(1), t.var(1)), (x,),
             ops=["aten.amax.default", "aten.amin.default", "aten.argmax.default",
                  "aten.argmin.default", "aten.var.correction"])


@pytest.mark.parametrize("n", [256, THREAD_MAX * 4], ids=["per-invocation", "cooperative"])
def test_var_of_a_large_mean_and_a_small_spread(n):
    """A mean of 1e4 is held in fp32 about 5e-4 off the true mean, as large as a spread
    of 0.01: plain two-pass var was 7e-4 (relative) off eager; the corrected two-pass
    (the deviations' sum taken out) is as close as eager's float64 accumulation."""
    g = torch.Generator().manual_seed(0)
    x = 1e4 + 0.01 * torch.randn(4, n, generator=g)
    ref = x.double().var(-1)
    check_op(lambda t: (t.var(-1), t.std(-1, correction=0)), (x,),
             ops=["aten.var.correction"], rtol=2e-6, atol=0)
    # and eager itself is that close to the exact float64 variance of the same inputs
    assert ((x.var(-1).double() - ref).abs() / ref).max() < 2e-6


def test_resize():
    torch.manual_seed(0)
    n, m = Dim("n", min=1, max=16), Dim("m", min=2, max=40)
    check_op(lambda t: (t.mean((-1, -2), keepdim=True), t.argmax(2), t.var(1),
                        t.amax(0)),
             (torch.randn(2, 13, 29),), ops=["aten.mean.dim", "aten.argmax.default"],
             dynamic_shapes=({1: n, 2: m},),
             resize_inputs=[(torch.randn(2, 1, 3),), (torch.randn(2, 16, 40),)])


def test_int64_extrema_negative_and_resize():
    """int64 max/min/amax/amin/argmax/argmin (int32 on the device) equal eager, all
    values negative (so an identity of 0 would show) and at int32's ends, through a
    resize; and the LongRoPE position pattern ``torch.max(position_ids) + 1``."""
    n = Dim("n", min=1, max=64)
    x = -torch.arange(1, 4 * 37 + 1, dtype=torch.int64).reshape(4, 37)[:, torch.randperm(37)]
    x[1, 5], x[2, 9] = -2 ** 31 + 1, 2 ** 31 - 2  # (+ 1: still within int32)
    check_op(lambda t: (t.max(), t.min(), t.amax(1), t.amin((0, 1), keepdim=True),
                        t.argmax(1), t.argmin(), torch.max(t) + 1),
             (x.contiguous(),),
             ops=["aten.max.default", "aten.min.default", "aten.amax.default",
                  "aten.amin.default", "aten.argmax.default", "aten.argmin.default"],
             dynamic_shapes=({1: n},),
             resize_inputs=[(-torch.arange(4, dtype=torch.int64).reshape(4, 1) - 7,),
                            (torch.randint(-10 ** 9, 10 ** 9, (4, 64)),)])


def test_argmax_of_large_int64_range_output():
    # int64 indices come back as int64 even though the device holds int32.
    torch.manual_seed(0)
    check_op(lambda t: t.argmax(0), (torch.randn(1000, 3),), ops=["aten.argmax.default"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int32], ids=str)
def test_max_min_dim(dtype):
    torch.manual_seed(0)
    x = torch.randint(-5, 5, (5, 3, 7)).to(dtype)  # small integers: ties
    # tuple(): the lowered program's outputs cannot be torch.return_types containers.
    check_op(lambda t: (tuple(torch.max(t, 1)), tuple(torch.min(t, -1, keepdim=True)),
                        t.max(0).values, t.min(2).indices),
             (x,), ops=["aten.max.dim", "aten.min.dim"])


def test_max_dim_nan_and_resize():
    nan = float("nan")
    x = torch.tensor([[1.0, nan, 3.0, nan], [2.0, 2.0, -1.0, 0.0], [0.0, 5.0, 5.0, 1.0]])
    n = Dim("n", min=1, max=8)
    check_op(lambda t: (tuple(torch.max(t, 1)), tuple(torch.min(t, 1))), (x,),
             ops=["aten.max.dim", "aten.min.dim"], dynamic_shapes=({1: n},),
             resize_inputs=[(x[:, :1].contiguous(),), (torch.randn(3, 8),)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int32, torch.bool],
                         ids=str)
def test_any_all(dtype):
    torch.manual_seed(0)
    x = (torch.rand(5, 3, 7) < 0.15).to(dtype)  # sparse: some all-false rows
    if dtype == torch.float32:
        x[0, 0, 0] = float("nan")  # NaN is true
    check_op(lambda t: {"dim": t.any(1), "dims": t.any((0, 2), keepdim=True),
                        "all": t.any(), "all_dim": t.all(-1), "all_all": t.all(),
                        "empty": t[:, :0].any(1)},
             (x,), ops=["aten.any.dim", "aten.any.dims", "aten.any.default"])


def test_consecutive_dims_take_the_run_form(monkeypatch):
    """Reductions over consecutive dims (kernels/dims.run_defines) index the input as
    base + r * stride (REDUCED_RUN) instead of a division per dim and element; every
    other set of dims keeps the general index. Values against eager for runs with
    stride 1 (inner dims) and stride > 1 (a middle dim, the outer two), the cooperative
    form (a long row), the general form (dims 0 and 2), the three shaders that share
    reduced_dims.h, and a resize."""
    from tests.ops.harness import spy_dispatches
    seen = spy_dispatches(monkeypatch, lambda shader, d: (shader, "REDUCED_RUN" in d))
    torch.manual_seed(0)
    x, long_rows = torch.randn(4, 6, 5, 7), torch.randn(3, THREAD_MAX // 2 + 1, 2)
    check_op(lambda t, y: {"hw": t.mean((-1, -2)), "c": t.amax(1), "nc": t.sum((0, 1)),
                           "gap": t.var((1, 3)), "all": t.mean(), "row": t.sum(3),
                           "norm": torch.linalg.vector_norm(t, 2, (2, 3)),
                           "long": y.mean((1, 2))},
             (x, long_rows), dynamic_shapes=({0: Dim("b", min=1, max=8)}, None),
             resize_inputs=(torch.randn(3, 6, 5, 7), long_rows),
             ops=["aten.mean.dim", "aten.amax.default", "aten.sum.dim_IntList",
                  "aten.var.correction", "aten.linalg_vector_norm.default"])
    runs = {shader: [] for shader, _ in seen}
    for shader, run in seen:
        runs[shader].append(run)
    # mean (hw, all, long: past THREAD_MAX elements, so one workgroup per output), amax
    # (c) and var (gap: dims 1 and 3, not consecutive).
    assert sorted(runs["reduce"]) == [False, True, True, True, True], runs
    assert runs["reduce_sum"] == [True, True], runs  # nc, row
    assert runs["vector_norm"] == [True], runs
