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
from vkdelegate.backend.passes.residual_add import fuse_adds
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


def fuse_conv_add(pg) -> bool:
    """Replace each convolution -> add pair (see the module docstring) by conv_add;
    True if any."""
    if CONV_ADD.name not in registry.load_all():
        return False
    fused_op = CONV_ADD.overload()

    def match(node):
        args = _conv_args(node)
        return None if args is None else (fused_op, args)
    return fuse_adds(pg.gm.graph, match)
