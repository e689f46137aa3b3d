"""Elementwise unary ops: one entry each in ``UNARY_OPS`` (kernels/elementwise_exprs.py).

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

from vkdelegate.kernels.elementwise_exprs import (INT32_MAX, INT32_MIN, UNARY_OPS,
                                                 Unary)
from vkdelegate.kernels.binary_dispatch import CHECKED_EXPRS, checked_int64
from vkdelegate.ops.registry import NodeSpec, OpSpec, register
from vkdelegate.kernels.rules import same_shape
from vkdelegate.runtime.dtypes import (INT64_OVERFLOW, STORAGE_PROFILES, acc_type,
                                       device_dtype, storage_defines)
from vkdelegate.runtime.param_block import ParamBlock, tensor_meta_block
from vkdelegate.shaders.bindings import Bindings, shader_bindings
from vkdelegate.shaders.variants import declare_grid, flag_defines

SHADER = "unary_op"
# The op's scalar parameters P0..P3: as floats (float variants) and as ints.
PARAMS = ParamBlock("params_block", [("fparams", "vec4"), ("iparams", "ivec4")])


def _defines(expr: str, out, x, x_dtype: str, has_params: bool) -> dict:
    """unary_op.glsl's defines; an int64 neg / abs (``checked_int64``: -2^31 has no
    int32 negation) gets CHECK_INT32 and the checked expression (int_checked.h), its
    error-flag word in the parameter block's iparams.w."""
    checked = checked_int64(expr, out, x_dtype)
    return dict(storage_defines(OUT=out, IN=x), ACC_T=acc_type(x_dtype),
                OP_EXPR=CHECKED_EXPRS[expr] if checked else expr,
                **flag_defines(ACC_FLOAT=acc_type(x_dtype) == "float",
                               HAS_PARAMS=has_params, CHECK_INT32=checked))


@shader_bindings(SHADER)
def _bindings(d) -> Bindings:
    checked = "CHECK_INT32" in d
    return Bindings(outputs=("out_data",) + (("error_flags",) if checked else ()),
                    inputs=("in_data",),
                    params=(tensor_meta_block("out_meta"),) +
                    ((PARAMS,) if "HAS_PARAMS" in d or checked else ()))


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
        flags = []
        if checked_int64(expr, out, x.dtype):
            flags.append(b.error_flag(INT64_OVERFLOW))
            param_buffers.append(b.params(PARAMS.pack(fparams=[0.0],
                                                      iparams=[0, 0, 0, flags[0].slot])))
        elif op.params is not None:
            values = op.params(scalars, acc_type(x.dtype) == "float")
            # The int row is read only by integer variants, whose parameters are ints.
            ints = [max(INT32_MIN, min(INT32_MAX, int(v))) if math.isfinite(v) else 0
                    for v in values]
            param_buffers.append(b.params(PARAMS.pack(fparams=values, iparams=ints)))
        b.dispatch(SHADER, _defines(expr, out, x, x.dtype, op.params is not None),
                   outputs=[out, *flags], inputs=[x], params=param_buffers,
                   global_size=(out.max_numel,), local_size=b.local_size_1d(out.max_numel),
                   grid=lambda: (out.numel,))
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
