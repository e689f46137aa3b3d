"""constant_pad_nd: padding with a fill value, negative pads crop.

``pad`` lists (before, after) pairs starting from the LAST dim, as torch.nn.functional.pad
takes them; asymmetric pairs (TF-style SAME padding, e.g. EfficientNet) and negative
values (cropping) follow ATen. The fill value is converted to the tensor's dtype as
torch does (truncated for integer tensors). reflection_pad / replication_pad export as
arange + index.Tensor (see indexing.py, creation.py) after run_decompositions, so they
need no op of their own.
"""
from __future__ import annotations

from vkdelegate.kernels.affine_copy import (MOVE_DTYPES, PAD, CopyDim, CopyPlan,
                                            affine_copy, contiguous_strides, merged, runs)
from vkdelegate.kernels.rules import same_dtype, scalar_reason, shape_from_list
from vkdelegate.ops.registry import NodeSpec, OpSpec, register
from vkdelegate.errors import VkDelegateError
from vkdelegate.runtime.dtypes import acc_type


def pad_pairs(pad, ndim: int) -> list[tuple[int, int]]:
    """(before, after) per dim, outermost first, for a ``pad`` list in torch order."""
    if len(pad) % 2 or len(pad) // 2 > ndim:
        raise VkDelegateError(f"pad {list(pad)}: needs pairs for at most {ndim} dims")
    pairs = [(0, 0)] * ndim
    for k in range(len(pad) // 2):
        pairs[ndim - 1 - k] = (int(pad[2 * k]), int(pad[2 * k + 1]))
    return pairs


def pad_shape(shape, pad) -> tuple:
    """Sizes after constant_pad_nd; VkDelegateError where ATen raises: it crops the
    negative pads first (before, then after), and no crop may exceed what is left."""
    out = []
    for s, (lo, hi) in zip(shape, pad_pairs(pad, len(shape))):
        cropped = s + min(lo, 0)
        if cropped < 0 or cropped + min(hi, 0) < 0 or s + lo + hi < 0:
            raise VkDelegateError(f"constant_pad_nd: pad {list(pad)} crops more than "
                                  f"the sizes {list(shape)} hold")
        out.append(s + lo + hi)
    return tuple(out)


def _impl(b, node):
    x_id, pad_id, value_id, out_id = node.args
    x, out = b.tensor(x_id), b.tensor(out_id)
    pairs = pad_pairs(b.int_list(pad_id), x.ndim)
    value = b.scalar(value_id)
    value = 0 if value is None else value
    if acc_type(out.dtype) == "int":
        value = int(value) if out.dtype != "bool" else int(bool(value))
    else:
        value = float(value)

    # Unpadded dims copy straight through, and each run of them is one dim of the plan.
    unpadded = [p == (0, 0) for p in pairs]

    def plan():
        out_strides = contiguous_strides(out.shape)
        in_strides = contiguous_strides(x.shape)
        return merged(CopyPlan([
            CopyDim(s, out_strides[i], in_strides[i]) if unpadded[i] else
            CopyDim(s, out_strides[i], in_strides[i], start=-pairs[i][0], mode=PAD,
                    bound=x.shape[i])
            for i, s in enumerate(out.shape)]), runs(unpadded))
    affine_copy(b, out, x, plan, fill=value)


def _value_rule(node: NodeSpec):
    reason = scalar_reason(node.args[2], node.outputs[0].dtype)
    return f"fill {reason}" if reason else None


register(OpSpec(name="aten.constant_pad_nd.default", dtypes=MOVE_DTYPES, impl=_impl,
                shape_fn=shape_from_list(pad_shape), rules=(same_dtype, _value_rule),
                notes="any dims, asymmetric and negative pads, fill value"))
