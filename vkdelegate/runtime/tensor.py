"""Tensors on the device: a storage buffer plus the tensor's metadata uniform buffer.

A ``Tensor`` is allocated once for its upper-bound sizes (``max_shape``, the serialized
dims). Its current sizes (``shape``) may be smaller after a resize; ``set_shape``
rewrites the metadata buffer (``meta``) that every node touching the tensor binds, so
the recorded command buffer stays valid. Data is contiguous (row-major) in the device
dtype (see ``vkdelegate.runtime.dtypes``).
"""
from __future__ import annotations

import math

import numpy as np

from vkdelegate.dtypes import ITEMSIZE
from vkdelegate.errors import VkDelegateError
from vkdelegate.runtime.params import ParamBuffer, meta_record


class Tensor:
    """A device tensor.

    value_id: its id in the VkGraph (-1 for temporaries an op allocates).
    dtype: graph dtype (numpy name); device_dtype: storage dtype on the device.
    max_shape: allocation sizes (upper bounds); shape: current sizes.
    buffer: memory.Buffer holding max_numel elements; meta: ParamBuffer (TensorMeta).
    staging: host-visible memory.Buffer used for input/output transfers when the
    tensor's own memory is not mappable, else None.
    """

    def __init__(self, value_id: int, dtype: str, device_dtype: str, max_shape,
                 buffer, meta: ParamBuffer, constant: bool = False):
        self.value_id = value_id
        self.dtype = dtype
        self.device_dtype = device_dtype
        self.max_shape = tuple(int(s) for s in max_shape)
        self.shape = self.max_shape
        self.buffer = buffer
        self.meta = meta
        self.constant = constant
        self.staging = None
        meta.write(meta_record(self.shape))

    @property
    def name(self) -> str:
        return f"tensor {self.value_id}" if self.value_id >= 0 else "temporary tensor"

    @property
    def ndim(self) -> int:
        return len(self.max_shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def max_numel(self) -> int:
        return math.prod(self.max_shape)

    @staticmethod
    def nbytes_for(device_dtype: str, shape) -> int:
        """Bytes of a contiguous tensor of ``shape`` stored as ``device_dtype``."""
        return math.prod(shape) * ITEMSIZE[device_dtype]

    def set_shape(self, shape) -> bool:
        """Set the current sizes; return True if they changed.

        Raises VkDelegateError if the rank differs or a size exceeds the upper bound.
        """
        shape = tuple(int(s) for s in shape)
        if shape == self.shape:
            return False
        if len(shape) != self.ndim or any(s < 0 or s > m
                                          for s, m in zip(shape, self.max_shape)):
            raise VkDelegateError(f"{self.name}: sizes {list(shape)} exceed the upper "
                                  f"bounds {list(self.max_shape)} it was built for")
        self.shape = shape
        self.meta.write(meta_record(shape))
        return True

    def host_view(self) -> np.ndarray:
        """Typed numpy view (max_numel elements) of the mapped memory used for
        transfers: the staging buffer if there is one, else the tensor's own memory."""
        buf = self.staging or self.buffer
        if buf.host is None:
            raise VkDelegateError(f"{self.name} has no host-visible memory")
        n = self.max_numel * ITEMSIZE[self.device_dtype]
        return buf.host[:n].view(self.device_dtype)

    def __repr__(self) -> str:
        return f"Tensor({self.value_id}, {self.dtype}, {list(self.shape)})"
