"""Permutes that move only size-1 dims become views.

``x.transpose(1, 2)`` of a one-token ``[1, 1, H, D]`` (an LLM decode step's query, key
and value) and the transpose back before the output projection keep every element at
its offset in a contiguous buffer: only dims of size 1 change places. As
``aten.view`` nodes they share their input's memory (OpSpec ``may_alias``,
serialization/memory_planning.py) instead of running a copy. Static sizes only: a
symbolic size may or may not be 1.
"""
from __future__ import annotations

import torch

aten = torch.ops.aten


def _moves_data(node: torch.fx.Node) -> bool:
    src, dims = node.args[0], node.args[1]
    val = src.meta.get("val") if isinstance(src, torch.fx.Node) else None
    if val is None or not all(isinstance(s, int) for s in val.shape):
        return True
    rank = len(val.shape)
    order = [d % rank for d in dims if val.shape[d % rank] != 1] if rank else []
    return order != sorted(order)


def permute_to_view(pg) -> bool:
    """Replace each ``aten.permute.default`` that moves no element by ``aten.view.default``
    to its output sizes; True if any was replaced."""
    changed = False
    graph = pg.gm.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target != aten.permute.default \
                or _moves_data(node) or node.meta.get("val") is None:
            continue
        with graph.inserting_before(node):
            view = graph.call_function(aten.view.default,
                                       (node.args[0], list(node.meta["val"].shape)))
        view.meta = dict(node.meta)
        node.replace_all_uses_with(view)
        graph.erase_node(node)
        changed = True
    return changed
