"""Remove clones and copies that do not change a value, and dtype-only metadata asserts.

``clone``, ``alias`` and a ``_to_copy`` to the same dtype and device only cost a copy
on whichever device runs them. A node whose result is returned from the program is
kept: eager would return a distinct tensor, and the caller may mutate it.

``aten._assert_tensor_metadata(t, size=None, stride=None, dtype=D)`` is what export
leaves of a ``.to(D)`` (HF models write ``mask.to(torch.bool)``). A tensor's dtype is
fixed by the exported graph, so when the node's value already has dtype D the assert
holds on every call; it is removed, and with it a CPU island between two partitions.
Asserts on sizes or strides, or on a device or layout the value does not have, are kept.

A clone or ``_to_copy`` to ``channels_last`` (``channels_last_3d``) changes only the
strides: every op of an exported graph computes on logical elements, so its readers
see the same values either way, and the delegate stores every tensor contiguously
anyway. It is removed too, unless the graph reads raw storage somewhere
(``as_strided``, whose result depends on the strides) or returns it.
"""
from __future__ import annotations

import torch

aten = torch.ops.aten

_PRESERVING_FORMATS = (None, torch.preserve_format, torch.contiguous_format)
#: Formats that change only the strides (module docstring).
_LAYOUT_FORMATS = (torch.channels_last, torch.channels_last_3d)
_STORAGE_READERS = (aten.as_strided.default, aten.as_strided_copy.default,
                    aten.as_strided_scatter.default)


def _is_noop(node: torch.fx.Node, formats=_PRESERVING_FORMATS) -> bool:
    if node.op != "call_function" or not node.args:
        return False
    src = node.args[0]
    if not isinstance(src, torch.fx.Node):
        return False
    if node.target == aten.alias.default:
        return True
    if node.target == aten.clone.default:
        return node.kwargs.get("memory_format") in formats
    if node.target == aten._to_copy.default:
        src_val, val = src.meta.get("val"), node.meta.get("val")
        allowed = {"dtype", "device", "layout", "memory_format"}
        if src_val is None or val is None or set(node.kwargs) - allowed:
            return False
        return (src_val.dtype == val.dtype and src_val.device == val.device
                and node.kwargs.get("memory_format") in formats)
    return False


def _is_static_dtype_assert(node: torch.fx.Node) -> bool:
    """An ``_assert_tensor_metadata`` that only checks a dtype the value has statically."""
    if node.op != "call_function" or node.target != aten._assert_tensor_metadata.default:
        return False
    names = ("a", "size", "stride", "dtype")
    bound = dict(zip(names, node.args)) | dict(node.kwargs)
    src = bound.get("a")
    val = src.meta.get("val") if isinstance(src, torch.fx.Node) else None
    extra = set(bound) - set(names) - {"device", "layout"}
    if val is None or extra or bound.get("device", val.device) != val.device \
            or bound.get("layout", val.layout) != val.layout:
        return False
    return (bound.get("size") is None
            and bound.get("stride") is None and bound.get("dtype") == val.dtype
            and not node.users)


def remove_noop_copies(pg) -> bool:
    """Replace no-op clone/alias/_to_copy nodes by their input and drop dtype asserts
    that hold statically; True if any removed."""
    changed = False
    formats = _PRESERVING_FORMATS
    if not any(n.op == "call_function" and n.target in _STORAGE_READERS
               for n in pg.gm.graph.nodes):
        formats = _PRESERVING_FORMATS + _LAYOUT_FORMATS
    for node in list(pg.gm.graph.nodes):
        if _is_static_dtype_assert(node):
            pg.gm.graph.erase_node(node)
            changed = True
            continue
        if not _is_noop(node, formats):
            continue
        if any(user.op == "output" for user in node.users):
            continue
        node.replace_all_uses_with(node.args[0])
        pg.gm.graph.erase_node(node)
        changed = True
    return changed
