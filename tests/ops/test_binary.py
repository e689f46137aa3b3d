"""Elementwise binary ops on Vulkan against eager: every claimed dtype, broadcasting on
every axis, Python-scalar operands (both overload styles), alpha, all rounding modes,
integer semantics (wrapping, trunc/floor division of negatives), NaN, resize."""
import operator

import pytest
import torch
from torch.export import Dim

from tests.ops.harness import check_op

# fp16 operands: computed in fp32 and rounded once to fp16, eager rounds the same way
# but pow/div results may still differ by one fp16 ulp (~1e-3 relative).
FP16_TOL = dict(rtol=2e-3, atol=2e-3)
NAN = float("nan")


def _data(dtype, shape, low=-8, high=8):
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    if dtype == torch.uint8:
        return torch.randint(0, 255, shape, dtype=dtype)
    if dtype in (torch.int32, torch.int8, torch.int64):
        return torch.randint(low, high, shape, dtype=dtype)
    return (torch.rand(shape) * (high - low) + low).to(dtype)


def _tol(dtype):
    return FP16_TOL if dtype == torch.float16 else {}


def _nonzero(t):
    """Divisors: no zeros (integer division by zero raises in eager)."""
    return torch.where(t == 0, torch.ones_like(t), t)


F32, F16, I32, I8, U8, B = (torch.float32, torch.float16, torch.int32, torch.int8,
                            torch.uint8, torch.bool)
ARITH = [F32, F16, I32, I8, U8]  # and bool: test_promotion_across_categories
NUMERIC = [F32, F16, I32]

# (aten op, function of (x, y), dtypes)
TENSOR_CASES = [
    ("aten.add.Tensor", torch.add, ARITH),
    ("aten.add.Tensor", lambda x, y: torch.add(x, y, alpha=3), [F32, I32]),
    ("aten.sub.Tensor", torch.sub, ARITH),
    ("aten.sub.Tensor", lambda x, y: torch.sub(x, y, alpha=-2), [F32, I8]),
    ("aten.mul.Tensor", torch.mul, ARITH),
    ("aten.div.Tensor", lambda x, y: x / _nonzero(y), NUMERIC),
    ("aten.div.Tensor_mode", lambda x, y: torch.div(x, _nonzero(y), rounding_mode="trunc"),
     NUMERIC),
    ("aten.div.Tensor_mode", lambda x, y: torch.div(x, _nonzero(y), rounding_mode="floor"),
     NUMERIC),
    ("aten.pow.Tensor_Tensor", lambda x, y: torch.pow(x, y.abs() % 4), NUMERIC),
    ("aten.minimum.default", torch.minimum, NUMERIC),
    ("aten.maximum.default", torch.maximum, NUMERIC),
    ("aten.logical_and.default", torch.logical_and, [F32, F16, I32, B]),
    ("aten.logical_or.default", torch.logical_or, [F32, F16, I32, B]),
    ("aten.logical_xor.default", torch.logical_xor, [F32, F16, I32, B]),
    ("aten.bitwise_and.Tensor", operator.and_, [I32, B]),
    ("aten.bitwise_or.Tensor", operator.or_, [I32, B]),
    ("aten.bitwise_xor.Tensor", operator.xor, [I32, B]),
] + [(f"aten.{name}.Tensor", getattr(operator, name), [F32, F16, I32, B])
     for name in ("eq", "ne", "lt", "le", "gt", "ge")]


def _batch(cases, dtype):
    """One program per dtype (export and lowering dominate a check's time): a dict of
    every case claiming ``dtype``, keyed so that a failure names the case."""
    chosen = [(f"{op[5:]}#{i}", op, fn) for i, (op, fn, dts) in enumerate(cases)
              if dtype in dts]
    ops = sorted({op for _, op, _ in chosen})
    return (lambda *args: {key: fn(*args) for key, _, fn in chosen}), ops


@pytest.mark.parametrize("dtype", [F32, F16, I32, I8, U8, B], ids=str)
def test_tensor_operands(dtype):
    torch.manual_seed(0)
    # Broadcasting on several axes at once; small integers give equal pairs too.
    x, y = _data(dtype, (3, 1, 5)), _data(dtype, (7, 1))
    fn, ops = _batch(TENSOR_CASES, dtype)
    check_op(fn, (x, y), ops=ops, **_tol(dtype))


