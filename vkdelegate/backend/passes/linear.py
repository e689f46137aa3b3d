"""Turn ``addmm(bias, x, permute(w, [1, 0]))`` and ``mm(x, permute(w, [1, 0]))`` back
into ``linear(x, w, bias)``.

The core-ATen decomposition splits ``nn.Linear`` into a transpose and a matrix
multiply. A linear op with constant weights lets the runtime pack the weights once at
load time instead of transposing them on every run. The pass only runs when the
registry has ``aten.linear.default``; otherwise it would turn supported mm/addmm nodes
into an unsupported one.
"""
from __future__ import annotations

import torch

from vkdelegate.ops import registry

aten = torch.ops.aten


def _transposed_constant(pg, node) -> "torch.fx.Node | None":
    """The weight placeholder w if ``node`` is ``permute(w, [1, 0])`` of a 2-D constant."""
    if not (isinstance(node, torch.fx.Node) and node.op == "call_function"
            and node.target == aten.permute.default):
        return None
    src, dims = node.args[0], list(node.args[1])
    if dims != [1, 0] or not isinstance(src, torch.fx.Node):
        return None
    if src.op != "placeholder" or src.name not in pg.constants:
        return None
    return src


def _match(pg, node):
    """(x, weight, bias) of an addmm/mm node computing a linear layer, or None."""
    if node.op != "call_function":
        return None
    if node.target == aten.addmm.default:
        if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
            return None
        bias, x, wt = node.args[:3]
        bias_val = bias.meta.get("val") if isinstance(bias, torch.fx.Node) else None
        if bias_val is None or bias_val.dim() != 1:
            return None
    elif node.target == aten.mm.default:
        bias = None
        x, wt = node.args[:2]
    else:
        return None
    weight = _transposed_constant(pg, wt)
    return None if weight is None else (x, weight, bias)


def addmm_to_linear(pg) -> bool:
    """Rewrite matched addmm/mm nodes as aten.linear.default; True if any changed."""
    if "aten.linear.default" not in registry.load_all():
        return False
    changed = False
    graph = pg.gm.graph
    for node in list(graph.nodes):
        match = _match(pg, node)
        if match is None:
            continue
        x, weight, bias = match
        with graph.inserting_before(node):
            linear = graph.call_function(aten.linear.default, (x, weight, bias))
        linear.meta = dict(node.meta)
        node.replace_all_uses_with(linear)
        graph.erase_node(node)
        changed = True
    return changed
