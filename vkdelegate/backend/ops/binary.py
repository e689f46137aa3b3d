"""Elementwise binary ops with broadcasting: aten.add.Tensor, aten.sub.Tensor.

One shader (binary_op.glsl) serves every op of this family; an op is one entry of
``BINARY_OPS``: its GLSL expression in ``a``, ``b`` and ``ALPHA``. Semantics follow
ATen: broadcasting on any axis (rank <= 6), ``alpha`` scales the second operand, a
Python-scalar second operand (``x + 1`` exports as add.Tensor(x, 1)) is a 0-d tensor,
integer results wrap like ATen's. All tensors of a node must share one dtype (ATen's
type promotion is not done on the device: a mixed node stays on the CPU).
"""
from __future__ import annotations

import numpy as np

from vkdelegate.backend.registry import NodeSpec, OpSpec, register
from vkdelegate.runtime.dtypes import (STORAGE_PROFILES, acc_type, device_dtype,
                                       storage_defines)
from vkdelegate.runtime.params import ivec4, record, vec4
from vkdelegate.shaders.variants import declare

SHADER = "binary_op"
DTYPES = frozenset({"float32", "float16", "int32", "int8", "uint8"})

#: aten name -> (GLSL expression, sign applied to alpha)
BINARY_OPS = {
    "aten.add.Tensor": ("a + ALPHA * b", 1),
    "aten.sub.Tensor": ("a + ALPHA * b", -1),
}


def broadcast_shape(a, b) -> tuple:
    """numpy/ATen broadcast of two size tuples (VkDelegateError if incompatible)."""
    from vkdelegate.errors import VkDelegateError
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + tuple(a)
    b = (1,) * (n - len(b)) + tuple(b)
    out = []
    for x, y in zip(a, b):
        if x != y and 1 not in (x, y):
            raise VkDelegateError(f"sizes {list(a)} and {list(b)} do not broadcast")
        out.append(y if x == 1 else x)
    return tuple(out)


def _shape(args):
    self_, other = args[0], args[1]
    other_shape = other.shape if hasattr(other, "shape") else ()
    return broadcast_shape(self_.shape, other_shape)


def _same_dtype(node: NodeSpec):
    dtypes = {t.dtype for t in node.tensors()}
    if len(dtypes) > 1:
        return f"mixed dtypes {sorted(dtypes)} (no type promotion on the device)"
    return None


def _defines(expr: str, out, a, b, out_dtype: str) -> dict:
    d = storage_defines(OUT=out, A=a, B=b)
    d.update(ACC_T=acc_type(out_dtype), OP_EXPR=expr)
    if acc_type(out_dtype) == "float":
        d["ACC_FLOAT"] = "1"
    return d


def _make_impl(expr: str, sign: int):
    def impl(b, node):
        self_id, other_id, alpha_id, out_id = node.args
        x, out = b.tensor(self_id), b.tensor(out_id)
        other = b.value(other_id)
        if not hasattr(other, "buffer"):
            # A Python scalar operand becomes a 0-d constant tensor.
            other = b.prepacked(np.asarray(other, dtype=out.dtype))
        alpha = b.scalar(alpha_id)
        alpha = sign * (1 if alpha is None else alpha)
        if acc_type(out.dtype) == "int" and alpha != int(alpha):
            raise b.error(f"alpha {alpha} is not an integer for dtype {out.dtype}")
        params = b.params(record(vec4(alpha), ivec4(int(alpha))))
        b.dispatch(SHADER, _defines(expr, out, x, other, out.dtype),
                   outputs=[out], inputs=[x, other],
                   params=[out.meta, x.meta, other.meta, params],
                   global_size=(out.max_numel,),
                   local_size=b.local_size_1d(out.max_numel))
    return impl


for _name, (_expr, _sign) in BINARY_OPS.items():
    register(OpSpec(name=_name, dtypes=DTYPES, impl=_make_impl(_expr, _sign),
                    shape_fn=_shape, rules=(_same_dtype,),
                    notes="broadcasting on any axis, alpha, scalar other"))
    for _profile in STORAGE_PROFILES:
        for _dt in DTYPES:
            _ddt = (_dt, device_dtype(_dt, _profile))
            declare(SHADER, _defines(_expr, _ddt, _ddt, _ddt, _dt))