# (aten op, function of x, dtypes): the exported overload takes a Python scalar.
SCALAR_CASES = [
    ("aten.add.Tensor", lambda x: x + 2, ARITH),
    ("aten.add.Tensor", lambda x: x + 0.5, [F32, F16, I32, U8]),  # int + float -> float
    ("aten.sub.Tensor", lambda x: x - 3, [F32, I32]),
    ("aten.mul.Tensor", lambda x: x * 3, [F32, F16, I32, I8]),
    ("aten.mul.Tensor", lambda x: x * 0.1, [F16, I32]),
    ("aten.div.Tensor", lambda x: x / 3, [F32, F16, I32]),
    ("aten.div.Tensor_mode", lambda x: x // 3, [F32, I32]),
    ("aten.div.Tensor_mode", lambda x: torch.div(x, -3, rounding_mode="trunc"), [F32, I32]),
    ("aten.div.Tensor_mode", lambda x: torch.div(x, 0.1, rounding_mode="floor"), [F32]),
    ("aten.div.Tensor_mode", lambda x: torch.div(x, 2, rounding_mode=None), [I32]),
    ("aten.pow.Tensor_Scalar", lambda x: x ** 2, NUMERIC),
    ("aten.pow.Tensor_Scalar", lambda x: x ** 3, [F32, F16, I32]),
    ("aten.pow.Tensor_Scalar", lambda x: x.abs() ** 0.5, [F32, F16]),
    ("aten.pow.Tensor_Scalar", lambda x: x ** -1, [F32]),
    ("aten.pow.Scalar", lambda x: 2 ** x, [F32, F16]),
    ("aten.pow.Scalar", lambda x: 2.5 ** x, [I32]),
    ("aten.pow.Scalar", lambda x: 3 ** x.abs(), [I32]),
] + [(f"aten.{name}.Scalar", lambda x, f=getattr(operator, name): f(x, 1), [F32, F16, I32])
     for name in ("eq", "ne", "lt", "le", "gt", "ge")] + [
    ("aten.gt.Scalar", lambda x: x > 0.5, [I32, F16]),
    ("aten.eq.Scalar", lambda x: x == 1, [B]),
    ("aten.ne.Scalar", lambda x: x != 0, [B]),
    ("aten.le.Scalar", lambda x: x <= 0, [B]),
]


@pytest.mark.parametrize("dtype", [F32, F16, I32, I8, U8, B], ids=str)
def test_scalar_operand(dtype):
    torch.manual_seed(0)
    fn, ops = _batch(SCALAR_CASES, dtype)
    check_op(fn, (_data(dtype, (5, 7), -4, 4),), ops=ops, **_tol(dtype))


@pytest.mark.parametrize("shape_a,shape_b", [
    ((), (3, 5)), ((2, 3, 5, 7, 1, 3), (1, 3, 1, 7, 11, 1)), ((7, 1, 1), (1, 5, 1)),
    ((1, 29), (3, 1)), ((0, 3), (1, 3)), ((2, 1, 4), ()), ((4, 1), (4, 0)),
])
def test_broadcasting(shape_a, shape_b):
    torch.manual_seed(0)
    x, y = torch.randn(shape_a), torch.randn(shape_b)
    check_op(lambda a, b: (a * b, a - b, torch.maximum(a, b), a < b), (x, y),
             ops=["aten.mul.Tensor", "aten.sub.Tensor", "aten.maximum.default",
                  "aten.lt.Tensor"])


def test_integer_semantics():
    # Wrapping, C-style trunc and Python-style floor division of negatives, integer pow
    # with negative exponents (0 unless |base| == 1), int8 wrapping.
    # (INT32_MIN / -1 is left out: it traps in eager, SIGFPE on x86.)
    a = torch.tensor([7, -7, 7, -7, 2 ** 31 - 1, -(2 ** 31), 1, -1, 0, 5], dtype=torch.int32)
    b = torch.tensor([2, 2, -2, -2, 1, 3, -3, -3, 3, -1], dtype=torch.int32)
    check_op(lambda x, y: (x + y, x - y, x * y,
                           torch.div(x, y, rounding_mode="trunc"),
                           torch.div(x, y, rounding_mode="floor"), x / y,
                           torch.pow(x, y), x * 3 // 4),
             (a, b), ops=["aten.add.Tensor", "aten.div.Tensor_mode", "aten.pow.Tensor_Tensor"])
    i8 = torch.tensor([100, -100, 127, -128, 3], dtype=torch.int8)
    check_op(lambda x: (x + x, x * 3, x - 100), (i8,), ops=["aten.mul.Tensor"])


def test_float_edges():
    # NaN through minimum/maximum/comparisons, pow outside GLSL's domain, division by
    # zero, floor division of negatives.
    a = torch.tensor([NAN, 1.0, -2.0, 0.0, -0.0, 0.0, -8.0, 2.0, 7.0, -7.0, 1.0, -1.5])
    b = torch.tensor([1.0, NAN, 3.0, 0.0, 2.0, -1.0, 1 / 3, 0.5, -2.0, 2.0, NAN, 2.0])
    check_op(lambda x, y: (torch.minimum(x, y), torch.maximum(x, y), x == y, x != y,
                           x < y, x >= y, torch.pow(x, y), x / y,
                           torch.div(x, y, rounding_mode="floor"),
                           torch.div(x, y, rounding_mode="trunc"),
                           torch.logical_and(x, y)),
             (a, b), ops=["aten.minimum.default", "aten.pow.Tensor_Tensor",
                          "aten.div.Tensor_mode"])


def test_promotion_across_categories():
    # Masks and integer tensors mixed with float tensors (ATen: the float dtype wins),
    # bool with bool (logical), int32 with bool.
    torch.manual_seed(0)
    x, y = torch.randn(5, 3), torch.randn(3)
    i = torch.randint(-3, 3, (5, 3), dtype=torch.int32)
    m = torch.rand(3) > 0.5
    check_op(lambda a, b, n, k: {
        "mask": torch.add(a, b, alpha=0.25) * (a > 0), "add_mask": k + a, "sub_int": a - n,
        "int_float": a * n, "div": n / a, "lt": n < a, "int_bool": n + k,
        "bool_bool": (k + k, k * k), "max": torch.maximum(n, b)},
        (x, y, i, m), ops=["aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor",
                           "aten.div.Tensor", "aten.lt.Tensor", "aten.maximum.default"])


def test_mixed_dtypes_within_a_category_stay_on_cpu():
    # float16 with float32 runs (float32 result: test_scalar_ops.py); integers do not.
    x, y = torch.randint(-9, 9, (3,), dtype=torch.int32), torch.randint(-9, 9, (3,),
                                                                        dtype=torch.int8)
    with pytest.raises(AssertionError, match="within one category"):
        check_op(torch.add, (x, y), ops=["aten.add.Tensor"])


def test_resize():
    torch.manual_seed(0)
    n = Dim("n", min=1, max=32)
    check_op(lambda a, b: (a + b, a // 2, torch.pow(a, 2), a == b), (torch.randn(4, 29),
                                                                      torch.randn(1, 29)),
             ops=["aten.add.Tensor", "aten.div.Tensor_mode", "aten.eq.Tensor"],
             dynamic_shapes=({1: n}, {1: n}),
             resize_inputs=[(torch.randn(4, 1), torch.randn(1, 1)),
                            (torch.randn(4, 32), torch.randn(1, 32))])


def test_plan_refusals():
    # Partition-time reasons for what the device cannot do exactly (torch-free rules).
    from vkdelegate.ops.families.binary import BINARY_OPS, plan
    add, eq = BINARY_OPS["aten.add.Tensor"], BINARY_OPS["aten.eq.Scalar"]
    assert plan(add, "int32", 2 ** 40, "int32") == \
        "scalar operand [1099511627776] outside the int32 range of the device"
    assert "within one category" in plan(add, "int8", "int32", "int32")
    assert isinstance(plan(add, "bool", 1, "int64"), str)  # int64 result: stays on CPU
    assert plan(add, "int32", 0.5, "float32") == ("float32", "float32")
    assert plan(eq, "float16", 0.1, "bool") == ("float32", "float16")
    assert plan(eq, "int32", 1, "bool") == ("int32", "int32")


@pytest.mark.parametrize("dtype", [F32, F16, I32, torch.int64], ids=str)
def test_remainder_fmod(dtype):
    """int64 (in int32 on the device): torch.roll's decomposition (torchvision Swin's
    shifted windows) takes (arange + shift) % n."""
    torch.manual_seed(0)
    x, y = _data(dtype, (5, 7), -20, 20), _nonzero(_data(dtype, (7,), -6, 6))
    check_op(lambda a, b: {"rem": torch.remainder(a, b), "mod": a % 3, "mod_neg": a % -3,
                           "fmod": torch.fmod(a, b), "fmod_s": torch.fmod(a, -4)},
             (x, y), ops=["aten.remainder.Tensor", "aten.remainder.Scalar",
                          "aten.fmod.Tensor", "aten.fmod.Scalar"], **_tol(dtype))


def test_fp16_with_python_float_is_exact():
    # ATen keeps the scalar in fp32 for mul/div and rounds it to fp16 for the others;
    # either way one fp32 operation and one rounding: results must match bit for bit.
    torch.manual_seed(0)
    h = (torch.randn(4000) * 4).half()
    check_op(lambda x: {"add": x + 0.1, "sub": x - 0.3337, "mul": x * 0.1,
                        "div": x / 0.3337, "floordiv": x // 0.1,
                        "trunc": torch.div(x, 2.7183, rounding_mode="trunc"),
                        "gt": x > 2.7183, "eq": x == 0.1, "rem": x % 2.7183,
                        "pow": x.abs() ** 0.3337},
             (h,), ops=["aten.mul.Tensor", "aten.div.Tensor", "aten.div.Tensor_mode"],
             rtol=0, atol=0)
