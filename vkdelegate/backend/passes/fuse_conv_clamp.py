"""Fuse a convolution and the clamp after it into ``et_vk.conv_with_clamp``.

``relu(conv(x))``, ``hardtanh(conv(x), lo, hi)`` (ReLU6) and ``clamp(conv(x), lo, hi)``
become one op that clamps while writing its output: the intermediate tensor is never
written to device memory and read back. Runs only when the registry has the fused op
(``vkdelegate.backend.custom_ops`` declares it), and only when nothing else
reads the convolution's output.
"""
from __future__ import annotations

import torch

from vkdelegate.backend.custom_ops import CONV_WITH_CLAMP
from vkdelegate.ops import registry

aten = torch.ops.aten

FUSED = CONV_WITH_CLAMP.name


def _bounds(node: torch.fx.Node):
    """(output_min, output_max) of a clamp-like node, or None if it is not one."""
    if node.op != "call_function":
        return None
    if node.target == aten.relu.default:
        return 0.0, None
    if node.target == aten.hardtanh.default:
        lo = node.kwargs.get("min_val", node.args[1] if len(node.args) > 1 else -1.0)
        hi = node.kwargs.get("max_val", node.args[2] if len(node.args) > 2 else 1.0)
        return lo, hi
    if node.target == aten.clamp.default:
        lo = node.kwargs.get("min", node.args[1] if len(node.args) > 1 else None)
        hi = node.kwargs.get("max", node.args[2] if len(node.args) > 2 else None)
        return lo, hi
    return None


def fuse_conv_clamp(pg) -> bool:
    """Replace each conv -> relu/hardtanh/clamp pair by the fused op; True if any."""
    if FUSED not in registry.load_all():
        return False
    fused_op = CONV_WITH_CLAMP.overload()
    changed = False
    graph = pg.gm.graph
    for clamp in list(graph.nodes):
        bounds = _bounds(clamp)
        if bounds is None or not isinstance(clamp.args[0], torch.fx.Node):
            continue
        conv = clamp.args[0]
        if conv.target != aten.convolution.default or len(conv.users) != 1:
            continue
        if any(isinstance(b, torch.fx.Node) for b in bounds):
            continue
        with graph.inserting_before(clamp):
            fused = graph.call_function(fused_op, tuple(conv.args) + bounds)
        fused.meta = dict(clamp.meta)
        clamp.replace_all_uses_with(fused)
        graph.erase_node(clamp)
        graph.erase_node(conv)
        changed = True
    return changed
