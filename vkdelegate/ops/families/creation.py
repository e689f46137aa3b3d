"""Tensor creation: full, full_like, scalar_tensor, arange.start_step.

torch.zeros/ones/full export as ``aten.full.default``; zeros_like/ones_like/full_like
as ``aten.full_like.default``; every torch.arange form as ``aten.arange.start_step``;
``aten.scalar_tensor.default`` (a 0-d tensor: the fill operands of decomposed
masked_fill and of attention masks' ``where``) is full of size ().
The fill value is converted to the output dtype on the host exactly as torch converts
a Python scalar (numpy cast: truncation for ints, x != 0 for bool); arange computes
``start + i * step`` on the device (fp32 for float outputs, int32 for integer ones).
Sizes, fill values and arange bounds may be SymInts (ops/families/symint.py): the
output sizes follow them at every resize and the parameter block is rewritten.
"""
from __future__ import annotations

import math

import numpy as np

from vkdelegate.kernels.rules import scalar_reason
from vkdelegate.ops.registry import NodeSpec, OpSpec, register
from vkdelegate.errors import VkDelegateError
from vkdelegate.runtime.dtypes import STORAGE_PROFILES, acc_type, device_dtype, storage_defines
from vkdelegate.runtime.param_block import ParamBlock
from vkdelegate.shaders.bindings import Bindings, shader_bindings
from vkdelegate.shaders.variants import declare_grid

SHADER = "arange_fill"
DTYPES = frozenset({"float32", "float16", "int32", "int64", "int8", "uint8", "bool"})
ARANGE_DTYPES = frozenset({"float32", "float16", "int32", "int64"})
RANGE_PARAMS = ParamBlock("range_block", [
    ("iinfo", "ivec4"),   # x: numel, y: int start, z: int step
    ("finfo", "vec4")])   # x: float start, y: float step


def _defines(out_ddt: str, dtype: str) -> dict:
    d = storage_defines(OUT=(dtype, out_ddt))
    if acc_type(dtype) == "float":
        d["ACC_FLOAT"] = "1"
    return d


