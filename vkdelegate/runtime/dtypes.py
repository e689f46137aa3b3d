"""Tensor dtypes on the device and their conversion at the staging boundary.

A tensor's *graph dtype* is the one serialized in the VkGraph (numpy name); its *device
dtype* is how it is stored in its storage buffer:

- float64 -> float32 and int64 -> int32: Vulkan compute has no portable 64-bit
  arithmetic. The conversion happens when inputs are written and outputs read; an int64
  input value outside the int32 range raises VkDelegateError (never wraps silently).
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

from vkdelegate.errors import VkDelegateError

GLSL_TYPES = {"float32": "float", "float16": "float16_t", "int32": "int",
              "int8": "int8_t", "uint8": "uint8_t", "bool": "uint8_t"}
FLOATING = frozenset({"float32", "float16", "float64"})


def device_dtype(dtype: str, info) -> str:
    """The storage dtype on device ``info`` (a DeviceInfo) of graph dtype ``dtype``."""
    if dtype == "float64":
        return "float32"
    if dtype == "int64":
        return "int32"
    if dtype == "float16" and not info.storage_16bit:
        return "float32"
    if dtype in ("int8", "uint8", "bool") and not info.storage_8bit:
        return "int32"
    if dtype not in GLSL_TYPES:
        raise VkDelegateError(f"dtype {dtype} cannot be stored on a Vulkan device")
    return dtype


def acc_type(dtype: str) -> str:
    """GLSL arithmetic type for values of graph dtype ``dtype``."""
    return "float" if dtype in FLOATING else "int"


# How a value of ACC_T is stored into each device dtype, as a GLSL expression in v.
# Native types convert with a constructor (int -> int8_t truncates, i.e. wraps like
# ATen). Where a narrow dtype is held in a wider fallback type the store rounds or
# wraps explicitly, so that the stored value is exactly what the narrow type would hold
# and the next node reads the same value as on a device with 8/16-bit storage.
_STORE = {
    ("float32", "float32"): "float(v)",
    ("float16", "float16"): "float16_t(v)",
    ("float16", "float32"): "round_to_half(float(v))",  # common.h
    ("int32", "int32"): "int(v)",
    ("int8", "int8"): "int8_t(int(v))",
    ("int8", "int32"): "bitfieldExtract(int(v), 0, 8)",
    ("uint8", "uint8"): "uint8_t(int(v))",
    ("uint8", "int32"): "(int(v) & 0xFF)",
    ("bool", "bool"): "uint8_t(int(v) != 0 ? 1 : 0)",
    ("bool", "int32"): "(int(v) != 0 ? 1 : 0)",
    # 64-bit graph dtypes live in their 32-bit device dtype (see device_dtype).
    ("int64", "int32"): "int(v)",
    ("float64", "float32"): "float(v)",
}


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
        glsl = GLSL_TYPES[dev]
        defines[f"{name}_T"] = glsl
        defines[f"{name}_STORE(v)"] = _STORE[(dtype, dev)]
        if glsl == "float16_t":
            defines["STORAGE_16BIT"] = "1"
        elif glsl in ("int8_t", "uint8_t"):
            defines["STORAGE_8BIT"] = "1"
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
