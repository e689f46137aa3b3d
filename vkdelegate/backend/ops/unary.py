"""Elementwise unary ops: one line each in ``UNARY_OPS``.

Every op shares unary_op.glsl; an entry gives the GLSL expression in ``x`` (of type
ACC_T: float for float dtypes, computed in fp32, int for integer dtypes) and the dtypes
it accepts. Expressions keep ATen's results at the edges: tanh clamps its input (the
exp-based formula overflows to NaN beyond about 44), sqrt returns NaN below zero (GLSL
leaves it undefined).
"""
from __future__ import annotations

from vkdelegate.backend.registry import OpSpec, register
from vkdelegate.runtime.dtypes import (STORAGE_PROFILES, acc_type, device_dtype,
                                       storage_defines)
from vkdelegate.shaders.variants import declare

SHADER = "unary_op"
FLOATS = frozenset({"float32", "float16"})
NUMERIC = FLOATS | {"int32", "int8"}

#: aten name -> (GLSL expression in x, accepted dtypes)
UNARY_OPS = {
    "aten.relu.default": ("max(x, ACC_T(0))", NUMERIC | {"uint8"}),
    "aten.neg.default": ("-x", NUMERIC),
    "aten.abs.default": ("abs(x)", NUMERIC),
    "aten.sigmoid.default": ("1.0 / (1.0 + exp(-x))", FLOATS),
    "aten.tanh.default": ("tanh(clamp(x, -15.0, 15.0))", FLOATS),
    "aten.exp.default": ("exp(x)", FLOATS),
    "aten.sqrt.default": ("x < 0.0 ? NAN_F : sqrt(x)", FLOATS),
    "aten.sin.default": ("sin(x)", FLOATS),
    "aten.cos.default": ("cos(x)", FLOATS),
}


def _defines(expr: str, out, x, dtype: str) -> dict:
    d = storage_defines(OUT=out, IN=x)
    d.update(ACC_T=acc_type(dtype), OP_EXPR=expr)
    return d


def _make_impl(expr: str):
    def impl(b, node):
        x_id, out_id = node.args
        x, out = b.tensor(x_id), b.tensor(out_id)
        if x.dtype != out.dtype:
            raise b.error(f"input dtype {x.dtype} differs from output dtype {out.dtype}")
        b.dispatch(SHADER, _defines(expr, out, x, out.dtype), outputs=[out], inputs=[x],
                   params=[out.meta], global_size=(out.max_numel,), local_size=(64, 1, 1))
    return impl


def _shape(args):
    return tuple(args[0].shape)


for _name, (_expr, _dtypes) in UNARY_OPS.items():
    register(OpSpec(name=_name, dtypes=frozenset(_dtypes), impl=_make_impl(_expr),
                    shape_fn=_shape, notes="elementwise"))
    for _profile in STORAGE_PROFILES:
        for _dt in _dtypes:
            _ddt = (_dt, device_dtype(_dt, _profile))
            declare(SHADER, _defines(_expr, _ddt, _ddt, _dt))
