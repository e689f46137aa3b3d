"""Structural checks of a VkGraph: every id it uses refers to something that exists,
no ValueList contains itself, and the counts and nesting fit the load limits.

Run by the reader on every graph it decodes (so the runtime can index and recurse
without checking), by DelegateGraph and the reference executor on graphs handed to
them directly, and by the writer's callers in tests. Checks ids and structure only;
whether an op's arguments have the right kinds is the op's own business at load time.
"""
from __future__ import annotations

from vkdelegate.errors import VkDelegateError, printable
from vkdelegate.limits import LoadLimits, check_limit, resolve_limits
from vkdelegate.serialization import vkgraph as vk


def _in_range(vid: int, n_values: int, what: str) -> None:
    if not 0 <= vid < n_values:
        raise VkDelegateError(f"{what} refers to value id {vid}, but the graph has "
                              f"{n_values} values (ids 0..{n_values - 1})")


def check_counts(n_nodes: int, n_values: int, limits: LoadLimits) -> None:
    """ResourceLimitError when a graph has more operator calls than
    ``limits.max_nodes`` or more values than ``limits.max_values`` (checked by the
    reader before it decodes them)."""
    check_limit("the operator call count of the graph", n_nodes, limits.max_nodes,
                "max_nodes", "delegate blob")
    check_limit("the value count of the graph", n_values, limits.max_values, "max_values",
                "delegate blob")


def check_value_nesting(graph: vk.VkGraph, limits: LoadLimits) -> None:
    """VkDelegateError for a ValueList that contains itself (directly or through other
    ValueLists), ResourceLimitError for ValueLists nested deeper than
    ``limits.max_value_depth`` (a ValueList of tensors has depth 1). Iterative, so a
    hostile graph cannot exhaust the Python stack here; the runtime's recursive
    resolution of ValueLists is safe after this check. Item ids must be in range."""
    values = graph.values
    depth: dict[int, int] = {}  # finished ValueLists -> their nesting depth
    on_path: set[int] = set()
    for root, value in enumerate(values):
        if not isinstance(value, vk.ValueList) or root in depth:
            continue
        stack = [(root, 0)]  # (value id, index of its next item to visit)
        on_path.add(root)
        while stack:
            vid, i = stack[-1]
            items = values[vid].items
            if i < len(items):
                stack[-1] = (vid, i + 1)
                item = items[i]
                if not isinstance(values[item], vk.ValueList) or item in depth:
                    continue
                if item in on_path:
                    raise VkDelegateError(
                        f"value {vid} (ValueList) item {i} is value {item}, which "
                        f"contains value {vid}: a ValueList may not contain itself")
                on_path.add(item)
                stack.append((item, 0))
                continue
            stack.pop()
            on_path.discard(vid)
            depth[vid] = 1 + max((depth.get(j, 0) for j in items), default=0)
            check_limit(f"the nesting depth of ValueList value {vid}", depth[vid],
                        limits.max_value_depth, "max_value_depth", "delegate blob")


def check_graph(graph: vk.VkGraph, limits: LoadLimits | None = None) -> None:
    """Raises VkDelegateError naming the first id that is out of range or the first
    ValueList that contains itself; ResourceLimitError (a VkDelegateError) when the
    node or value count or the ValueList nesting exceeds ``limits`` (None: defaults).

    Checked: every op has a name and at least one arg (its output); input_ids,
    output_ids, every op's args, every ValueList item (value ids into
    ``graph.values``) and every tensor's ``constant_id`` (index into
    ``graph.constants`` when >= 0); then ``check_value_nesting`` and
    ``check_symint_order``.
    """
    limits = resolve_limits(limits)
    check_counts(len(graph.chain), len(graph.values), limits)
    n = len(graph.values)
    for i, vid in enumerate(graph.input_ids):
        _in_range(vid, n, f"input_ids[{i}]")
    for i, vid in enumerate(graph.output_ids):
        _in_range(vid, n, f"output_ids[{i}]")
    for k, op in enumerate(graph.chain):
        if not op.name:
            raise VkDelegateError(f"chain[{k}] (node {op.node_id}) has no operator name")
        where = f"node {op.node_id} ({printable(op.name)}, chain[{k}])"
        if not op.args:
            raise VkDelegateError(f"{where} has no args; its output value id must be the "
                                  f"last arg")
        for j, vid in enumerate(op.args):
            _in_range(vid, n, f"{where} arg {j}")
    n_const = len(graph.constants)
    for vid, value in enumerate(graph.values):
        if isinstance(value, vk.ValueList):
            for j, item in enumerate(value.items):
                _in_range(item, n, f"value {vid} (ValueList) item {j}")
        elif isinstance(value, vk.VkTensor) and value.constant_id >= n_const:
            raise VkDelegateError(
                f"value {vid} (VkTensor) has constant_id {value.constant_id}, but the "
                f"graph has {n_const} constants")
    check_value_nesting(graph, limits)
    check_symint_order(graph)


def _symints_in(values, vid: int) -> list[int]:
    """SymInt ids among ``vid`` and, for a ValueList, its items at any depth
    (iterative; the lists are acyclic after ``check_value_nesting``)."""
    found, stack, seen = [], [vid], set()
    while stack:
        v = stack.pop()
        value = values[v]
        if isinstance(value, vk.SymInt):
            found.append(v)
        elif isinstance(value, vk.ValueList) and v not in seen:
            seen.add(v)
            stack.extend(value.items)
    return found


def check_symint_order(graph: vk.VkGraph) -> None:
    """VkDelegateError unless every SymInt a node reads (directly or in a ValueList,
    e.g. a view's sizes) is a graph input or the output of an earlier node, and no
    SymInt is the output of two nodes: a SymInt's number is set by the node producing
    it (ExecuTorch's convention), so a size read before that would be stale."""
    values = graph.values
    defined = {v for v in graph.input_ids if isinstance(values[v], vk.SymInt)}
    for k, op in enumerate(graph.chain):
        where = f"node {op.node_id} ({printable(op.name)}, chain[{k}])"
        for j, vid in enumerate(op.args[:-1]):
            for sym in _symints_in(values, vid):
                if sym not in defined:
                    raise VkDelegateError(f"{where} arg {j} reads SymInt value {sym}, "
                                          f"which no earlier node produces and is not a "
                                          f"graph input")
        out = op.args[-1]
        if isinstance(values[out], vk.SymInt):
            if out in defined:
                raise VkDelegateError(f"{where} produces SymInt value {out}, which a graph "
                                      f"input or an earlier node already provides")
            defined.add(out)
