"""clone, _to_copy (and ExecuTorch's names for them: alias_copy, _clone_dim_order,
_to_dim_order_copy) and et_vk.prepack: flat copies
through the affine copy every data-movement op is built on (kernels/affine_copy.py).

Values convert from the input dtype to the output dtype as torch converts them: float to
integer truncates toward zero, int8/uint8 wrap, anything to bool is ``x != 0``. A
finite float value cast to int64 that does not fit the int32 the device holds int64 in
raises after the run, naming the node (NaN and infinities give an undefined value, as
in ATen); int32 / int64 to float64 and float64 to an integer or bool stay on the CPU
(float64 is float32 on the device).
"""
from __future__ import annotations

from vkdelegate.ops.registry import NodeSpec, OpSpec, register
from vkdelegate.kernels.affine_copy import MOVE_DTYPES, declare_copy, flat_impl
from vkdelegate.kernels.rules import same_dtype, same_shape

#: _to_copy converts between any two of these.
CONVERT_DTYPES = MOVE_DTYPES | {"float64"}


def _flat_impl(b, node):
    # A function of this module, so that docs/OPS.md lists the op in this family.
    flat_impl(b, node)


def _memory_format_rule(index: int):
    def rule(node: NodeSpec):
        fmt = node.args[index] if len(node.args) > index else None
        if fmt not in (None, "torch.contiguous_format", "torch.preserve_format"):
            return f"memory_format {fmt} (only contiguous layouts are stored)"
        return None
    return rule


def _to_copy_rule(node: NodeSpec):
    # _to_copy(self, *, dtype, layout, device, pin_memory, non_blocking, memory_format)
    layout = node.args[2] if len(node.args) > 2 else None
    if layout not in (None, "torch.strided"):
        return f"layout {layout}"
    return _float64_reason(node)


def _float64_reason(node: NodeSpec) -> "str | None":
    """float64 is held in float32 on the device (runtime/dtypes.py): a float value
    widens exactly at the output boundary, but an int32 / int64 one past 2**24 would
    round on the way, where ATen's float64 holds it exactly; and a float64 value cast to
    an integer or bool would be rounded to float32 first (2.9999999999 -> 3.0 -> 3 where
    ATen truncates to 2, 1e-50 -> 0.0 -> False), so those casts stay on the CPU too.
    float64 -> float32 / float16 is delegated: rounding to float32 is what ATen does."""
    src, out = node.args[0].dtype, node.outputs[0].dtype
    if out == "float64" and src in ("int32", "int64"):
        return (f"{src} to float64: the device holds float64 in float32, which rounds "
                f"integers past 2**24")
    if src == "float64" and out not in ("float64", "float32", "float16"):
        return (f"float64 to {out}: the device holds float64 in float32, which would "
                f"round the value before the conversion (2.9999999999 would give 3)")
    return None


register(OpSpec(name="aten.clone.default", dtypes=MOVE_DTYPES, impl=_flat_impl,
                shape_fn=same_shape, rules=(same_dtype, _memory_format_rule(1)),
                notes="alias or copy", may_alias=True))
register(OpSpec(name="aten._to_copy.default", dtypes=CONVERT_DTYPES, impl=_flat_impl,
                shape_fn=same_shape, rules=(_to_copy_rule, _memory_format_rule(6)),
                notes="dtype conversion as torch converts (float->int truncates)"))
# ExecuTorch's dim-order-aware _to_copy: our tensors are always contiguous, so a
# dim_order only changes strides, never values; the dtype conversion is _to_copy's
# (an ExecuTorch blob's int -> float64 included: ET-VK holds float64 in float32 too).
register(OpSpec(name="dim_order_ops._to_dim_order_copy.default", dtypes=CONVERT_DTYPES,
                impl=_flat_impl, shape_fn=same_shape,
                notes="ExecuTorch name of _to_copy (dim_order: values unchanged)"))
# ExecuTorch's names for a plain copy: alias_copy(self) (a functionalised alias) and the
# dim-order-aware clone(self, non_blocking, dim_order): contiguous buffers, so a
# dim_order never changes values.
register(OpSpec(name="aten.alias_copy.default", dtypes=MOVE_DTYPES, impl=_flat_impl,
                shape_fn=same_shape, rules=(same_dtype,),
                notes="ExecuTorch's functional alias (alias or copy)", may_alias=True))
register(OpSpec(name="dim_order_ops._clone_dim_order.default", dtypes=MOVE_DTYPES,
                impl=_flat_impl, shape_fn=same_shape, rules=(same_dtype,),
                notes="ExecuTorch name of clone (dim_order: values unchanged)",
                may_alias=True))
# ET-VK copies each constant into the tensor its consumer reads with et_vk.prepack
# (args: constant, out); on our buffers that is a plain copy.
register(OpSpec(name="et_vk.prepack.default", dtypes=MOVE_DTYPES, impl=_flat_impl,
                shape_fn=same_shape, rules=(same_dtype,),
                notes="ExecuTorch's constant prepacking (a copy here)"))
declare_copy([(dt, dt) for dt in MOVE_DTYPES])
declare_copy([(o, i) for o in CONVERT_DTYPES for i in CONVERT_DTYPES])
