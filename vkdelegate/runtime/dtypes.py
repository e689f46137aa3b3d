"""Tensor dtypes on the device and their conversion at the staging boundary.

The facts (device dtype, GLSL types, stores, features) are rows of the dtype table,
vkdelegate/dtypes.py; this module reads them for a device or a StorageProfile.

A tensor's *graph dtype* is the one serialized in the VkGraph (numpy name); its *device
dtype* is how it is stored in its storage buffer:

- float64 -> float32 and int64 -> int32: Vulkan compute has no portable 64-bit
  arithmetic. The conversion happens when inputs are written and outputs read; an int64
  input value outside the int32 range raises VkDelegateError (never wraps silently),
  and so does an int64 result that leaves it on the device (the int64 add / sub / mul,
  integer division, neg, abs, cumsum and float-to-int64 casts check their results,
  shaders/glsl/int_checked.h, and the run raises ``INT64_OVERFLOW`` naming the node).
- float16 stays float16 where the device has ``storageBuffer16BitAccess``; otherwise it
  is stored as float32 (same values, twice the memory).
- int8, uint8 and bool stay 8-bit where the device has ``storageBuffer8BitAccess``;
  otherwise they are stored as int32. bool is stored as 0/1 bytes (uint8_t in GLSL).

Shaders compute in ``ACC_T``: float for floating dtypes (so fp16 math accumulates in
fp32), int for integer and bool dtypes. GLSL converts every storage type to its ACC_T
with a constructor (8-bit storage values only convert to 32-bit ints, hence int).
"""
from __future__ import annotations

import numpy as np

from vkdelegate import dtypes as table
from vkdelegate.errors import VkDelegateError

#: The error of an op whose int64 result left the int32 range on the device.
INT64_OVERFLOW = ("an int64 result outside the int32 range (-2**31 .. 2**31 - 1) in which "
                  "the device holds int64 values (ATen's int64 would not wrap there); "
                  "keep the op on the CPU with VulkanPartitioner(operator_blocklist=[...])")

#: The bit of a node's error-flag word its shader sets for an integer division,
#: remainder or fmod by zero (int_checked.h's zero_guard), and the error it raises: the
#: one ATen raises there.
ZERO_DIVISION_BIT = 2
ZERO_DIVISION = "ZeroDivisionError: integer division or remainder by zero (as in eager)"

#: GLSL storage type of each device dtype (vkdelegate.dtypes).
GLSL_TYPES = table.GLSL_TYPES
FLOATING = frozenset(n for n, d in table.TABLE.items() if d.is_float)
# DeviceInfo / StorageProfile attribute holding each storage feature of the table.
_FEATURE_ATTR = {"storageBuffer16BitAccess": "storage_16bit",
                 "storageBuffer8BitAccess": "storage_8bit"}


def device_dtype(dtype: str, info) -> str:
    """The storage dtype on device ``info`` (a DeviceInfo or StorageProfile) of graph
    dtype ``dtype``, by the table's ``device``/``storage_feature``/``fallback``.
    VkDelegateError for a dtype that cannot be stored on a Vulkan device."""
    row = table.TABLE.get(dtype)
    if row is None or row.device is None:
        raise VkDelegateError(f"dtype {dtype} cannot be stored on a Vulkan device")
    if row.storage_feature and not getattr(info, _FEATURE_ATTR[row.storage_feature]):
        return row.fallback
    return row.device


def acc_type(dtype: str) -> str:
    """GLSL arithmetic type for values of graph dtype ``dtype`` (the table's acc)."""
    row = table.TABLE.get(dtype)
    return row.acc if row is not None and row.acc else "int"


def storage_defines(**tensors) -> dict[str, str]:
    """Shader defines for the storage of named tensors.

    ``storage_defines(OUT=out, IN=x)`` gives, per name, ``OUT_T`` (the GLSL storage
    type, for the buffer declaration) and ``OUT_STORE(v)`` (converts an ACC_T value for
    storing: ``out_data[i] = OUT_STORE(acc);``), plus STORAGE_8BIT/STORAGE_16BIT, which
    make common.h enable the GLSL extensions those types need. Values are Tensors,
    (graph dtype, device dtype) pairs, or a device dtype name alone (then the store is
    the plain constructor, which does not round or wrap in the 32-bit fallback).
    """
    defines = {}
    for name, t in tensors.items():
        if hasattr(t, "device_dtype"):
            dtype, dev = t.dtype, t.device_dtype
        elif isinstance(t, str):
            dtype = dev = t
        else:
            dtype, dev = t
        defines[f"{name}_T"] = GLSL_TYPES[dev]
        defines[f"{name}_STORE(v)"] = table.TABLE[dtype].store[dev]
        flag = table.TABLE[dev].storage_define
        if flag:
            defines[flag] = "1"
    return defines


def to_device(array: np.ndarray, dev_dtype: str, what: str) -> np.ndarray:
    """``array`` converted to ``dev_dtype`` for upload, range-checked for int64."""
    array = np.asarray(array)
    if array.dtype == np.int64 and dev_dtype == "int32" and array.size:
        lo, hi = array.min(), array.max()
        info = np.iinfo(np.int32)
        if lo < info.min or hi > info.max:
            bad = lo if lo < info.min else hi
            raise VkDelegateError(f"{what}: int64 value {bad} does not fit in int32, "
                                  f"the device representation of int64 tensors")
    if array.dtype == np.bool_ and dev_dtype == "int32":
        return array.astype(np.int32)
    return np.ascontiguousarray(array, dtype=np.dtype(dev_dtype))


def from_device(array: np.ndarray, dtype: str) -> np.ndarray:
    """A device-dtype array converted back to graph dtype ``dtype`` (a new array)."""
    if dtype == "bool":
        return array != 0
    return array.astype(np.dtype(dtype), copy=True)


class StorageProfile:
    """The storage capabilities ``device_dtype`` looks at, without a device."""

    def __init__(self, storage_8bit: bool, storage_16bit: bool):
        self.storage_8bit = storage_8bit
        self.storage_16bit = storage_16bit


#: Devices with 8/16-bit storage and without: variants are declared for both.
STORAGE_PROFILES = (StorageProfile(True, True), StorageProfile(False, False))
