"""The dtype table: every fact vkdelegate knows about a tensor dtype, in one place.

Each layer reads this table (it imports neither torch nor Vulkan, so every layer may):
the VkGraph wire enum (serialization/vkgraph.py ``VkDataType``, values from
schema/schema.fbs, the ET-VK contract), element sizes (memory planning, tensor
budgets), the registry's dtype sets, the device storage rules and GLSL types
(runtime/dtypes.py), and the torch <-> name maps of the backend (built from the names
here). Names are numpy's dtype names ("float32"), the names used across vkdelegate.

Device storage (runtime/dtypes.py ``device_dtype``): a dtype whose ``device`` differs
from its name is always stored as ``device`` (64-bit values: Vulkan compute has no
portable 64-bit arithmetic); one with a ``storage_feature`` is stored natively where the
device has that Vulkan feature (VkPhysicalDeviceVulkan11Features /
VkPhysicalDeviceVulkan12Features member names) and as ``fallback`` otherwise. Shaders
compute in ``acc`` (float for floating dtypes, so fp16 math accumulates in fp32; int for
integer and bool dtypes, since 8-bit storage values only convert to 32-bit ints).
``arith_feature`` names the feature a shader needs to compute *in* the narrow type
(shaderFloat16, shaderInt8), which no portable variant does.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class DType:
    """One dtype's facts.

    name: numpy name. wire: VkDataType value in schema.fbs (None: a program-file dtype
    that never enters a VkGraph). itemsize: bytes per element on the host. kind:
    "float", "int" or "bool". glsl: GLSL storage type when stored natively on a device
    (None: never stored as itself). device: the dtype it is stored as regardless of the
    device. storage_feature / fallback: the Vulkan feature native storage needs and the
    dtype used without it. acc: the GLSL arithmetic type (ACC_T). arith_feature: the
    Vulkan feature arithmetic in the native type needs. store: GLSL expression in ``v``
    (an ACC_T value) storing into each device dtype this dtype can live in; the 32-bit
    fallbacks round or wrap explicitly, so that the stored value is exactly what the
    narrow type would hold (round_to_half is in common.h). storage_define: the define
    common.h reads to enable the GLSL extension of ``glsl``. scalar_type: ExecuTorch's
    ScalarType code (c10::ScalarType numbering, executorch/runtime/core/portable_type),
    the dtype argument of a .pte program's kernel calls.
    """

    name: str
    wire: int | None
    itemsize: int
    kind: str
    glsl: str | None = None
    device: str | None = None
    storage_feature: str | None = None
    fallback: str | None = None
    acc: str | None = None
    arith_feature: str | None = None
    store: dict = field(default_factory=dict)
    storage_define: str | None = None
    scalar_type: int | None = None

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        """Integer, bool excluded."""
        return self.kind == "int"


_S16, _S8 = "storageBuffer16BitAccess", "storageBuffer8BitAccess"

TABLE: dict[str, DType] = {d.name: d for d in (
    DType("bool", 0, 1, "bool", "uint8_t", "bool", _S8, "int32", "int", "shaderInt8",
          {"bool": "uint8_t(int(v) != 0 ? 1 : 0)", "int32": "(int(v) != 0 ? 1 : 0)"},
          "STORAGE_8BIT", scalar_type=11),
    DType("uint8", 1, 1, "int", "uint8_t", "uint8", _S8, "int32", "int", "shaderInt8",
          {"uint8": "uint8_t(int(v))", "int32": "(int(v) & 0xFF)"},
          "STORAGE_8BIT", scalar_type=0),
    DType("int8", 2, 1, "int", "int8_t", "int8", _S8, "int32", "int", "shaderInt8",
          {"int8": "int8_t(int(v))", "int32": "bitfieldExtract(int(v), 0, 8)"},
          "STORAGE_8BIT", scalar_type=1),
    DType("int32", 3, 4, "int", "int", "int32", None, None, "int", None,
          {"int32": "int(v)"}, scalar_type=3),
    DType("float16", 4, 2, "float", "float16_t", "float16", _S16, "float32", "float",
          "shaderFloat16",
          {"float16": "float16_t(v)", "float32": "round_to_half(float(v))"},
          "STORAGE_16BIT", scalar_type=5),
    DType("float32", 5, 4, "float", "float", "float32", None, None, "float", None,
          {"float32": "float(v)"}, scalar_type=6),
    DType("float64", 6, 8, "float", None, "float32", None, None, "float", "shaderFloat64",
          {"float32": "float(v)"}, scalar_type=7),
    DType("int64", 7, 8, "int", None, "int32", None, None, "int", "shaderInt64",
          {"int32": "int(v)"}, scalar_type=4),
    # Program-file dtypes only (ExecuTorch .pte tensors, glue): never in a VkGraph.
    DType("int16", None, 2, "int", scalar_type=2),
    DType("bfloat16", None, 2, "float", scalar_type=15),
)}

#: VkDataType.UNSET in schema.fbs: "no dtype" (e.g. a staging dtype not given).
WIRE_UNSET = 127

#: dtypes a VkGraph can hold (the registry's ALL_DTYPES).
GRAPH_DTYPES = frozenset(n for n, d in TABLE.items() if d.wire is not None)
#: floating dtypes a shader computes with natively or in fp32 storage.
SHADER_FLOAT_DTYPES = frozenset(n for n, d in TABLE.items()
                                if d.is_float and d.glsl is not None)
#: numpy name of each wire value.
WIRE_NAMES = {d.wire: n for n, d in TABLE.items() if d.wire is not None}
#: bytes per element of each dtype name.
ITEMSIZE = {n: d.itemsize for n, d in TABLE.items()}
#: name of each ExecuTorch ScalarType code.
SCALAR_TYPE_NAMES = {d.scalar_type: n for n, d in TABLE.items()}
#: GLSL storage type of each device dtype.
GLSL_TYPES = {n: d.glsl for n, d in TABLE.items() if d.glsl is not None}


def dtype(name: str) -> DType:
    """The table row of ``name``; KeyError for a dtype vkdelegate does not know."""
    return TABLE[name]
