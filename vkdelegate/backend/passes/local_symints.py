"""Give every node that takes symbolic sizes its own SymInt nodes, read from its own
inputs where possible.

torch.export computes a dynamic size once (``s = sym_size(x, 1)``) and every view,
expand, arange, slice or full that needs it reads that one node, across the whole
graph. A SymInt must live in the partition of the nodes reading it
(``symint_partitions``), so one shared SymInt would tie all its users into one
partition or keep them on the CPU. This pass rebuilds, for each consumer, the SymInts
it reads: a size equal to a dim of one of the consumer's tensor inputs (the same
symbolic expression) becomes ``sym_size(input, dim)``; the arithmetic on sizes torch
emits (operator.add/sub/mul/floordiv) is copied with its operands rebuilt the same
way; ``sym_numel`` becomes the product of its tensor's sizes; a ``sym_size`` with no
matching input is copied as it is. Sizes of other origins (a value read from a
tensor) are left alone, and their consumers stay on the CPU. The old nodes die when
nothing else reads them.
"""
from __future__ import annotations

import operator

import torch

from vkdelegate.backend.symint_partitions import is_symint

aten = torch.ops.aten
_ARITHMETIC = (operator.add, operator.sub, operator.mul, operator.floordiv)


def _expr(value):
    return value.node.expr if isinstance(value, torch.SymInt) else None


class _Rebuilder:
    """Rebuilds the SymInts of one consumer node, inserting before it."""

    def __init__(self, graph: torch.fx.Graph, consumer: torch.fx.Node):
        self.graph, self.consumer = graph, consumer
        self.tensors = [a for a in consumer.all_input_nodes
                        if isinstance(a.meta.get("val"), torch.Tensor)]
        self.made: dict[torch.fx.Node, torch.fx.Node] = {}

    def _new(self, target, args, val) -> torch.fx.Node:
        with self.graph.inserting_before(self.consumer):
            node = self.graph.call_function(target, tuple(args))
        node.meta["val"] = val
        return node

    def _size_of_input(self, expr):
        for t in self.tensors:
            for d, size in enumerate(t.meta["val"].shape):
                if _expr(size) is not None and _expr(size) == expr:
                    return self._new(aten.sym_size.int, (t, d), size)
        return None

    def rebuild(self, sym: torch.fx.Node):
        """A node giving ``sym``'s value for this consumer, or None to keep ``sym``."""
        if sym in self.made:
            return self.made[sym]
        val = sym.meta["val"]
        node = self._size_of_input(_expr(val))
        if node is None and sym.op == "call_function":
            if sym.target in _ARITHMETIC:
                args = [self.rebuild(a) or a if is_symint(a) else a for a in sym.args]
                node = self._new(sym.target, args, val)
            elif sym.target is aten.sym_size.int:
                node = self._new(sym.target, sym.args, val)
            elif sym.target is aten.sym_numel.default:
                node = self._numel(sym.args[0], val)
        self.made[sym] = node
        return node

    def _numel(self, tensor: torch.fx.Node, val):
        sizes = [s if isinstance(s, int) else self._new(aten.sym_size.int, (tensor, d), s)
                 for d, s in enumerate(tensor.meta["val"].shape)]
        product, static = None, 1
        for s in sizes:
            if isinstance(s, int):
                static *= s
            else:
                product = s if product is None else self._new(
                    operator.mul, (product, s), product.meta["val"] * s.meta["val"])
        if product is None:
            return None  # a static numel: export would have folded it
        return product if static == 1 else self._new(operator.mul, (static, product), val)


def _replace(arg, mapping):
    if isinstance(arg, (list, tuple)):
        return type(arg)(_replace(a, mapping) for a in arg)
    return mapping.get(arg, arg) if isinstance(arg, torch.fx.Node) else arg


def local_symints(pg) -> bool:
    """Rebuild the SymInt arguments of every consumer (see the module docstring);
    True if any node changed."""
    graph = pg.gm.graph
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function" or is_symint(node):
            continue
        syms = [a for a in _flat(node.args) + _flat(list(node.kwargs.values()))
                if is_symint(a)]
        if not syms:
            continue
        rebuilder = _Rebuilder(graph, node)
        mapping = {s: r for s in syms if (r := rebuilder.rebuild(s)) is not None}
        if mapping:
            node.args = _replace(node.args, mapping)
            node.kwargs = {k: _replace(v, mapping) for k, v in node.kwargs.items()}
            changed = True
    return changed


def _flat(args) -> list:
    out = []
    for a in args:
        out.extend(_flat(a) if isinstance(a, (list, tuple)) else [a])
    return out
