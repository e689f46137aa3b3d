"""A readable description of a delegate blob: what ``vkdelegate inspect`` shows.

``describe_blob(data)`` returns plain dicts and lists (JSON-ready): the header regions,
one row per value, the op chain with every argument resolved to a short readable
form, and a constants summary. No torch import; works on blobs from ET-VK as well.
"""
from __future__ import annotations

from typing import Any

from vkdelegate.serialization import vkgraph as vk
from vkdelegate.serialization.blob import read_blob

_SHORT_DTYPE = {**vk.DTYPE_NAMES, vk.VkDataType.UNSET: "unset"}
_MAX_ITEMS = 16  # long lists are shortened in readable forms, not in "items"
_MAX_DEPTH = 8  # nested ValueLists shown in a readable form; deeper ones as [...]
_MAX_SHOWN = 256  # values one readable form shows at most


def _items(items: list) -> str:
    shown = ", ".join(repr(x) for x in items[:_MAX_ITEMS])
    more = f", ... ({len(items)} items)" if len(items) > _MAX_ITEMS else ""
    return f"[{shown}{more}]"


def value_row(vid: int, value: vk.Value) -> dict[str, Any]:
    """One row of the values table: id, kind and the fields that apply to the kind."""
    row: dict[str, Any] = {"id": vid, "kind": type(value).__name__}
    if isinstance(value, vk.VkTensor):
        row.update(dtype=_SHORT_DTYPE.get(value.datatype, str(value.datatype)),
                   dims=list(value.dims), constant_id=value.constant_id,
                   mem_obj_id=value.mem_obj_id, storage_type=value.storage_type.name,
                   memory_layout=value.memory_layout.name)
        if value.staging_datatype != vk.VkDataType.UNSET:
            row["staging_dtype"] = _SHORT_DTYPE[value.staging_datatype]
    elif isinstance(value, (vk.IntList, vk.DoubleList, vk.BoolList, vk.ValueList)):
        row["items"] = list(value.items)
    elif isinstance(value, vk.Int):
        row["value"] = value.int_val
    elif isinstance(value, vk.Double):
        row["value"] = value.double_val
    elif isinstance(value, vk.Bool):
        row["value"] = value.bool_val
    elif isinstance(value, vk.String):
        row["value"] = value.string_val
    elif isinstance(value, vk.SymInt):
        row["value"] = value.value
    return row


def readable(graph: vk.VkGraph, vid: int) -> str:
    """Value ``vid`` in a short form: ``%4:float32[2,5]`` for a tensor (``c0`` for
    constant 0), ``1``, ``1.0``, ``True``, ``None``, ``[1, 0]``, ``%s5=64``, ...

    Bounded for any graph: ``ValueList`` nesting past ``_MAX_DEPTH`` (a list that
    contains itself included) shows as ``[...]``, and one form shows at most
    ``_MAX_SHOWN`` values (lists sharing lists would otherwise grow exponentially).
    """
    return _readable(graph, vid, 0, [_MAX_SHOWN])


def _readable(graph: vk.VkGraph, vid: int, depth: int, budget: list) -> str:
    budget[0] -= 1
    value = graph.values[vid]
    if isinstance(value, vk.ValueList):
        if depth >= _MAX_DEPTH:
            return "[...]"
        shown = []
        for i in value.items[:_MAX_ITEMS]:
            if budget[0] <= 0:
                shown.append("...")
                break
            shown.append(_readable(graph, i, depth + 1, budget))
        more = f", ... ({len(value.items)} items)" if len(value.items) > _MAX_ITEMS else ""
        return "[" + ", ".join(shown) + more + "]"
    if isinstance(value, vk.VkTensor):
        dims = ",".join(str(d) for d in value.dims)
        const = f" c{value.constant_id}" if value.constant_id >= 0 else ""
        return f"%{vid}:{_SHORT_DTYPE.get(value.datatype, '?')}[{dims}]{const}"
    if isinstance(value, (vk.IntList, vk.DoubleList, vk.BoolList)):
        return _items(value.items)
    if isinstance(value, vk.SymInt):
        return f"%s{vid}={value.value}"
    if isinstance(value, vk.Null):
        return "None"
    return repr(value_row(vid, value)["value"])


def describe_blob(data: bytes, named_data: dict[str, bytes] | None = None) -> dict[str, Any]:
    """Description of the blob ``data``; raises VkDelegateError (from ``read_blob``)
    for a malformed blob. ``named_data``, when given, marks which named constants
    resolve."""
    blob = read_blob(data)
    g, h = blob.graph, blob.header
    inline = [c for c in g.constants if not c.is_named]
    named = [c for c in g.constants if c.is_named]
    constants = []
    for i, c in enumerate(g.constants):
        entry: dict[str, Any] = {"id": i, "storage": "named" if c.is_named else "inline",
                                 "length": c.length}
        if c.is_named:
            entry["named_key"] = c.named_key
            if named_data is not None:
                entry["resolved"] = c.named_key in named_data
        else:
            entry["offset"] = c.offset
        constants.append(entry)
    return {
        "size": len(data),
        "header": {"flatbuffer_offset": h.flatbuffer_offset, "flatbuffer_size": h.flatbuffer_size,
                   "constants_offset": h.constants_offset, "constants_size": h.constants_size},
        "graph": {"version": g.version, "value_count": len(g.values), "op_count": len(g.chain),
                  "input_ids": list(g.input_ids), "output_ids": list(g.output_ids),
                  "storage_type_override": g.storage_type_override.name,
                  "memory_layout_override": g.memory_layout_override.name,
                  "shader_count": len(g.shaders)},
        "values": [value_row(i, v) for i, v in enumerate(g.values)],
        "chain": [{"node_id": op.node_id, "name": op.name, "args": list(op.args),
                   "readable": [readable(g, i) for i in op.args]} for op in g.chain],
        "constants": {"count": len(g.constants),
                      "total_bytes": sum(c.length for c in g.constants),
                      "inline": {"count": len(inline), "bytes": sum(c.length for c in inline)},
                      "named": {"count": len(named), "bytes": sum(c.length for c in named)},
                      "items": constants},
    }
