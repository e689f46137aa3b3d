"""Fuse a convolution and the residual add after it into ``vkdelegate.conv_add``.

Inverted-bottleneck blocks (MobileNetV2, EfficientNet) end in ``add(conv(x), skip)``:
the fused op adds ``skip`` while the convolution writes its output, so the
convolution's result is never written to device memory and read back, and one
dispatch goes. Safe only where the add is exactly that sum, which the pass checks:
``aten.add.Tensor`` with alpha 1 of a convolution (``aten.convolution`` or
``et_vk.conv_with_clamp``, whose clamp comes first, as in the graph) that nothing else
reads, and a tensor of the convolution output's shape and dtype (no broadcasting, no
type promotion); float addition is commutative, so either operand order fuses. Runs
after the clamp fusion and the pad fold (their conv_with_clamp fuses too; padded
convolutions keep their add), only when the registry has the fused op.
"""
from __future__ import annotations

import torch

from vkdelegate.backend.custom_ops import CONV_ADD, CONV_WITH_CLAMP
from vkdelegate.ops import registry

aten = torch.ops.aten


def _conv_args(node) -> "tuple | None":
    """conv_with_clamp's 11 arguments of a fusable convolution node, or None."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function" or node.kwargs:
        return None
    if node.target == aten.convolution.default and len(node.args) == 9:
        return tuple(node.args) + (None, None)
    if node.target == CONV_WITH_CLAMP.overload() and len(node.args) == 11:
        return tuple(node.args)
    return None


def _same_tensor_type(a: torch.fx.Node, b) -> bool:
    va = a.meta.get("val")
    vb = b.meta.get("val") if isinstance(b, torch.fx.Node) else None
    return (isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor) and
            va.dtype == vb.dtype and va.dtype.is_floating_point and
            tuple(va.shape) == tuple(vb.shape))


def fuse_conv_add(pg) -> bool:
    """Replace each convolution -> add pair (see the module docstring) by conv_add;
    True if any."""
    if CONV_ADD.name not in registry.load_all():
        return False
    fused_op = CONV_ADD.overload()
    graph = pg.gm.graph
    changed = False
    for add in list(graph.nodes):
        if add.op != "call_function" or add.target != aten.add.Tensor or \
                len(add.args) != 2 or add.kwargs.get("alpha", 1) != 1:
            continue
        for conv, other in (add.args, add.args[::-1]):
            args = _conv_args(conv)
            if args is None or len(conv.users) != 1 or conv is other or \
                    not _same_tensor_type(conv, other) or not _same_tensor_type(conv, add):
                continue
            with graph.inserting_before(add):
                fused = graph.call_function(fused_op, args + (other,))
            fused.meta = dict(add.meta)
            add.replace_all_uses_with(fused)
            graph.erase_node(add)
            graph.erase_node(conv)
            changed = True
            break
    return changed
