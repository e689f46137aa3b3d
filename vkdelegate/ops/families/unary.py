"""Elementwise unary ops: one entry each in ``UNARY_OPS``.

Every op shares unary_op.glsl; an entry gives the GLSL expression in ``x`` (of type
ACC_T: float for float dtypes, computed in fp32, int for integer dtypes) and the scalar
parameters ``P0..P3`` (the op's scalar arguments, in schema order, made by ``params``),
the dtypes it accepts and whether its output is bool. Expressions keep ATen's results
at the edges (helpers in elementwise_math.h): clamp/hardtanh/relu propagate NaN, tanh
clamps its input (the exp-based formula overflows to NaN beyond about 44), sqrt/log are
NaN below zero, rsqrt/reciprocal/log give infinities at zero, round is half-to-even,
sign(NaN) is 0. Ops with a string argument (gelu's ``approximate``) pick one of several
expressions at load time; every choice is a declared variant.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Optional

from vkdelegate.ops.registry import NodeSpec, OpSpec, register
from vkdelegate.kernels.rules import same_shape
from vkdelegate.runtime.dtypes import (STORAGE_PROFILES, acc_type, device_dtype,
                                       storage_defines)
from vkdelegate.runtime.param_block import ParamBlock, tensor_meta_block
from vkdelegate.shaders.bindings import Bindings, shader_bindings
from vkdelegate.shaders.variants import declare_grid, flag_defines

SHADER = "unary_op"
FLOATS = frozenset({"float32", "float16"})
# The op's scalar parameters P0..P3: as floats (float variants) and as ints.
PARAMS = ParamBlock("params_block", [("fparams", "vec4"), ("iparams", "ivec4")])
NUMERIC = FLOATS | {"int32", "int8"}
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
    "aten.relu.default": Unary("KEEP_NAN(x, max(x, ACC_T(0)))", NUMERIC | {"uint8"}),
    "aten.hardtanh.default": Unary("KEEP_NAN(x, min_nan(max_nan(x, P0), P1))", FLOATS,
                                   params=lambda s, f: (s[0], s[1]),
                                   notes="relu6 exports as hardtanh(x, 0, 6)"),
    "aten.hardswish.default": Unary(
        "KEEP_NAN(x, x == -INF_F ? NAN_F : x * min(max(x + 3.0, 0.0), 6.0) / 6.0)", FLOATS,
        notes="x * relu6(x + 3) / 6 as ATen (NaN at -inf); ET-VK keeps it whole"),
    "aten.clamp.default": Unary("KEEP_NAN(x, min_nan(max_nan(x, P0), P1))",
                                FLOATS | {"int32"},
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
    "aten.neg.default": Unary("-x", NUMERIC),
    "aten.abs.default": Unary("abs(x)", NUMERIC),
    "aten.sign.default": Unary("ACC_T(x > ACC_T(0)) - ACC_T(x < ACC_T(0))",
                               FLOATS | {"int32"}),
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
    "aten.bitwise_not.default": Unary({"int32": "~x", "bool": "x == 0"},
                                      frozenset({"int32", "bool"}), by_dtype=True,
                                      notes="~ on int32 and bool tensors"),
    "aten.logical_not.default": Unary("x == ACC_T(0)", NUMERIC | {"bool"}, out_bool=True,
                                      notes="any input dtype, bool output"),
}


def _defines(expr: str, out, x, x_dtype: str, has_params: bool) -> dict:
    return dict(storage_defines(OUT=out, IN=x), ACC_T=acc_type(x_dtype), OP_EXPR=expr,
                **flag_defines(ACC_FLOAT=acc_type(x_dtype) == "float",
                               HAS_PARAMS=has_params))


@shader_bindings(SHADER)
def _bindings(d) -> Bindings:
    return Bindings(outputs=("out_data",), inputs=("in_data",),
                    params=(tensor_meta_block("out_meta"),) +
                    ((PARAMS,) if "HAS_PARAMS" in d else ()))


def _make_impl(op: Unary):
    def impl(b, node):
        x_id, *scalar_ids, out_id = node.args
        x, out = b.tensor(x_id), b.tensor(out_id)
        expected = "bool" if op.out_bool else x.dtype
        if out.dtype != expected:
            raise b.error(f"output dtype {out.dtype}, expected {expected}")
        scalars = [b.value(i) for i in scalar_ids]
        expr = op.expr
        if op.by_dtype:
            expr = expr[x.dtype]
        elif isinstance(expr, dict):
            if scalars[0] not in expr:
                raise b.error(f"argument {scalars[0]!r} not supported, expected one of "
                              f"{sorted(expr)}")
            expr = expr[scalars[0]]
        param_buffers = [out.meta]
        if op.params is not None:
            values = op.params(scalars, acc_type(x.dtype) == "float")
            # The int row is read only by integer variants, whose parameters are ints.
            ints = [max(INT32_MIN, min(INT32_MAX, int(v))) if math.isfinite(v) else 0
                    for v in values]
            param_buffers.append(b.params(PARAMS.pack(fparams=values, iparams=ints)))
        b.dispatch(SHADER, _defines(expr, out, x, x.dtype, op.params is not None),
                   outputs=[out], inputs=[x], params=param_buffers,
                   global_size=(out.max_numel,), local_size=(64, 1, 1))
    return impl


def _make_rules(op: Unary) -> tuple:
    def output_dtype(node: NodeSpec):
        x, out = node.args[0], node.outputs[0]
        expected = "bool" if op.out_bool else x.dtype
        if out.dtype != expected:
            return f"output dtype {out.dtype} differs from {expected} (type promotion)"
        return None

    def choice(node: NodeSpec):
        value = node.args[1] if len(node.args) > 1 else None
        if value not in op.expr:
            return f"argument {value!r} not supported (supported: {sorted(op.expr)})"
        return None

    rules = (output_dtype,)
    if isinstance(op.expr, dict) and not op.by_dtype:
        rules += (choice,)
    return rules


def _variants(op: Unary, profile, dtype: str) -> list[dict]:
    """The variants of ``op`` for a ``dtype`` input on storage ``profile``: one per
    expression (an op with a dict of expressions has one per mode, or one per dtype)."""
    exprs = op.expr.values() if isinstance(op.expr, dict) else [op.expr]
    x = (dtype, device_dtype(dtype, profile))
    out = ("bool", device_dtype("bool", profile)) if op.out_bool else x
    return [_defines(expr, out, x, dtype, op.params is not None)
            for expr in ([op.expr[dtype]] if op.by_dtype else exprs)]


for _name, _op in UNARY_OPS.items():
    if _op.out_bool:
        _spec = OpSpec(name=_name, dtypes=frozenset({"bool"}), impl=_make_impl(_op),
                       shape_fn=same_shape, rules=_make_rules(_op),
                       arg_dtypes={0: _op.dtypes}, notes=_op.notes)
    else:
        _spec = OpSpec(name=_name, dtypes=_op.dtypes, impl=_make_impl(_op),
                       shape_fn=same_shape, rules=_make_rules(_op), notes=_op.notes)
    register(_spec)
    declare_grid(SHADER, functools.partial(_variants, _op), profile=STORAGE_PROFILES,
                 dtype=_op.dtypes)
