"""Field slots of the VkGraph flatbuffer tables, as declared in ``schema.fbs``.

A flatbuffer table field is addressed by its slot: its position in the table's
declaration, where a union field takes two slots (``<name>_type`` then ``<name>``).
The writer and the reader both address fields through :func:`slot`, so the slot
numbers live in exactly one place; ``tests/serialization/test_schema_agreement.py``
checks this table against ``schema.fbs`` and against code that ``flatc`` generates
from it.
"""
from __future__ import annotations

#: Table name -> field names in declaration order (slot = index).
TABLE_FIELDS: dict[str, tuple[str, ...]] = {
    "OperatorCall": ("node_id", "name", "args"),
    "VkTensor": ("datatype", "dims", "constant_id", "mem_obj_id", "storage_type",
                 "memory_layout", "staging_datatype"),
    "Null": (),
    "Int": ("int_val",),
    "Bool": ("bool_val",),
    "Double": ("double_val",),
    "String": ("string_val",),
    "IntList": ("items",),
    "DoubleList": ("items",),
    "BoolList": ("items",),
    "ValueList": ("items",),
    "SymInt": ("value",),
    "VkValue": ("value_type", "value"),
    "VkBytes": ("offset", "length", "named_key"),
    "VkGraph": ("version", "chain", "values", "input_ids", "output_ids", "constants",
                "shaders", "storage_type_override", "memory_layout_override"),
}

#: The flatbuffer file identifier of a VkGraph (bytes 4..8 of the flatbuffer).
FILE_IDENTIFIER = b"VK00"


def slot(table: str, field: str) -> int:
    """Slot number of ``table.field``; raises KeyError or ValueError for a name not
    in the schema (a programming error, not bad input)."""
    return TABLE_FIELDS[table].index(field)
