"""VkGraph dataclasses -> VK00 flatbuffer bytes, with the flatbuffers ``Builder``.

Fields equal to their schema default are omitted, as flatc does, so our output and
ET-VK's decode the same. Every number is range-checked against its schema type first:
a value that does not fit raises :class:`VkDelegateError` naming the value id or node,
rather than a ``struct.error`` from deep inside the Builder.
"""
from __future__ import annotations

import flatbuffers
import numpy as np

from vkdelegate.errors import VkDelegateError, node_label
from vkdelegate.serialization import vkgraph as vk
from vkdelegate.serialization.schema_slots import FILE_IDENTIFIER, TABLE_FIELDS, slot

# Union type tag of each member of GraphTypes (0 is NONE).
_UNION_TAG = {cls: i + 1 for i, cls in enumerate(vk.GRAPH_TYPES)}

_RANGES = {
    np.int8: (-(1 << 7), (1 << 7) - 1),
    np.uint8: (0, (1 << 8) - 1),
    np.int32: (-(1 << 31), (1 << 31) - 1),
    np.uint32: (0, (1 << 32) - 1),
    np.int64: (-(1 << 63), (1 << 63) - 1),
    np.uint64: (0, (1 << 64) - 1),
}


def _check(value, np_type, what: str) -> int:
    lo, hi = _RANGES[np_type]
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise VkDelegateError(f"{what}: expected an integer, got {value!r}")
    if not lo <= int(value) <= hi:
        raise VkDelegateError(f"{what}: {value} does not fit in {np.dtype(np_type).name}")
    return int(value)


def _vector(b: flatbuffers.Builder, items, np_type, what: str) -> int:
    if np_type is np.bool_ or np_type is np.float64:
        arr = np.asarray(list(items), dtype=np_type)
    else:
        arr = np.asarray([_check(x, np_type, what) for x in items], dtype=np_type)
    return b.CreateNumpyVector(arr)


def _table_vector(b: flatbuffers.Builder, offsets: list[int]) -> int:
    b.StartVector(4, len(offsets), 4)
    for off in reversed(offsets):
        b.PrependUOffsetTRelative(off)
    return b.EndVector()


def _string(b: flatbuffers.Builder, s: str, what: str) -> int:
    if not isinstance(s, str):
        raise VkDelegateError(f"{what}: expected a str, got {type(s).__name__}")
    return b.CreateString(s)


def _write_value(b: flatbuffers.Builder, value, vid: int) -> int:
    """Writes one GraphTypes member table; returns its offset."""
    what = f"value {vid} ({type(value).__name__})"
    name = type(value).__name__
    if isinstance(value, vk.VkTensor):
        dims = _vector(b, value.dims, np.uint32, f"{what} dims")
        b.StartObject(len(TABLE_FIELDS["VkTensor"]))
        b.PrependInt8Slot(slot("VkTensor", "datatype"),
                          _check(int(value.datatype), np.int8, f"{what} datatype"), 0)
        b.PrependUOffsetTRelativeSlot(slot("VkTensor", "dims"), dims, 0)
        b.PrependInt32Slot(slot("VkTensor", "constant_id"),
                           _check(value.constant_id, np.int32, f"{what} constant_id"), 0)
        b.PrependInt32Slot(slot("VkTensor", "mem_obj_id"),
                           _check(value.mem_obj_id, np.int32, f"{what} mem_obj_id"), 0)
        b.PrependUint8Slot(slot("VkTensor", "storage_type"),
                           _check(int(value.storage_type), np.uint8, f"{what} storage_type"),
                           vk.VkStorageType.DEFAULT_STORAGE)
        b.PrependUint8Slot(slot("VkTensor", "memory_layout"),
                           _check(int(value.memory_layout), np.uint8, f"{what} memory_layout"),
                           vk.VkMemoryLayout.DEFAULT_LAYOUT)
        b.PrependInt8Slot(slot("VkTensor", "staging_datatype"),
                          _check(int(value.staging_datatype), np.int8,
                                 f"{what} staging_datatype"), vk.VkDataType.UNSET)
        return b.EndObject()
    if isinstance(value, vk.Null):
        b.StartObject(0)
        return b.EndObject()
    if isinstance(value, vk.String):
        s = _string(b, value.string_val, what)
        b.StartObject(1)
        b.PrependUOffsetTRelativeSlot(0, s, 0)
        return b.EndObject()
    list_types = {vk.IntList: np.int64, vk.DoubleList: np.float64, vk.BoolList: np.bool_,
                  vk.ValueList: np.int32}
    if type(value) in list_types:
        items = _vector(b, value.items, list_types[type(value)], f"{what} items")
        b.StartObject(1)
        b.PrependUOffsetTRelativeSlot(slot(name, "items"), items, 0)
        return b.EndObject()
    b.StartObject(1)
    if isinstance(value, vk.Int):
        b.PrependInt64Slot(0, _check(value.int_val, np.int64, what), 0)
    elif isinstance(value, vk.Bool):
        b.PrependBoolSlot(0, bool(value.bool_val), False)
    elif isinstance(value, vk.Double):
        b.PrependFloat64Slot(0, float(value.double_val), 0.0)
    elif isinstance(value, vk.SymInt):
        b.PrependInt32Slot(0, _check(value.value, np.int32, what), 0)
    else:
        raise VkDelegateError(f"value {vid}: {type(value).__name__} is not a GraphTypes member")
    return b.EndObject()


