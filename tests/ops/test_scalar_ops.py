"""The small ops of attention and masking graphs on Vulkan against eager: the .Scalar
overloads of add/sub/mul/div, int64 operands (arange positions, causal masks, position
ids), scalar_tensor, erfinv and cumsum, in every claimed dtype, with broadcasting, 0-d
tensors and edge values."""
import operator

import pytest
import torch

from tests.ops.harness import check_op

aten = torch.ops.aten
# fp16 results are computed in fp32 and rounded once; eager's may differ by one fp16
# ulp (2**-10 relative).
FP16_TOL = dict(rtol=2e-3, atol=2e-3)
F32, F16, I32, I64, I8, U8, B = (torch.float32, torch.float16, torch.int32, torch.int64,
                                 torch.int8, torch.uint8, torch.bool)
ALL = [F32, F16, I32, I64, I8, U8, B]


def _data(dtype, shape, low=-8, high=8):
    if dtype == B:
        return torch.rand(shape) > 0.5
    if dtype == U8:
        return torch.randint(0, 255, shape, dtype=dtype)
    if dtype in (I32, I64, I8):
        return torch.randint(low, high, shape, dtype=dtype)
    return (torch.rand(shape) * (high - low) + low).to(dtype)


def _tol(dtype):
    return FP16_TOL if dtype == F16 else {}


def _nonzero(t):
    return torch.where(t == 0, torch.ones_like(t), t)


# (aten op, function of x, dtypes); a bool or integer self with a float scalar gives
# float32 (ATen's wrapped-number promotion), an int scalar keeps an integer dtype.
SCALAR_CASES = [
    ("aten.add.Scalar", lambda x: aten.add.Scalar(x, 3), [F32, F16, I32, I64, I8, U8]),
    ("aten.add.Scalar", lambda x: aten.add.Scalar(x, 0.5, alpha=3), [F32, F16, I32, B]),
    ("aten.sub.Scalar", lambda x: aten.sub.Scalar(x, 2), [F32, F16, I32, I64, I8, U8]),
    ("aten.sub.Scalar", lambda x: aten.sub.Scalar(x, -1.5, alpha=2), [F32, I64]),
    ("aten.mul.Scalar", lambda x: aten.mul.Scalar(x, 3), [F32, F16, I32, I64, I8, U8]),
    ("aten.mul.Scalar", lambda x: aten.mul.Scalar(x, 0.125), [F32, F16, I32, B]),
    ("aten.div.Scalar", lambda x: aten.div.Scalar(x, 3), [F32, F16, I32, I64]),
    ("aten.div.Scalar", lambda x: aten.div.Scalar(x, -0.3), [F32, F16]),
]


def _batch(cases, dtype):
    chosen = [(f"{op[5:]}#{i}", op, fn) for i, (op, fn, dts) in enumerate(cases)
              if dtype in dts]
    return (lambda *a: {k: fn(*a) for k, _, fn in chosen}), sorted({op for _, op, _ in chosen})


@pytest.mark.parametrize("dtype", ALL, ids=str)
def test_scalar_overloads(dtype):
    torch.manual_seed(0)
    fn, ops = _batch(SCALAR_CASES, dtype)
    check_op(fn, (_data(dtype, (5, 7), -4, 4),), ops=ops, **_tol(dtype))


def test_scalar_overloads_0d_and_fp16_scale():
    # A 0-d self; an fp16 tensor scaled by a Python float uses the float's fp32 value
    # (ATen's opmath for mul/div), as the SDPA scale 1/sqrt(E) does.
    torch.manual_seed(0)
    check_op(lambda x, h: (aten.mul.Scalar(x, 2.5), aten.div.Scalar(x, 7),
                           aten.mul.Scalar(h, 0.35355339059327373),
                           aten.div.Scalar(h, 2.8284271247461903)),
             (torch.tensor(1.5), torch.randn(4, 8).half() * 100),
             ops=["aten.mul.Scalar", "aten.div.Scalar"], **FP16_TOL)


INT64_TENSOR_CASES = [
    ("aten.add.Tensor", torch.add), ("aten.sub.Tensor", lambda x, y: torch.sub(x, y, alpha=2)),
    ("aten.mul.Tensor", torch.mul), ("aten.div.Tensor", lambda x, y: x / _nonzero(y)),
    ("aten.div.Tensor_mode", lambda x, y: torch.div(x, _nonzero(y), rounding_mode="floor")),
    ("aten.div.Tensor_mode", lambda x, y: torch.div(x, _nonzero(y), rounding_mode="trunc")),
    ("aten.minimum.default", torch.minimum), ("aten.maximum.default", torch.maximum),
    ("aten.logical_and.default", torch.logical_and),
    ("aten.logical_or.default", torch.logical_or),
    ("aten.logical_xor.default", torch.logical_xor),
] + [(f"aten.{n}.Tensor", getattr(operator, n)) for n in ("eq", "ne", "lt", "le", "gt", "ge")]


