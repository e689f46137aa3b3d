"""Elementwise binary ops with broadcasting on any axis (rank <= 6).

One shader (binary_op.glsl) serves every op of this family; an op is one entry of
``BINARY_OPS`` (kernels/elementwise_exprs.py): its GLSL expression in ``a``, ``b`` (and ``ALPHA`` for add/sub), the
dtypes of its tensor operands and its result rule (``kind``), applied to the promoted
operand dtype (``promote``: the operand of the highest category, e.g. float32 * bool is
float32):

- "arith": the result has the operands' dtype; an integer tensor with a Python float
  operand gives float32 (ATen's promotion of a wrapped number), computed in float.
- "truediv": always a float result (int32 / int32 gives float32).
- "compare" / "logical": a bool result; compared in float when either side is float.
- "bitwise": integer and bool operands, same-dtype result.

Python-scalar operands (``x + 1`` exports as add.Tensor(x, 1); eq.Scalar, pow.Scalar
...) become 0-d constant tensors in the dtype ATen casts them to (the tensor's dtype, or
float32 for a float scalar with an integer tensor). Tensor operands of different
dtypes must differ in category, except float16 with float32, which gives float32
(int8 + int32 and int64 + int32 stay on the CPU).
Integer semantics are exact: wrapping arithmetic, C-style "trunc" and Python-style
"floor" division, integer pow with ATen's results for negative exponents. An integer
division, remainder or fmod by zero raises after the run, naming the node, as ATen
raises ZeroDivisionError (``ZERO_DIVISION``; int_checked.h's zero_guard). add and mul accept bool (masks:
``x * (x > 0)``; bool + bool is logical or, as in ATen). The ``.Scalar`` overloads
(mul.Scalar: the scale of every decomposed scaled_dot_product_attention; div, add,
sub) are the ``.Tensor`` ops with a Python-scalar other. int64 tensors (arange
positions, causal masks, position ids) are held in int32 on the device
(runtime/dtypes.py): add, sub, mul, division, min/max and comparisons accept them, exact
while values stay in the int32 range: an int64 input outside it raises at the boundary,
and an add, sub, mul or division whose int64 result leaves it raises after the run,
naming the node (``INT64_OVERFLOW``; int_checked.h), where ATen's int64 is exact.
(int32 results wrap, as ATen's do.)
"""
from __future__ import annotations

import functools
import itertools

import numpy as np

from vkdelegate.kernels.binary_dispatch import SCALAR_PARAMS, SHADER, binary_defines, \
    checked_expr
from vkdelegate.kernels.broadcast import broadcast_shape, plan_dispatch
from vkdelegate.kernels.elementwise import promote
from vkdelegate.kernels.elementwise_exprs import BINARY_OPS, Binary
from vkdelegate.ops.registry import NodeSpec, OpSpec, TensorSpec, register
from vkdelegate.runtime.dtypes import INT64_OVERFLOW, STORAGE_PROFILES, acc_type, \
    device_dtype, storage_defines
from vkdelegate.runtime.param_block import ParamBlock
from vkdelegate.shaders.bindings import Bindings, shader_bindings
from vkdelegate.shaders.variants import declare_grid



def _shape(args):
    shapes = [tuple(v.shape) if hasattr(v, "shape") else () for v in args[:2]]
    return broadcast_shape(*shapes)


def plan(op: Binary, a, b, out_dtype: str, mode=None) -> "tuple[str, str] | str":
    """(computation dtype, dtype of a scalar operand's 0-d tensor), or the reason the
    node cannot run. ``a``/``b``: operand dtype names, or Python scalars. ``mode``:
    div.Tensor_mode's rounding_mode (None is true division)."""
    tensors = [v for v in (a, b) if isinstance(v, str)]
    scalars = [v for v in (a, b) if not isinstance(v, str)]
    if not tensors:
        return "no tensor operand"
    t = promote(tensors)
    if t is None:
        return f"operand dtypes {tensors} differ within one category (no such type " \
               f"promotion on the device)"
    float_scalar = any(isinstance(s, float) for s in scalars)
    t_float = acc_type(t) == "float"
    if op.kind in ("compare", "logical"):
        expected = "bool"
        compute = "float32" if t_float or float_scalar else "int32"
    elif op.kind == "truediv" or (isinstance(op.expr, dict) and mode is None) or \
            (op.kind == "arith" and float_scalar and not t_float):
        expected = t if t_float else "float32"
        compute = expected
    else:
        expected = compute = t
    if op.kind == "bitwise" and scalars:
        return "a scalar operand of a bitwise op"
    if out_dtype != expected:
        return f"output dtype {out_dtype}, expected {expected} for {t} operands"
    scalar_dtype = t if t_float else ("float32" if float_scalar else "int32")
    if op.fp32_scalar and t == "float16":
        scalar_dtype = "float32"
    if scalar_dtype == "int32" and any(not -2 ** 31 <= s < 2 ** 31 for s in scalars):
        return f"scalar operand {scalars} outside the int32 range of the device"
    if acc_type(compute) == "int":
        compute = "int32"
    return compute, scalar_dtype


