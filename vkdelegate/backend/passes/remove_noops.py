"""Remove clones and copies that do not change a value.

``clone``, ``alias`` and a ``_to_copy`` to the same dtype and device only cost a copy
on whichever device runs them. A node whose result is returned from the program is
kept: eager would return a distinct tensor, and the caller may mutate it.
"""
from __future__ import annotations

import torch

aten = torch.ops.aten

_PRESERVING_FORMATS = (None, torch.preserve_format, torch.contiguous_format)


def _is_noop(node: torch.fx.Node) -> bool:
    if node.op != "call_function" or not node.args:
        return False
    src = node.args[0]
    if not isinstance(src, torch.fx.Node):
        return False
    if node.target == aten.alias.default:
        return True
    if node.target == aten.clone.default:
        return node.kwargs.get("memory_format") in _PRESERVING_FORMATS
    if node.target == aten._to_copy.default:
        src_val, val = src.meta.get("val"), node.meta.get("val")
        allowed = {"dtype", "device", "layout", "memory_format"}
        if src_val is None or val is None or set(node.kwargs) - allowed:
            return False
        return (src_val.dtype == val.dtype and src_val.device == val.device
                and node.kwargs.get("memory_format") in _PRESERVING_FORMATS)
    return False


def remove_noop_copies(pg) -> bool:
    """Replace no-op clone/alias/_to_copy nodes by their input; True if any removed."""
    changed = False
    for node in list(pg.gm.graph.nodes):
        if not _is_noop(node):
            continue
        if any(user.op == "output" for user in node.users):
            continue
        node.replace_all_uses_with(node.args[0])
        pg.gm.graph.erase_node(node)
        changed = True
    return changed