def _typed(value, dtype: str):
    """A Python scalar as torch stores it in a tensor of ``dtype`` (as int or float)."""
    if dtype == "bool":
        return int(bool(value))
    if acc_type(dtype) == "float":
        return float(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise VkDelegateError(f"fill value {value} for an integer tensor")
    return int(np.array(int(value)).astype(dtype if dtype != "int64" else "int32"))


@shader_bindings(SHADER)
def _bindings(_defines) -> Bindings:
    return Bindings(outputs=("out_data",), params=(RANGE_PARAMS,))


def _dispatch(b, out, start_fn, step_fn):
    """start_fn(), step_fn(): the current start and step (read again at every resize,
    since they may come from SymInts)."""
    def data():
        start, step = start_fn(), step_fn()
        ints = acc_type(out.dtype) == "int"
        return RANGE_PARAMS.pack(
            iinfo=[out.numel, int(start) if ints else 0, int(step) if ints else 0],
            finfo=[float(start), float(step)])
    params = b.params(data())
    b.on_resize(lambda: params.write(data()))
    b.dispatch(SHADER, _defines(out.device_dtype, out.dtype), outputs=[out], inputs=[],
               params=[params], global_size=(out.max_numel,), grid=lambda: (out.numel,))


def _full_impl(b, node):
    # full(size, fill_value, *, dtype, layout, device, pin_memory) and
    # full_like(self, fill_value, *, dtype, layout, device, pin_memory, memory_format)
    out = b.tensor(node.args[-1])
    _dispatch(b, out, lambda: _typed(b.scalar(node.args[1]), out.dtype), lambda: 0)


def arange_numel(start, end, step) -> int:
    """torch.arange's length: ceil((end - start) / step), at least 0."""
    if step == 0:
        raise VkDelegateError("arange step must be nonzero")
    return max(0, math.ceil((end - start) / step))


def _arange_impl(b, node):
    start_id, _end_id, step_id = node.args[:3]
    out = b.tensor(node.args[-1])
    start, step = b.scalar(start_id), b.scalar(step_id)
    if acc_type(out.dtype) == "int" and any(isinstance(v, float) and v != int(v)
                                            for v in (start, step)):
        raise b.error(f"integer arange with fractional start {start} or step {step}")
    _dispatch(b, out, lambda: b.scalar(start_id), lambda: b.scalar(step_id))


def _arange_shape(args):
    start, end, step = args[:3]
    for v in (start, end, step):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise VkDelegateError(f"arange bound {v!r} is not a number")
    return (arange_numel(start, end, step),)


def _fill_rule(node: NodeSpec):
    reason = scalar_reason(node.args[1], node.outputs[0].dtype)
    return f"fill {reason}" if reason else None


def _scalar_tensor_impl(b, node):
    # scalar_tensor(s, *, dtype, layout, device, pin_memory)
    out = b.tensor(node.args[-1])
    _dispatch(b, out, lambda: _typed(b.scalar(node.args[0]), out.dtype), lambda: 0)


def _scalar_tensor_rule(node: NodeSpec):
    reason = scalar_reason(node.args[0], node.outputs[0].dtype)
    return f"value {reason}" if reason else None


def _arange_rule(node: NodeSpec):
    start, end, step = node.args[:3]
    if not all(isinstance(v, (int, float)) for v in (start, end, step)):
        return "arange bounds that are not numbers"
    for v in (start, end):
        reason = scalar_reason(v, node.outputs[0].dtype)
        if reason:
            return f"arange bound {reason}"
    if acc_type(node.outputs[0].dtype) == "int" and any(
            isinstance(v, float) and v != int(v) for v in (start, step)):
        return "integer arange with a fractional start or step"
    if node.outputs[0].dtype == "float16" and node.outputs[0].shape[0] > 2048:
        # fp32 index math then rounding to fp16 differs from torch's fp16 arange once
        # consecutive values are closer than fp16 can tell apart.
        return "float16 arange longer than 2048"
    return None


register(OpSpec(name="aten.full.default", dtypes=DTYPES, impl=_full_impl,
                shape_fn=lambda args: tuple(args[0]), rules=(_fill_rule,),
                symbolic_args=frozenset({0, 1}), notes="zeros, ones, full; symbolic sizes"))
register(OpSpec(name="aten.full_like.default", dtypes=DTYPES, impl=_full_impl,
                shape_fn=lambda args: tuple(args[0].shape), rules=(_fill_rule,),
                notes="zeros_like, ones_like, full_like; any dtype argument"))
register(OpSpec(name="aten.scalar_tensor.default", dtypes=DTYPES, impl=_scalar_tensor_impl,
                shape_fn=lambda args: (), rules=(_scalar_tensor_rule,),
                notes="0-d tensor of a Python scalar (masked_fill, attention masks)"))
# ExecuTorch keeps zeros/ones(_like) as ops of their own (torch.export makes them full):
# schemas as full's without the fill value.


def _constant_impl(value):
    def impl(b, node):
        out = b.tensor(node.args[-1])
        _dispatch(b, out, lambda: _typed(value, out.dtype), lambda: 0)
    return impl


for _name, _value, _shape in (
        ("aten.zeros.default", 0, lambda args: tuple(args[0])),
        ("aten.ones.default", 1, lambda args: tuple(args[0])),
        ("aten.zeros_like.default", 0, lambda args: tuple(args[0].shape)),
        ("aten.ones_like.default", 1, lambda args: tuple(args[0].shape))):
    register(OpSpec(name=_name, dtypes=DTYPES, impl=_constant_impl(_value), shape_fn=_shape,
                    symbolic_args=frozenset({0}) if "like" not in _name else frozenset(),
                    notes="ExecuTorch name (torch.export emits full / full_like)"))
register(OpSpec(name="aten.arange.start_step", dtypes=ARANGE_DTYPES, impl=_arange_impl,
                shape_fn=_arange_shape, rules=(_arange_rule,), max_rank=1,
                symbolic_args=frozenset({0, 1, 2}),
                notes="every torch.arange form; float or integer; symbolic bounds"))
declare_grid(SHADER, lambda profile, dtype: _defines(device_dtype(dtype, profile), dtype),
             profile=STORAGE_PROFILES, dtype=DTYPES)