def _write_bytes(b: flatbuffers.Builder, vb: vk.VkBytes, what: str) -> int:
    key = _string(b, vb.named_key, f"{what} named_key") if vb.named_key is not None else 0
    b.StartObject(len(TABLE_FIELDS["VkBytes"]))
    b.PrependUint64Slot(slot("VkBytes", "offset"), _check(vb.offset, np.uint64, f"{what} offset"), 0)
    b.PrependUint64Slot(slot("VkBytes", "length"), _check(vb.length, np.uint64, f"{what} length"), 0)
    if key:
        b.PrependUOffsetTRelativeSlot(slot("VkBytes", "named_key"), key, 0)
    return b.EndObject()


def graph_to_flatbuffer(graph: vk.VkGraph) -> bytes:
    """Serializes ``graph`` to a VK00 flatbuffer (file identifier ``VK00``).

    Raises VkDelegateError if a field does not fit its schema type (e.g. a dim over
    2**32-1, a non-GraphTypes value), naming the value id, node or constant index.
    """
    b = flatbuffers.Builder(1024)
    # Flatbuffers are built bottom-up: every child object before the table holding it.
    version = _string(b, graph.version, "graph version")
    ops = []
    for op in graph.chain:
        what = node_label(op.node_id, op.name)
        name = _string(b, op.name, f"{what} name")
        args = _vector(b, op.args, np.int32, f"{what} args")
        b.StartObject(len(TABLE_FIELDS["OperatorCall"]))
        b.PrependUint32Slot(slot("OperatorCall", "node_id"),
                            _check(op.node_id, np.uint32, f"{what} node_id"), 0)
        b.PrependUOffsetTRelativeSlot(slot("OperatorCall", "name"), name, 0)
        b.PrependUOffsetTRelativeSlot(slot("OperatorCall", "args"), args, 0)
        ops.append(b.EndObject())
    chain = _table_vector(b, ops)

    value_offsets = []
    for vid, value in enumerate(graph.values):
        member = _write_value(b, value, vid)
        b.StartObject(len(TABLE_FIELDS["VkValue"]))
        b.PrependUint8Slot(slot("VkValue", "value_type"), _UNION_TAG[type(value)], 0)
        b.PrependUOffsetTRelativeSlot(slot("VkValue", "value"), member, 0)
        value_offsets.append(b.EndObject())
    values = _table_vector(b, value_offsets)

    input_ids = _vector(b, graph.input_ids, np.uint32, "input_ids")
    output_ids = _vector(b, graph.output_ids, np.uint32, "output_ids")
    constants = _table_vector(
        b, [_write_bytes(b, c, f"constant {i}") for i, c in enumerate(graph.constants)])
    shaders = _table_vector(
        b, [_write_bytes(b, s, f"shader {i}") for i, s in enumerate(graph.shaders)])

    b.StartObject(len(TABLE_FIELDS["VkGraph"]))
    b.PrependUOffsetTRelativeSlot(slot("VkGraph", "version"), version, 0)
    b.PrependUOffsetTRelativeSlot(slot("VkGraph", "chain"), chain, 0)
    b.PrependUOffsetTRelativeSlot(slot("VkGraph", "values"), values, 0)
    b.PrependUOffsetTRelativeSlot(slot("VkGraph", "input_ids"), input_ids, 0)
    b.PrependUOffsetTRelativeSlot(slot("VkGraph", "output_ids"), output_ids, 0)
    b.PrependUOffsetTRelativeSlot(slot("VkGraph", "constants"), constants, 0)
    b.PrependUOffsetTRelativeSlot(slot("VkGraph", "shaders"), shaders, 0)
    b.PrependUint8Slot(slot("VkGraph", "storage_type_override"),
                       _check(int(graph.storage_type_override), np.uint8, "storage_type_override"),
                       vk.VkStorageType.DEFAULT_STORAGE)
    b.PrependUint8Slot(slot("VkGraph", "memory_layout_override"),
                       _check(int(graph.memory_layout_override), np.uint8,
                              "memory_layout_override"),
                       vk.VkMemoryLayout.DEFAULT_LAYOUT)
    root = b.EndObject()
    b.Finish(root, file_identifier=FILE_IDENTIFIER)
    return bytes(b.Output())