def test_int64_tensor_operands():
    # int64 (held in int32 on the device) with broadcasting, and with int32 / float /
    # bool operands of other categories.
    torch.manual_seed(0)
    x, y = _data(I64, (3, 1, 5)), _data(I64, (7, 1))
    cases = [(f"{op[5:]}#{i}", fn) for i, (op, fn) in enumerate(INT64_TENSOR_CASES)]
    check_op(lambda a, b, f, m: dict({k: fn(a, b) for k, fn in cases},
                                     float=a * f, bool=a + m, scalar=(a - 3, a * 2, a // 3)),
             (x, y, torch.randn(5), torch.rand(5) > 0.5),
             ops=sorted({op for op, _ in INT64_TENSOR_CASES}))


def test_int64_scalar_comparisons():
    torch.manual_seed(0)
    x = _data(I64, (4, 6), -3, 3)
    check_op(lambda a: [f(a, 0) for f in (operator.eq, operator.ne, operator.lt, operator.le,
                                          operator.gt, operator.ge)] + [a > 0.5],
             (x,), ops=[f"aten.{n}.Scalar" for n in ("eq", "ne", "lt", "le", "gt", "ge")])


def test_int64_beyond_int32_stays_on_cpu():
    x = _data(I64, (3,))
    with pytest.raises(AssertionError, match="int32 range"):
        check_op(lambda a: a + 2 ** 40, (x,), ops=["aten.add.Tensor"])


@pytest.mark.parametrize("dtype", ALL, ids=str)
def test_scalar_tensor(dtype):
    value = {F32: -3.75, F16: 0.1, I32: -7, I64: 2 ** 31 - 1, I8: -128, U8: 200, B: True}[dtype]
    check_op(lambda x: (aten.scalar_tensor.default(value, dtype=dtype),
                        torch.where(x > 0, x, aten.scalar_tensor.default(value, dtype=x.dtype)
                                    if dtype in (F32, F16) else x)),
             (torch.randn(3, 4).to(dtype if dtype in (F32, F16) else F32),),
             ops=["aten.scalar_tensor.default"])


def test_scalar_tensor_infinities():
    check_op(lambda m: torch.where(m, aten.scalar_tensor.default(float("-inf")),
                                   aten.scalar_tensor.default(0.0)),
             (torch.rand(4, 4) > 0.5,), ops=["aten.scalar_tensor.default", "aten.where.self"])


def test_erfinv():
    x = torch.cat([torch.linspace(-0.9999, 0.9999, 401), torch.tensor(
        [0.0, -0.0, 1e-7, -1e-4, 0.5, 0.999999, 1.0, -1.0, 1.5, -2.0, float("nan")])])
    check_op(torch.erfinv, (x,), ops=["aten.erfinv.default"], rtol=2e-5, atol=1e-6)
    check_op(torch.erfinv, (torch.linspace(-0.999, 0.999, 301).half(),),
             ops=["aten.erfinv.default"], **FP16_TOL)


@pytest.mark.parametrize("dtype", [F32, F16], ids=str)
def test_gelu_exact(dtype):
    # approximate='none' is x * Phi(x) through erf.
    check_op(lambda x: (torch.nn.functional.gelu(x), torch.erf(x)),
             (torch.linspace(-6, 6, 97).to(dtype),), ops=["aten.gelu.default", "aten.erf.default"],
             **_tol(dtype))


@pytest.mark.parametrize("dtype", ALL, ids=str)
def test_cumsum_every_dim(dtype):
    torch.manual_seed(0)
    x = _data(dtype, (3, 4, 37), -4, 4)
    # Eager's int/bool result is int64; float sums accumulate in fp32 (fp16 included).
    check_op(lambda a: [a.cumsum(d) for d in (0, 1, 2, -1)], (x,),
             ops=["aten.cumsum.default"], **({"rtol": 2e-3, "atol": 1e-2} if dtype == F16 else {}))


def test_cumsum_dtype_argument_0d_and_position_ids():
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.int32)
    check_op(lambda m, x, s: {
        # RoBERTa's create_position_ids_from_input_ids: int32 mask, int64 cumsum.
        "pos": (torch.cumsum(m, dim=1).type_as(m) * m).long() + 1,
        "to_f32": torch.cumsum(x, 0, dtype=torch.float32),
        "int_to_f32": torch.cumsum(m, 1, dtype=torch.float32),
        "to_i32": torch.cumsum(m, 0, dtype=torch.int32), "zero_d": s.cumsum(0)},
        (mask, torch.randn(6, 3).half(), torch.tensor(2.5)), ops=["aten.cumsum.default"],
        rtol=1e-3, atol=1e-3)


def test_cumsum_refusals():
    with pytest.raises(AssertionError, match="integer result"):
        check_op(lambda a: torch.cumsum(a, 0, dtype=torch.int32), (torch.randn(4),),
                 ops=["aten.cumsum.default"])


def test_float16_with_float32_gives_float32():
    # A decomposed fp16 attention adds fp32 scores and an fp16 mask (ATen: float32).
    torch.manual_seed(0)
    x, h = torch.randn(3, 1, 5), torch.randn(7, 1).half()
    m = torch.rand(3, 1, 5) > 0.5
    check_op(lambda a, b, c: (a + b, b * a, b - a, a / b, torch.maximum(b, a), a < b,
                              torch.where(c, a, b), torch.where(c, b, a),
                              torch.clamp(a, min=b)),
             (x, h, m), ops=["aten.add.Tensor", "aten.mul.Tensor", "aten.sub.Tensor",
                             "aten.div.Tensor", "aten.maximum.default", "aten.lt.Tensor",
                             "aten.where.self", "aten.clamp.Tensor"])


def test_float16_tensor_with_0d_float32_stays_on_cpu():
    # ATen: a dimensioned float16 tensor wins over a 0-d float32 one (float16 result),
    # which the device's promotion does not model: the node stays on the CPU.
    with pytest.raises(AssertionError, match="expected float32"):
        check_op(torch.add, (torch.randn(4).half(), torch.tensor(1.5)),
                 ops=["aten.add.Tensor"])


def test_where_int64():
    # Position ids masked to a padding index; int64 with a bool or float branch.
    torch.manual_seed(0)
    pos, m = _data(I64, (2, 7), 0, 50), torch.rand(2, 7) > 0.5
    check_op(lambda p, c: (torch.where(c, p, 1), torch.where(c, p, c),
                           torch.where(c, p, torch.ones(7) * 0.5)),
             (pos, m), ops=["aten.where.self"])
