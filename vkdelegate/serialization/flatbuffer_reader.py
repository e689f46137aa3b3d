"""VK00 flatbuffer bytes -> VkGraph dataclasses, verifying as it reads.

Every offset, vector and string is bounds-checked (:mod:`flatbuffer_view`), union tags
and enum values must be ones the schema declares, and the ids the graph uses (op args,
input/output ids, ValueList items, constant ids) must index existing values or
constants, no ValueList may contain itself, and the node and value counts and the
ValueList nesting must fit the load limits
(:func:`vkdelegate.serialization.graph_checks.check_graph`; the counts are checked
before the nodes and values are decoded). Anything else raises
:class:`VkDelegateError` naming the problem and the byte offset or id.
"""
from __future__ import annotations

from vkdelegate.errors import VkDelegateError
from vkdelegate.serialization import vkgraph as vk
from vkdelegate.serialization.flatbuffer_view import FlatbufferView, TableView
from vkdelegate.limits import LoadLimits, resolve_limits
from vkdelegate.serialization.graph_checks import check_counts, check_graph
from vkdelegate.serialization.schema_slots import FILE_IDENTIFIER, slot

_LIST_FORMATS = {"IntList": "q", "DoubleList": "d", "BoolList": "?", "ValueList": "i"}


def _enum(enum_cls, raw: int, what: str):
    try:
        return enum_cls(raw)
    except ValueError:
        raise VkDelegateError(f"{what} is {raw}, not a {enum_cls.__name__} value") from None


def _read_tensor(t: TableView, what: str) -> vk.VkTensor:
    s = lambda f: slot("VkTensor", f)  # noqa: E731
    return vk.VkTensor(
        datatype=_enum(vk.VkDataType, t.scalar(s("datatype"), "b", 0, "datatype"),
                       f"{what} datatype"),
        dims=t.vector(s("dims"), "I", "dims"),
        constant_id=t.scalar(s("constant_id"), "i", 0, "constant_id"),
        mem_obj_id=t.scalar(s("mem_obj_id"), "i", 0, "mem_obj_id"),
        storage_type=_enum(vk.VkStorageType,
                           t.scalar(s("storage_type"), "B", 255, "storage_type"),
                           f"{what} storage_type"),
        memory_layout=_enum(vk.VkMemoryLayout,
                            t.scalar(s("memory_layout"), "B", 255, "memory_layout"),
                            f"{what} memory_layout"),
        staging_datatype=_enum(vk.VkDataType,
                               t.scalar(s("staging_datatype"), "b", 127, "staging_datatype"),
                               f"{what} staging_datatype"),
    )


def _read_value(v: TableView, vid: int) -> vk.Value:
    what = f"value {vid}"
    tag = v.scalar(slot("VkValue", "value_type"), "B", 0, "value_type")
    if not 1 <= tag <= len(vk.GRAPH_TYPES):
        raise VkDelegateError(f"{what} has union type tag {tag}; GraphTypes tags are "
                              f"1..{len(vk.GRAPH_TYPES)}")
    cls = vk.GRAPH_TYPES[tag - 1]
    t = v.table(slot("VkValue", "value"), "value")
    if t is None:
        raise VkDelegateError(f"{what} ({cls.__name__}) has a type tag but no table")
    name = cls.__name__
    if cls is vk.VkTensor:
        return _read_tensor(t, what)
    if cls is vk.Null:
        return vk.Null()
    if name in _LIST_FORMATS:
        items = t.vector(slot(name, "items"), _LIST_FORMATS[name], "items")
        return cls(items=[bool(x) for x in items] if cls is vk.BoolList else items)
    if cls is vk.Int:
        return vk.Int(t.scalar(0, "q", 0, "int_val"))
    if cls is vk.Double:
        return vk.Double(t.scalar(0, "d", 0.0, "double_val"))
    if cls is vk.Bool:
        return vk.Bool(bool(t.scalar(0, "B", 0, "bool_val")))
    if cls is vk.SymInt:
        return vk.SymInt(t.scalar(0, "i", 0, "value"))
    return vk.String(t.string(0, "string_val") or "")


def _read_bytes(t: TableView) -> vk.VkBytes:
    return vk.VkBytes(offset=t.scalar(slot("VkBytes", "offset"), "Q", 0, "offset"),
                      length=t.scalar(slot("VkBytes", "length"), "Q", 0, "length"),
                      named_key=t.string(slot("VkBytes", "named_key"), "named_key"))


def graph_from_flatbuffer(buf: bytes | memoryview, base: int = 0,
                          limits: LoadLimits | None = None) -> vk.VkGraph:
    """Parses and verifies a VK00 flatbuffer; returns the VkGraph.

    ``base`` is the flatbuffer's offset in its file, added to byte offsets in errors.
    ``limits``: the load limits (None: the defaults) on node and value counts and
    ValueList nesting.

    Raises VkDelegateError for a wrong file identifier, an offset/vector/string outside
    the buffer, an unknown union tag or enum value, an id out of range or a ValueList
    that contains itself; ResourceLimitError for a graph over ``limits``.
    """
    limits = resolve_limits(limits)
    fb = FlatbufferView(buf, "VkGraph flatbuffer", base)
    g = fb.root(FILE_IDENTIFIER, "VkGraph")
    s = lambda f: slot("VkGraph", f)  # noqa: E731
    # Before decoding: a small flatbuffer can repeat one table offset millions of times.
    check_counts(g.length(s("chain"), "chain"), g.length(s("values"), "values"), limits)
    chain = []
    for i, t in enumerate(g.tables(s("chain"), "chain")):
        chain.append(vk.OperatorCall(
            node_id=t.scalar(slot("OperatorCall", "node_id"), "I", 0, "node_id"),
            name=t.string(slot("OperatorCall", "name"), "name") or "",
            args=t.vector(slot("OperatorCall", "args"), "i", "args")))
    graph = vk.VkGraph(
        version=g.string(s("version"), "version") or "",
        chain=chain,
        values=[_read_value(t, i) for i, t in enumerate(g.tables(s("values"), "values"))],
        input_ids=g.vector(s("input_ids"), "I", "input_ids"),
        output_ids=g.vector(s("output_ids"), "I", "output_ids"),
        constants=[_read_bytes(t) for t in g.tables(s("constants"), "constants")],
        shaders=[_read_bytes(t) for t in g.tables(s("shaders"), "shaders")],
        storage_type_override=_enum(
            vk.VkStorageType, g.scalar(s("storage_type_override"), "B", 255, "storage_type_override"),
            "storage_type_override"),
        memory_layout_override=_enum(
            vk.VkMemoryLayout,
            g.scalar(s("memory_layout_override"), "B", 255, "memory_layout_override"),
            "memory_layout_override"),
    )
    check_graph(graph, limits)
    return graph
