"""The GLSL expressions of the elementwise unary and binary ops, one entry per ATen op.

Read by their op families (ops/families/unary.py registers ``UNARY_OPS`` on
unary_op.glsl, ops/families/binary.py ``BINARY_OPS`` on binary_op.glsl; their module
docstrings give the semantics) and by the fused elementwise chains
(kernels/elementwise_chain.py), which compose the same expressions in one shader, so
that an op's edge cases are written once. Torch-free; registers no op.

Unary expressions are in ``x`` (of type ACC_T: float for float dtypes, computed in
fp32, int for integer dtypes) with the scalar parameters ``P0..P3``; binary ones in
``a``, ``b`` (and ``ALPHA`` for add/sub). Helpers (KEEP_NAN, min_nan, erf_approx, ...)
are elementwise_math.h's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

FLOATS = frozenset({"float32", "float16"})
#: unary ops on numbers (binary ops: NUMERIC, WIDE below)
UNARY_NUMERIC = FLOATS | {"int32", "int8"}
#: int64 (held in int32 on the device, runtime/dtypes.py; exact while values stay in
#: the int32 range, as the binary ops) for the sign ops of position math: T5's relative
#: position buckets and ModernBERT's window take abs of a position difference.
SIGNED_POSITIONS = FLOATS | {"int32", "int64"}
INT32_MIN, INT32_MAX = -(2 ** 31), 2 ** 31 - 1


@dataclass(frozen=True)
class Unary:
    """expr: GLSL expression, or {value of the first scalar argument: expression}, or
    with ``by_dtype`` {input dtype: expression}.
    params: scalar arguments -> up to 4 numbers for P0..P3 (None: no parameters).
    out_bool: the output is bool whatever the input dtype."""

    expr: "str | dict"
    dtypes: frozenset
    params: Optional[Callable[[list, bool], tuple]] = None
    out_bool: bool = False
    by_dtype: bool = False
    notes: str = "elementwise"


def _bounds(lo, hi, is_float: bool) -> tuple:
    """clamp's optional bounds, absent ones replaced by the dtype's extremes."""
    if is_float:
        return (float("-inf") if lo is None else lo, float("inf") if hi is None else hi)
    clip = lambda v: max(INT32_MIN, min(INT32_MAX, int(v)))  # noqa: E731
    return (INT32_MIN if lo is None else clip(lo), INT32_MAX if hi is None else clip(hi))


_GELU_TANH = ("0.5 * x * (1.0 + tanh(clamp(0.7978845608028654 * (x + 0.044715 * x * x * x),"
              " -15.0, 15.0)))")

#: aten name -> Unary
UNARY_OPS = {
    "aten.relu.default": Unary("KEEP_NAN(x, max(x, ACC_T(0)))", UNARY_NUMERIC | {"uint8"}),
    "aten.hardtanh.default": Unary("KEEP_NAN(x, min_nan(max_nan(x, P0), P1))", FLOATS,
                                   params=lambda s, f: (s[0], s[1]),
                                   notes="relu6 exports as hardtanh(x, 0, 6)"),
    "aten.hardswish.default": Unary(
        "KEEP_NAN(x, x == -INF_F ? NAN_F : x * min(max(x + 3.0, 0.0), 6.0) / 6.0)", FLOATS,
        notes="x * relu6(x + 3) / 6 as ATen (NaN at -inf); ET-VK keeps it whole"),
    "aten.clamp.default": Unary("KEEP_NAN(x, min_nan(max_nan(x, P0), P1))",
                                SIGNED_POSITIONS,
                                params=lambda s, f: _bounds(s[0], s[1], f),
                                notes="either bound may be None"),
    "aten.leaky_relu.default": Unary("x > 0.0 ? x : x * P0", FLOATS,
                                     params=lambda s, f: (s[0],)),
    "aten.elu.default": Unary("x > 0.0 ? P1 * x : P1 * P0 * expm1_accurate(x * P2)", FLOATS,
                              params=lambda s, f: (s[0], s[1], s[2]),
                              notes="alpha, scale, input_scale"),
    "aten.gelu.default": Unary(
        {"none": "0.5 * x * (1.0 + erf_approx(x * 0.7071067811865476))",
         "tanh": _GELU_TANH}, FLOATS, notes="approximate='none' (erf) and 'tanh'"),
    "aten.neg.default": Unary("-x", UNARY_NUMERIC | SIGNED_POSITIONS),
    "aten.abs.default": Unary("abs(x)", UNARY_NUMERIC | SIGNED_POSITIONS),
    "aten.sign.default": Unary("ACC_T(x > ACC_T(0)) - ACC_T(x < ACC_T(0))",
                               SIGNED_POSITIONS),
    "aten.sigmoid.default": Unary("1.0 / (1.0 + exp(-x))", FLOATS),
    "aten.tanh.default": Unary("KEEP_NAN(x, tanh(clamp(x, -15.0, 15.0)))", FLOATS),
    "aten.exp.default": Unary("exp(x)", FLOATS),
    "aten.log.default": Unary("log_edges(x)", FLOATS),
    "aten.log2.default": Unary("x < 0.0 ? NAN_F : (x == 0.0 ? -INF_F : log2(x))", FLOATS),
    "aten.log10.default": Unary(
        "x < 0.0 ? NAN_F : (x == 0.0 ? -INF_F : log2(x) * 0.30102999566398120)", FLOATS),
    "aten.hardshrink.default": Unary("(x >= -P0 && x <= P0) ? 0.0 : x", FLOATS,
                                     params=lambda s, f: (s[0],),
                                     notes="0 where |x| <= lambd, x elsewhere (NaN kept)"),
    "aten.log1p.default": Unary("log1p_accurate(x)", FLOATS,
                                notes="accurate near 0 (softplus, mish)"),
    "aten.expm1.default": Unary("expm1_accurate(x)", FLOATS, notes="accurate near 0"),
    "aten.exp2.default": Unary("exp2(x)", FLOATS),
    "aten.sqrt.default": Unary("x < 0.0 ? NAN_F : sqrt(x)", FLOATS),
    "aten.rsqrt.default": Unary("x < 0.0 ? NAN_F : recip_edges(sqrt(x))", FLOATS),
    "aten.reciprocal.default": Unary("recip_edges(x)", FLOATS),
    "aten.erf.default": Unary("erf_approx(x)", FLOATS),
    "aten.erfinv.default": Unary("erfinv_approx(x)", FLOATS,
                                 notes="+-1 give +-inf, |x| > 1 NaN"),
    "aten.sin.default": Unary("sin(x)", FLOATS),
    "aten.cos.default": Unary("cos(x)", FLOATS),
    "aten.round.default": Unary("roundEven(x)", FLOATS, notes="half to even, as torch"),
    "aten.floor.default": Unary("floor(x)", FLOATS),
    "aten.ceil.default": Unary("ceil(x)", FLOATS),
    "aten.trunc.default": Unary("trunc(x)", FLOATS),
    "aten.isnan.default": Unary("isnan(x)", FLOATS, out_bool=True, notes="bool output"),
    "aten.isinf.default": Unary("isinf(x)", FLOATS, out_bool=True,
                                notes="bool output (T5's fp16 overflow clamp)"),
    "aten.bitwise_not.default": Unary({"int32": "~x", "bool": "x == 0"},
                                      frozenset({"int32", "bool"}), by_dtype=True,
                                      notes="~ on int32 and bool tensors"),
    "aten.logical_not.default": Unary("x == ACC_T(0)", UNARY_NUMERIC | {"bool"}, out_bool=True,
                                      notes="any input dtype, bool output"),
}


ARITH = FLOATS | {"int32", "int64", "int8", "uint8", "bool"}
NUMERIC = FLOATS | {"int32"}
WIDE = NUMERIC | {"int64"}  # ops exact on int64 values within the int32 range
WITH_BOOL = WIDE | {"bool"}
INT_BOOL = frozenset({"int32", "bool"})


@dataclass(frozen=True)
class Binary:
    """expr: GLSL expression, or {rounding_mode: expression} (div.Tensor_mode).
    dtypes: accepted operand dtypes. kind: result rule (see the module docstring).
    alpha: sign applied to add/sub's alpha (None: the op has no alpha).
    scalar_pos: operand positions that may be a Python scalar.
    fp32_scalar: a Python float stays fp32 with an fp16 tensor (ATen's mul and div use
    the scalar's opmath value; the other ops round it to fp16 first)."""

    expr: "str | dict"
    dtypes: frozenset
    kind: str = "arith"
    alpha: "int | None" = None
    scalar_pos: tuple = (1,)
    fp32_scalar: bool = False
    notes: str = "broadcasting on any axis, scalar operand"


_LOGICAL = "broadcasting, any operand dtype (NaN is true), bool result"
_MOD = ("remainder: sign of the divisor (Python %), fmod: sign of the dividend; float "
        "quotients exact below 2**24; integer modulo 0 raises after the run, as in ATen")
_POW = "broadcasting, C's results for negative bases and 0**negative; int32 exact"
BINARY_OPS = {
    "aten.add.Tensor": Binary("a + ALPHA * b", ARITH, alpha=1,
                              notes="broadcasting on any axis, alpha, scalar other"),
    "aten.sub.Tensor": Binary("a + ALPHA * b", ARITH - {"bool"}, alpha=-1,
                              notes="broadcasting on any axis, alpha, scalar other"),
    "aten.mul.Tensor": Binary("a * b", ARITH, fp32_scalar=True, notes="broadcasting on any axis, scalar "
                                                    "other, bool masks"),
    "aten.div.Tensor": Binary("a / b", WIDE, kind="truediv", fp32_scalar=True,
                              notes="true division, int32 operands give float32"),
    "aten.add.Scalar": Binary("a + ALPHA * b", ARITH, alpha=1,
                              notes="Python-scalar other, alpha"),
    "aten.sub.Scalar": Binary("a + ALPHA * b", ARITH - {"bool"}, alpha=-1,
                              notes="Python-scalar other, alpha"),
    "aten.mul.Scalar": Binary("a * b", ARITH, fp32_scalar=True,
                              notes="Python-scalar other (attention's scale)"),
    "aten.div.Scalar": Binary("a / b", WIDE, kind="truediv", fp32_scalar=True,
                              notes="Python-scalar other; integer self gives float32"),
    "aten.div.Tensor_mode": Binary({None: "a / b", "trunc": "div_trunc(a, b)",
                                    "floor": "div_floor(a, b)"}, WIDE,
                                   fp32_scalar=True,
                                   notes="rounding_mode None/'trunc'/'floor'; integer "
                                         "division by zero raises after the run, as "
                                         "in ATen"),
    "aten.pow.Tensor_Tensor": Binary("pow_edges(a, b)", NUMERIC, scalar_pos=(),
                                     notes=_POW),
    "aten.pow.Tensor_Scalar": Binary("pow_edges(a, b)", NUMERIC, notes=_POW),
    "aten.pow.Scalar": Binary("pow_edges(a, b)", NUMERIC, scalar_pos=(0,), notes=_POW),
    "aten.remainder.Tensor": Binary("remainder_edges(a, b)", WIDE, notes=_MOD),
    "aten.remainder.Scalar": Binary("remainder_edges(a, b)", WIDE, notes=_MOD),
    "aten.fmod.Tensor": Binary("fmod_edges(a, b)", WIDE, notes=_MOD),
    "aten.fmod.Scalar": Binary("fmod_edges(a, b)", WIDE, notes=_MOD),
    "aten.minimum.default": Binary("min_nan(a, b)", WIDE, scalar_pos=(),
                                   notes="broadcasting, propagates NaN"),
    "aten.maximum.default": Binary("max_nan(a, b)", WIDE, scalar_pos=(),
                                   notes="broadcasting, propagates NaN"),
    "aten.logical_and.default": Binary("(a != ACC_T(0)) && (b != ACC_T(0))", WITH_BOOL,
                                       kind="logical", scalar_pos=(), notes=_LOGICAL),
    "aten.logical_or.default": Binary("(a != ACC_T(0)) || (b != ACC_T(0))", WITH_BOOL,
                                      kind="logical", scalar_pos=(), notes=_LOGICAL),
    "aten.logical_xor.default": Binary("(a != ACC_T(0)) != (b != ACC_T(0))", WITH_BOOL,
                                       kind="logical", scalar_pos=(), notes=_LOGICAL),
    "aten.bitwise_and.Tensor": Binary("a & b", INT_BOOL, "bitwise", scalar_pos=(),
                                      notes="broadcasting"),
    "aten.bitwise_or.Tensor": Binary("a | b", INT_BOOL, "bitwise", scalar_pos=(),
                                     notes="broadcasting"),
    "aten.bitwise_xor.Tensor": Binary("a ^ b", INT_BOOL, "bitwise", scalar_pos=(),
                                      notes="broadcasting"),
}
for _cmp, _glsl in (("eq", "=="), ("ne", "!="), ("lt", "<"), ("le", "<="), ("gt", ">"),
                    ("ge", ">=")):
    for _overload in ("Tensor", "Scalar"):
        BINARY_OPS[f"aten.{_cmp}.{_overload}"] = Binary(
            f"a {_glsl} b", WITH_BOOL, kind="compare",
            notes="Python-scalar other, bool result" if _overload == "Scalar"
            else "broadcasting, bool result",
            scalar_pos=(1,) if _overload == "Scalar" else ())
