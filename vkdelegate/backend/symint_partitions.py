"""Partitions in which no SymInt crosses a delegate boundary.

A SymInt (a size known only at run time: ``sym_size.int`` and the arithmetic on it) is
a value of the delegate that uses it: its node must sit in the same partition as every
node reading it, so that it is neither a delegate input nor a delegate output (the
Vulkan runtime takes and returns tensors only; ExecuTorch's Vulkan partitioner keeps
its SymInt nodes with their users too). torch.fx's CapabilityBasedPartitioner does not
know this, so ``partitions_keeping_symints`` proposes, finds the nodes whose SymInts
would cross, keeps them on the CPU and proposes again until none does. The
``local_symints`` pass gives each consumer its own SymInt nodes beforehand, so this
rarely removes anything.
"""
from __future__ import annotations

import operator

import torch
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from vkdelegate.backend.node_specs import dim_upper_bound


def is_symint(node) -> bool:
    """Whether fx node ``node`` produces a SymInt."""
    return isinstance(node, torch.fx.Node) and isinstance(node.meta.get("val"), torch.SymInt)


def symint_args(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The SymInt-producing nodes ``node`` reads (lists searched)."""
    found = []

    def visit(a):
        if isinstance(a, (list, tuple)):
            for x in a:
                visit(x)
        elif isinstance(a, dict):
            for x in a.values():
                visit(x)
        elif is_symint(a):
            found.append(a)
    visit(node.args)
    visit(node.kwargs)
    return found


def monotone_reason(node: torch.fx.Node, spec, described) -> list[str]:
    """[reason] when the op's number at its arguments' upper bounds is not the node's
    own upper bound (``16 - s``): a delegate is checked at load by evaluating its
    SymInts at the declared (upper-bound) sizes, so those must agree; else []."""
    value = spec.shape_fn(list(described.args))
    upper = dim_upper_bound(node.meta["val"])[0]
    if value != upper:
        return [f"gives {value} at the upper bounds of its arguments but ranges up to "
                f"{upper} (not monotone in the input sizes)"]
    return []


class _Support(OperatorSupportBase):
    """Adapter for CapabilityBasedPartitioner: reads the decisions made beforehand."""

    def __init__(self, supported: set):
        super().__init__()
        self.supported = supported

    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        return node.name in self.supported


def _crossing(partitions, where: dict) -> dict:
    """node name -> reason, for partition members whose SymInts would cross."""
    bad = {}
    for i, p in enumerate(partitions):
        for n in p.nodes:
            for a in symint_args(n):
                if where.get(a.name) != i:
                    bad[n.name] = (f"reads the symbolic size {a.name}, which would "
                                   f"enter its delegate from outside")
            if is_symint(n) and any(where.get(u.name) != i for u in n.users):
                bad[n.name] = ("its symbolic size is read outside its partition (a "
                               "SymInt is never a delegate output)")
    return bad


def partitions_keeping_symints(gm: torch.fx.GraphModule, supported: set):
    """(partitions, node name -> partition index, node name -> reason it was taken
    out) for the supported node names ``supported`` (not modified)."""
    supported = set(supported)
    removed: dict[str, str] = {}
    while True:
        partitioner = CapabilityBasedPartitioner(gm, _Support(supported),
                                                 allows_single_node_partition=True)
        partitions = [p for p in partitioner.propose_partitions() if p.nodes]
        where = {n.name: i for i, p in enumerate(partitions) for n in p.nodes}
        bad = _crossing(partitions, where)
        if not bad:
            return partitions, where, removed
        removed.update(bad)
        supported -= set(bad)
        # A getitem is supported only with its producer.
        for node in gm.graph.nodes:
            if node.op == "call_function" and node.target is operator.getitem and \
                    node.name in supported and node.args[0].name not in supported:
                supported.discard(node.name)
