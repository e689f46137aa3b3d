"""``OpTable``: what the runtime needs to know of operators, handed in by the caller.

The runtime does not import the operator registry (vkdelegate/ops/registry.py) or
the op families: a ``DelegateGraph`` gets its ops through an ``OpTable``, and the
default table is built outside runtime/ (``vkdelegate.ops.default_table``), imported
only when no table is passed. So ``import vkdelegate.runtime`` and a graph built
through an injected table import neither torch nor any vkdelegate.backend module.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol, Sequence

from vkdelegate.serialization import vkgraph as g


class RuntimeOp(Protocol):
    """One op as the runtime uses it (``vkdelegate.ops.registry.OpSpec`` is one).

    impl: ``impl(b: NodeBuilder, node: OperatorCall) -> None`` declares the node's
    dispatches at load. shape_fn: ``shape_fn(args) -> tuple | list[tuple]``, the output
    sizes for the node's arguments (tensors with ``.shape``/``.dtype``), run on every
    resize; None: the op cannot run on resized inputs. An op may also have
    ``may_alias`` (True: its output may share its input's memory, OpSpec's meaning;
    absent: False), which the runtime reads to place a ``vkdelegate.narrow_last``
    part and the views of it inside their source (runtime/values.py).
    """

    impl: Callable[[Any, g.OperatorCall], None]
    shape_fn: Optional[Callable[[list], Any]]


@dataclass(frozen=True)
class OpTable:
    """lookup: op name -> RuntimeOp; raises VkDelegateError naming an unknown op.
    check_nodes: ``check_nodes(graph, lookup) -> list[RuntimeOp]``, one per node of
    ``graph.chain`` in order: the load-time checks of an untrusted graph's nodes (the
    default is ``vkdelegate.ops.load_checks.check_nodes``: rules and declared output
    sizes); raises VkDelegateError naming the first bad node. Called before anything
    is allocated or compiled."""

    lookup: Callable[[str], RuntimeOp]
    check_nodes: Callable[[g.VkGraph, Callable[[str], RuntimeOp]], Sequence[RuntimeOp]]

    def ops_for(self, graph: g.VkGraph) -> list[RuntimeOp]:
        """The checked op of every node of ``graph.chain``, in order."""
        return list(self.check_nodes(graph, self.lookup))


def resolve_ops(ops: OpTable | None) -> OpTable:
    """``ops``, or the default table (every registered op, with the registry's load
    checks) when None. The one place the runtime reaches outside itself, lazily."""
    if ops is not None:
        return ops
    from vkdelegate.ops.default_table import default_op_table

    return default_op_table()
