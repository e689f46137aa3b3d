"""Elementwise ops of three broadcast operands: aten.where.self, aten.clamp.Tensor.

One shader (ternary_op.glsl). where.self(condition, self, other): a bool condition
chooses between self and other; clamp.Tensor(self, min?, max?): self clamped to
tensor bounds (an absent bound is the dtype's extreme), NaN in self or a bound gives
NaN, min > max gives max (ATen). Operands broadcast on any axis. Operand dtypes follow
kernels/elementwise.py's ``promote`` (float32 with int32 -> float32; two dtypes of one category stay
on the CPU).
"""
from __future__ import annotations


import numpy as np

from vkdelegate.kernels.broadcast import PLAN_PARAMS, broadcast_shape, plan_dispatch
from vkdelegate.kernels.elementwise import load_define, promote
from vkdelegate.ops.registry import NodeSpec, OpSpec, TensorSpec, register
from vkdelegate.runtime.dtypes import STORAGE_PROFILES, acc_type, device_dtype, \
    storage_defines
from vkdelegate.shaders.bindings import Bindings, shader_bindings
from vkdelegate.shaders.variants import declare_grid

SHADER = "ternary_op"
# int64 (position ids, masks) is held in int32 on the device: where only selects.
VALUES = frozenset({"float32", "float16", "int32", "int64", "bool"})
NUMERIC = frozenset({"float32", "float16", "int32"})
WHERE_EXPR = "c != 0 ? a : b"
CLAMP_EXPR = "KEEP_NAN(a, min_nan(max_nan(a, b), c))"


def _shape(args):
    shapes = [tuple(v.shape) for v in args[:3] if hasattr(v, "shape")]
    out = ()
    for s in shapes:
        out = broadcast_shape(out, s)
    return out


def _dtype_rule(value_positions):
    def check(node: NodeSpec):
        dtypes = [node.args[i].dtype for i in value_positions
                  if isinstance(node.args[i], TensorSpec)]
        t = promote(dtypes)
        if t is None:
            return f"operand dtypes {dtypes} differ within one category"
        if node.outputs[0].dtype != t:
            return f"output dtype {node.outputs[0].dtype}, expected {t}"
        return None
    return check


def _defines(expr: str, out, c, a, b, compute: str, c_type: str) -> dict:
    d = storage_defines(OUT=out, C=c, A=a, B=b)
    d.update(ACC_T=acc_type(compute), C_TYPE=c_type, OP_EXPR=expr, **{
        "C_LOAD(v)": "int(v)" if c_type == "int" else load_define(d["C_T"], compute),
        "A_LOAD(v)": load_define(d["A_T"], compute), "B_LOAD(v)": load_define(d["B_T"], compute)})
    if acc_type(compute) == "float":
        d["ACC_FLOAT"] = "1"
    return d


@shader_bindings(SHADER)
def _bindings(_defines) -> Bindings:
    return Bindings(outputs=("out_data",), inputs=("c_data", "a_data", "b_data"),
                    params=(PLAN_PARAMS,))


def _dispatch(b, expr, out, c, x, y, c_type):
    plan_dispatch(b, SHADER, _defines(expr, out, c, x, y, out.dtype, c_type), out,
                  [c, x, y])


def _where_impl(b, node):
    c_id, x_id, y_id, out_id = node.args
    c, x, y, out = (b.tensor(i) for i in (c_id, x_id, y_id, out_id))
    if c.dtype != "bool" or promote([x.dtype, y.dtype]) != out.dtype:
        raise b.error(f"dtypes condition {c.dtype}, operands {x.dtype}/{y.dtype}, "
                      f"output {out.dtype} not supported")
    _dispatch(b, WHERE_EXPR, out, c, x, y, "int")


def _extreme(dtype: str, high: bool):
    if acc_type(dtype) == "float":
        return np.inf if high else -np.inf
    return np.iinfo(np.int32).max if high else np.iinfo(np.int32).min


def _clamp_impl(b, node):
    x_id, lo_id, hi_id, out_id = node.args
    x, out = b.tensor(x_id), b.tensor(out_id)
    lo, hi = b.value(lo_id), b.value(hi_id)
    present = [t.dtype for t in (x, lo, hi) if t is not None]
    if promote(present) != out.dtype:
        raise b.error(f"dtypes {present} -> {out.dtype} not supported")
    lo, hi = (t if t is not None else
              b.prepacked(np.asarray(_extreme(out.dtype, high), dtype=out.dtype))
              for t, high in ((lo, False), (hi, True)))
    _dispatch(b, CLAMP_EXPR, out, hi, x, lo, acc_type(out.dtype))


register(OpSpec(name="aten.where.self", dtypes=VALUES, impl=_where_impl, shape_fn=_shape,
                rules=(_dtype_rule((1, 2)),), arg_dtypes={0: frozenset({"bool"})},
                notes="bool condition, broadcasting on any axis"))
register(OpSpec(name="aten.clamp.Tensor", dtypes=NUMERIC, impl=_clamp_impl,
                shape_fn=_shape, rules=(_dtype_rule((0, 1, 2)),),
                notes="tensor bounds (either may be None), broadcasting, NaN propagates"))

def _where_variant(profile, t: str, u: str):
    """where(cond, t, u): None where t and u do not promote."""
    out = promote([t, u])
    pair = lambda dt: (dt, device_dtype(dt, profile))  # noqa: E731
    return None if out is None else _defines(WHERE_EXPR, pair(out), pair("bool"), pair(t),
                                             pair(u), out, "int")


def _clamp_variant(profile, t: str, u: str, v: str):
    """clamp(v, t, u) with tensor bounds t and u: None where the three do not promote."""
    out = promote([t, u, v])
    pair = lambda dt: (dt, device_dtype(dt, profile))  # noqa: E731
    return None if out is None else _defines(CLAMP_EXPR, pair(out), pair(v), pair(t),
                                             pair(u), out, acc_type(out))


declare_grid(SHADER, _where_variant, profile=STORAGE_PROFILES, t=VALUES, u=VALUES)
declare_grid(SHADER, _clamp_variant, profile=STORAGE_PROFILES, t=NUMERIC, u=NUMERIC,
             v=NUMERIC)
