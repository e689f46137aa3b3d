"""``index_put(x, indices, v, accumulate=True)`` whose indices are constants naming each
element at most once -> ``index_put(x, indices, x[indices] + v)`` (accumulate False).

With unique positions, accumulating adds each value once to its element: exactly the
gather, add and store of the rewrite (float addition commutes, so the bits are
eager's). The delegate has no scatter-add (a float atomic add is not core Vulkan), so
such a node would stay on the CPU; ``nn.functional.fold`` with non-overlapping patches
(MobileViT v2 folds its patches back so) decomposes to exactly this, its indices
computed from ``arange``s that ``fold_constants`` makes constants.

Rewritten only where every index is None or an integer constant (no boolean mask) on
adjacent dims, the index tuples, after broadcasting and wrapping negative values by
the dim's size, are all distinct and within the dims, and there are at most
MAX_POSITIONS of them. Several index tensors become one constant index over their
merged dims (the delegate's index_put takes one index tensor): x viewed with those
dims merged, gathered, added to, stored into and viewed back.
Runs after fold_constants (which makes the indices constants).
"""
from __future__ import annotations

import math

import torch

from vkdelegate.backend.passes.fold_constants import INTEGER_DTYPES

aten = torch.ops.aten

#: The most index tuples checked for uniqueness at lowering.
MAX_POSITIONS = 1 << 22



def _flat_positions(x_shape, indices):
    """(first dim d0, last dim d1, the positions as one int64 index over the merged dims
    d0..d1 with every value wrapped into its dim) for index tensors (None: a whole dim)
    on adjacent dims naming every element of a tensor of ``x_shape`` at most once and
    all within its dims; else None."""
    given = [(d, t) for d, t in enumerate(indices) if t is not None]
    if not given or any(t.dtype not in INTEGER_DTYPES for _, t in given):
        return None
    dims = [d for d, _ in given]
    if dims != list(range(dims[0], dims[-1] + 1)):
        return None  # ATen moves separated advanced-index dims first: not handled
    try:
        tensors = torch.broadcast_tensors(*[t for _, t in given])
    except RuntimeError:
        return None
    if tensors[0].numel() > MAX_POSITIONS:
        return None
    flat = torch.zeros(tensors[0].shape, dtype=torch.int64)
    for (d, _), t in zip(given, tensors):
        size = x_shape[d]
        if bool(((t < -size) | (t >= size)).any()):
            return None
        flat = flat * size + torch.remainder(t.to(torch.int64), size)
    if flat.unique().numel() != flat.numel():
        return None
    return dims[0], dims[-1], flat.contiguous()


def unique_index_put(pg) -> bool:
    """Rewrite each accumulating index_put with unique constant positions (module
    docstring); True if any."""
    graph = pg.gm.graph
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not aten.index_put.default \
                or node.kwargs or len(node.args) != 4 or node.args[3] is not True:
            continue
        x, indices, values, _ = node.args
        x_val = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
        if not isinstance(x_val, torch.Tensor) or \
                not all(isinstance(s, int) for s in x_val.shape):
            continue
        if not all(t is None or (isinstance(t, torch.fx.Node) and t.op == "placeholder"
                                 and t.name in pg.constants) for t in indices):
            continue
        shape = tuple(x_val.shape)
        found = _flat_positions(shape, [None if t is None else pg.constants[t.name]
                                        for t in indices])
        if found is None:
            continue
        d0, d1, flat = found
        merged = list(shape[:d0]) + [math.prod(shape[d0:d1 + 1])] + list(shape[d1 + 1:])
        index = pg.add_constant(f"{node.name}_positions", flat)
        mode = x_val.fake_mode
        with graph.inserting_before(node):
            xm = _call(graph, mode, aten.view.default, (x, merged))
            where = [None] * d0 + [index]
            gathered = _call(graph, mode, aten.index.Tensor, (xm, where))
            summed = _call(graph, mode, aten.add.Tensor, (gathered, values))
            stored = _call(graph, mode, aten.index_put.default, (xm, where, summed, False))
            out = _call(graph, mode, aten.view.default, (stored, list(shape)))
        node.replace_all_uses_with(out)
        graph.erase_node(node)
        changed = True
    return changed


def _call(graph, mode, target, args):
    """A new call of ``target`` on ``args`` with its fake value in meta["val"]."""
    node = graph.call_function(target, args)
    fake = torch.fx.node.map_arg(args, lambda a: a.meta["val"])
    with mode:
        node.meta["val"] = target(*fake)
    return node
