"""Uniform parameter buffers: the tensor metadata record, the buffers themselves.

``meta_record`` writes the GLSL struct of ``vkdelegate/shaders/glsl/tensor_meta.h``
(declared in Python as ``param_block.STRUCTS["TensorMeta"]``; tests/runtime/
test_shader_bindings.py checks the compiled offsets against it)::

    struct TensorMeta {
      ivec4 sizes[2];    // sizes, innermost dim first, padded with 1
      ivec4 strides[2];  // element strides, innermost first, padded with 0
      ivec4 info;        // x: numel, y: ndim
    };

Under std140 an ivec4 (and an array of them) is 16-byte aligned with a 16-byte stride,
so the block is five tight 16-byte rows: 80 bytes, 20 int32. Op-owned blocks are
declared and packed with ``param_block.ParamBlock``.

A ``ParamBuffer`` is a host-visible, coherent uniform buffer; ``write`` changes its bytes
in place, and the next submit sees them (no re-recording).

Every integer packed for a shader (``ParamBlock.pack``, specialization constants in
``pipeline.py``) goes through ``int32_value``: a blob's integers are untrusted, and one
past int32 raises VkDelegateError naming the field instead of numpy's OverflowError or
a silent wrap (the node building it adds the node to the message).
"""
from __future__ import annotations

import math

import numpy as np

from vkdelegate.errors import DeviceLimitError, VkDelegateError

MAX_META_DIMS = 8
META_INTS = 20
META_BYTES = META_INTS * 4
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def int32_value(value, what: str) -> int:
    """``value`` (an int, a bool or an integral float) as an int in the int32 range of
    shader integers; VkDelegateError naming ``what`` (the field) otherwise."""
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(value) or value != int(value):
            raise VkDelegateError(f"{what} is {value}, not an integer a shader can hold")
        value = int(value)
    elif not isinstance(value, (int, np.integer)):
        raise VkDelegateError(f"{what} is {value!r}, not an integer")
    if not INT32_MIN <= int(value) <= INT32_MAX:
        raise VkDelegateError(f"{what} is {int(value)}, outside the int32 range "
                              f"[{INT32_MIN}, {INT32_MAX}] of shader integers")
    return int(value)


def meta_record(shape) -> np.ndarray:
    """The TensorMeta record (int32[20]) of a contiguous tensor of sizes ``shape``."""
    shape = tuple(int(s) for s in shape)
    if len(shape) > MAX_META_DIMS:
        raise VkDelegateError(f"rank {len(shape)} tensor: the runtime supports rank <= "
                              f"{MAX_META_DIMS}")
    numel = math.prod(shape)
    # Every stride (the product of the sizes after its dim) counts too: with a zero
    # size the tensor is empty, but its strides are still int32 shader integers, and
    # the dims after a zero size keep a nonzero product ([5, 0, 2^20, 2^20]: 2^40).
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    largest = max([numel, *strides])
    if largest > INT32_MAX or any(s > INT32_MAX for s in shape):
        # Shaders index with int32: a valid tensor this large does not fit the runtime
        # (raised before Allocator checks on devices with buffers over 2 GiB).
        raise DeviceLimitError(f"tensor of sizes {list(shape)} has {largest} "
                               f"elements{' in its inner dims' if largest > numel else ''}, "
                               f"more than the shaders' int32 indexing reaches "
                               f"({INT32_MAX})")
    rec = np.zeros(META_INTS, dtype=np.int32)
    rec[0:8] = 1
    for d, (size, stride) in enumerate(zip(reversed(shape), reversed(strides))):
        rec[d] = size
        rec[8 + d] = stride
    rec[16] = numel
    rec[17] = len(shape)
    return rec


class ParamBuffer:
    """A uniform buffer the host rewrites between submits.

    buffer: the memory.Buffer (host-visible). what: name for error messages.
    """

    def __init__(self, buffer, what: str):
        self.buffer = buffer
        self.what = what
        self.writes = 0

    def write(self, data) -> None:
        """Overwrite the block's leading bytes with ``data`` (bytes or numpy array)."""
        raw = np.frombuffer(bytes(data) if not isinstance(data, np.ndarray)
                            else data.tobytes(), dtype=np.uint8)
        if raw.size > self.buffer.size:
            raise VkDelegateError(f"{self.what}: {raw.size} bytes do not fit its "
                                  f"{self.buffer.size}-byte uniform buffer")
        self.buffer.host[:raw.size] = raw
        self.writes += 1
