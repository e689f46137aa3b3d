"""In-memory model of the VkGraph flatbuffer (``vkdelegate/schema/schema.fbs``).

Plain dataclasses, one per schema table, with the schema's field names, order and
defaults. The writer and reader in this package convert between these objects and the
VK00 flatbuffer; the builder creates them from a torch.export graph; the runtime
executes them. No torch import here.

Conventions (ExecuTorch Vulkan backend, see docs/DESIGN.md section 3):
- ``OperatorCall.args`` are value ids in ATen schema order; the output id is last.
- ``VkTensor.constant_id >= 0`` indexes ``VkGraph.constants``; ``mem_obj_id >= 0``
  means tensors with the same id share one allocation.
- ``VkBytes.offset == NAMED_OFFSET`` means "look up ``named_key`` in the named data".
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field, make_dataclass
from typing import Mapping, Union

from vkdelegate import dtypes
from vkdelegate.errors import VkDelegateError

#: ``VkBytes.offset`` marking a constant stored outside the blob, keyed by ``named_key``.
NAMED_OFFSET = (1 << 64) - 1


#: The schema's VkDataType (BOOL = 0, ... INT64 = 7, UNSET = 127), from the dtype table.
VkDataType = enum.IntEnum("VkDataType", [
    *sorted(((n.upper(), w) for w, n in dtypes.WIRE_NAMES.items()), key=lambda e: e[1]),
    ("UNSET", dtypes.WIRE_UNSET)], module=__name__)


class VkStorageType(enum.IntEnum):
    BUFFER = 0
    TEXTURE_3D = 1
    TEXTURE_2D = 2
    DEFAULT_STORAGE = 255


class VkMemoryLayout(enum.IntEnum):
    TENSOR_WIDTH_PACKED = 0
    TENSOR_HEIGHT_PACKED = 1
    TENSOR_CHANNELS_PACKED = 2
    PACKED_INT8_4W4C = 3
    PACKED_INT8_4H4W = 4
    PACKED_INT8_4W = 5
    PACKED_INT8_4C = 6
    PACKED_INT8_4C1W = 8
    PACKED_INT8_CONV2D = 9
    DEFAULT_LAYOUT = 255


#: numpy dtype name for each VkDataType (the dtype names used across vkdelegate).
DTYPE_NAMES = {VkDataType(w): n for w, n in sorted(dtypes.WIRE_NAMES.items())}


@dataclass
class OperatorCall:
    node_id: int
    name: str
    args: list[int] = field(default_factory=list)


@dataclass
class VkTensor:
    datatype: VkDataType
    dims: list[int]
    constant_id: int = -1
    mem_obj_id: int = -1
    storage_type: VkStorageType = VkStorageType.DEFAULT_STORAGE
    memory_layout: VkMemoryLayout = VkMemoryLayout.DEFAULT_LAYOUT
    staging_datatype: VkDataType = VkDataType.UNSET


@dataclass(frozen=True)
class Null:
    pass


def _one_field_table(name: str, field_name: str, type_, frozen: bool) -> type:
    """The dataclass of a one-field schema table (``Int { int_val: long; }``)."""
    cls = make_dataclass(name, [(field_name, type_)], frozen=frozen)
    cls.__module__ = __name__
    return cls


# The scalar values (frozen: a value is never edited in place) and the lists.
Int = _one_field_table("Int", "int_val", int, frozen=True)
Bool = _one_field_table("Bool", "bool_val", bool, frozen=True)
Double = _one_field_table("Double", "double_val", float, frozen=True)
String = _one_field_table("String", "string_val", str, frozen=True)
IntList = _one_field_table("IntList", "items", list[int], frozen=False)
DoubleList = _one_field_table("DoubleList", "items", list[float], frozen=False)
BoolList = _one_field_table("BoolList", "items", list[bool], frozen=False)
ValueList = _one_field_table("ValueList", "items", list[int], frozen=False)


@dataclass
class SymInt:
    value: int


#: Members of the ``GraphTypes`` union, in schema order (union type tag = index + 1).
GRAPH_TYPES = (Null, Int, Double, Bool, VkTensor, IntList, DoubleList, BoolList,
               ValueList, String, SymInt)

Value = Union[Null, Int, Double, Bool, VkTensor, IntList, DoubleList, BoolList,
              ValueList, String, SymInt]


@dataclass
class VkBytes:
    offset: int
    length: int
    named_key: str | None = None

    @property
    def is_named(self) -> bool:
        return self.offset == NAMED_OFFSET


@dataclass
class VkGraph:
    version: str = "0"
    chain: list[OperatorCall] = field(default_factory=list)
    values: list[Value] = field(default_factory=list)
    input_ids: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    constants: list[VkBytes] = field(default_factory=list)
    shaders: list[VkBytes] = field(default_factory=list)
    storage_type_override: VkStorageType = VkStorageType.DEFAULT_STORAGE
    memory_layout_override: VkMemoryLayout = VkMemoryLayout.DEFAULT_LAYOUT


@dataclass
class DelegateBlob:
    """A decoded delegate blob: the graph plus the raw constants section.

    ``constant_bytes(i)`` resolves ``graph.constants[i]`` to bytes, from the blob's
    constants section or, for named constants, from ``named_data``.
    """

    graph: VkGraph
    constants_section: bytes | memoryview = b""
    #: The parsed VH00 header (``header.BlobHeader``) when read from bytes, else None.
    header: object | None = None

    def constant_bytes(self, i: int, named_data: Mapping[str, bytes] | None = None):
        """Bytes of ``graph.constants[i]``: a slice of the constants section for an
        inline constant, or ``named_data[named_key]`` for a named one.

        Raises VkDelegateError naming the constant id (and key) when ``i`` is out of
        range, the bytes lie outside the constants section, or a named constant is
        missing from ``named_data`` or has a different length than recorded.
        """
        n = len(self.graph.constants)
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n:
            raise VkDelegateError(f"constant id {i!r} out of range: the graph has {n} constants")
        c = self.graph.constants[i]
        if c.is_named:
            key = c.named_key
            if key is None:
                raise VkDelegateError(f"constant {i} is named (offset 2**64-1) but has no named_key")
            if named_data is None or key not in named_data:
                raise VkDelegateError(f"constant {i}: named data {key!r} was not provided")
            data = named_data[key]
            if len(data) != c.length:
                raise VkDelegateError(f"constant {i}: named data {key!r} has {len(data)} "
                                      f"bytes, the graph expects {c.length}")
            return data
        end = c.offset + c.length
        if end > len(self.constants_section):
            raise VkDelegateError(
                f"constant {i}: bytes [{c.offset}, {end}) lie outside the "
                f"{len(self.constants_section)}-byte constants section")
        return memoryview(self.constants_section)[c.offset:end]
