"""Structural checks of a VkGraph: every id it uses refers to something that exists.

Run by the reader on every graph it decodes (so the runtime can index without
checking) and by the writer's callers in tests. Checks ids only; whether an op's
arguments have the right kinds is the op's own business at load time.
"""
from __future__ import annotations

from vkdelegate.errors import VkDelegateError
from vkdelegate.serialization import vkgraph as vk


def _in_range(vid: int, n_values: int, what: str) -> None:
    if not 0 <= vid < n_values:
        raise VkDelegateError(f"{what} refers to value id {vid}, but the graph has "
                              f"{n_values} values (ids 0..{n_values - 1})")


def check_graph(graph: vk.VkGraph) -> None:
    """Raises VkDelegateError naming the first id that is out of range.

    Checked: every op has a name and at least one arg (its output); input_ids,
    output_ids, every op's args, every ValueList item (value ids into
    ``graph.values``) and every tensor's ``constant_id`` (index into
    ``graph.constants`` when >= 0).
    """
    n = len(graph.values)
    for i, vid in enumerate(graph.input_ids):
        _in_range(vid, n, f"input_ids[{i}]")
    for i, vid in enumerate(graph.output_ids):
        _in_range(vid, n, f"output_ids[{i}]")
    for k, op in enumerate(graph.chain):
        if not op.name:
            raise VkDelegateError(f"chain[{k}] (node {op.node_id}) has no operator name")
        if not op.args:
            raise VkDelegateError(f"node {op.node_id} ({op.name}, chain[{k}]) has no args; "
                                  f"its output value id must be the last arg")
        for j, vid in enumerate(op.args):
            _in_range(vid, n, f"node {op.node_id} ({op.name}, chain[{k}]) arg {j}")
    n_const = len(graph.constants)
    for vid, value in enumerate(graph.values):
        if isinstance(value, vk.ValueList):
            for j, item in enumerate(value.items):
                _in_range(item, n, f"value {vid} (ValueList) item {j}")
        elif isinstance(value, vk.VkTensor) and value.constant_id >= n_const:
            raise VkDelegateError(
                f"value {vid} (VkTensor) has constant_id {value.constant_id}, but the "
                f"graph has {n_const} constants")