def _rule(op: Binary):
    def check(node: NodeSpec):
        a, b = (v.dtype if isinstance(v, TensorSpec) else v for v in node.args[:2])
        mode = node.args[2] if isinstance(op.expr, dict) else None
        if isinstance(op.expr, dict) and mode not in op.expr:
            return f"rounding_mode {mode!r} not supported"
        result = plan(op, a, b, node.outputs[0].dtype, mode)
        if isinstance(result, str):
            return result
        if op.alpha is not None and acc_type(result[0]) == "int" \
                and node.args[2] != int(node.args[2]):
            return f"alpha {node.args[2]} is not an integer for integer operands"
        return None
    return check


def _make_impl(op: Binary):
    def impl(bld, node):
        a_id, b_id, *extra_ids, out_id = node.args
        out = bld.tensor(out_id)
        a, b = bld.value(a_id), bld.value(b_id)
        dtype = [v.dtype if hasattr(v, "buffer") else v for v in (a, b)]
        extra = [bld.value(i) for i in extra_ids]
        mode = extra[0] if isinstance(op.expr, dict) else None
        if isinstance(op.expr, dict) and mode not in op.expr:
            raise bld.error(f"rounding_mode {mode!r} not supported")
        result = plan(op, dtype[0], dtype[1], out.dtype, mode)
        if isinstance(result, str):
            raise bld.error(result)
        compute, scalar_dtype = result
        # A Python scalar operand becomes a 0-d constant tensor.
        a, b = (v if hasattr(v, "buffer") else
                bld.prepacked(np.asarray(v, dtype=scalar_dtype)) for v in (a, b))
        expr = op.expr[mode] if isinstance(op.expr, dict) else op.expr
        alpha = op.alpha * (1 if extra[0] is None else extra[0]) if op.alpha else 0
        if acc_type(compute) == "int" and alpha != int(alpha):
            raise bld.error(f"alpha {alpha} is not an integer for dtype {compute}")
        flags = ()
        if checked_expr(expr, out, compute) is not None:
            flags = (bld.error_flag(INT64_OVERFLOW),)  # bit 2: ZERO_DIVISION
        # The int row is read only by integer variants (a float alpha may exceed int32).
        params = bld.params(SCALAR_PARAMS.pack(
            fscalars=[alpha], iscalars=[int(alpha) if acc_type(compute) == "int" else 0,
                                        flags[0].slot if flags else 0]))
        plan_dispatch(bld, SHADER, binary_defines(expr, out, a, b, compute), out, [a, b],
                      extra_params=(params,), extra_outputs=flags)
    return impl


def _variants(op: Binary, profile, t: str) -> list[dict]:
    """The variants of ``op`` whose widest operand dtype is ``t``, on storage
    ``profile``: operand dtypes x scalar placement x result dtype x mode."""
    modes = list(op.expr) if isinstance(op.expr, dict) else [None]
    pair = lambda dt: (dt, device_dtype(dt, profile))  # noqa: E731
    lower = [d for d in op.dtypes if d != t and promote([t, d]) == t]
    operands = [(t, t)] + [(t, s) for s in (1, 0.5) if 1 in op.scalar_pos] + \
               [(s, t) for s in (1, 0.5) if 0 in op.scalar_pos] + \
               [p for d in lower for p in ((t, d), (d, t))]
    found = []
    for (a, b), out_dtype, mode in itertools.product(operands, {"bool", t, "float32"},
                                                     modes):
        result = plan(op, a, b, out_dtype, mode)
        if isinstance(result, str):
            continue
        compute, sdt = result
        a_pair, b_pair = (pair(v if isinstance(v, str) else sdt) for v in (a, b))
        expr = op.expr[mode] if isinstance(op.expr, dict) else op.expr
        found.append(binary_defines(expr, pair(out_dtype), a_pair, b_pair, compute))
    return found


for _name, _op in BINARY_OPS.items():
    register(OpSpec(name=_name, dtypes=_op.dtypes, impl=_make_impl(_op), shape_fn=_shape,
                    rules=(_rule(_op),), notes=_op.notes))
    declare_grid(SHADER, functools.partial(_variants, _op), profile=STORAGE_PROFILES,
                 t=_op.dtypes)
