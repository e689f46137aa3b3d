"""``StateBuffer``: one device allocation holding a mutable state that several
``DelegateGraph``s of one Device read and update in place.

A program whose methods share a buffer (a KV cache filled by ``prefill`` and extended
by ``decode``) keeps it in ONE StateBuffer; each graph that binds it
(``DelegateGraph.bind_state(..., shared=buffer)``) has its state input's descriptors
point at the buffer, and its recorded command buffer ends with a copy of the state's
new value into it (see ``device_state``). Nothing crosses to the host between calls.

The buffer owns its memory (its own ``Allocator``), so it outlives the graphs bound
to it: closing a graph leaves the state intact for the next graph (or the rebuilt
one) to bind. ``Device.close()`` releases it with the graphs (``Device.track``).
"""
from __future__ import annotations

import threading
import weakref

import numpy as np

from vkdelegate.errors import VkDelegateError
from vkdelegate.runtime import commands
from vkdelegate.runtime.dtypes import from_device, to_device
from vkdelegate.runtime.memory import (STAGING_USAGE, Allocator, shared_region,
                                       tensor_usage)
from vkdelegate.runtime.tensor import Tensor


class _Memory:
    """What a StateBuffer frees (the finalizer holds this, never the buffer)."""

    def __init__(self, device, allocator):
        self.device, self.allocator = device, allocator
        self.released = False
        self.lock = threading.Lock()
        device.track(self)

    def release(self) -> None:
        with self.lock:
            if self.released:
                return
            self.released = True
            self.device.untrack(self)
            if not self.device.closed:
                self.allocator.close()


#: States of at most this many bytes skip ``staging`` where the device has memory that
#: is device-local and host-visible (``Device.mappable_device_local``: a discrete GPU's
#: BAR window): the host maps the buffer itself, so a read or write is a memcpy, not a
#: submitted copy and a fence wait (about 250 us on an H100 for the decode loop's token
#: history, read after every chunk of steps; docs/PERF.md), and the GPU still reads it
#: from its own memory. Small: the host's reads of such memory are uncached, one bus
#: round trip per load (of the order of 1 us for 32 bytes over PCIe), so a large state
#: read whole is slower than through a copy: the decode loop reads only a chunk's rows
#: of its history (``read(rows=)``), and 64 KiB bounds a whole read (``state_dict``)
#: and keeps well inside the BAR window of a GPU without resizable BAR (256 MiB for the
#: whole device). The decode loop's token, position and history (up to 16383
#: positions: int32 on the device) fit.
MAPPED_STATE_BYTES = 64 << 10


class StateBuffer:
    """A state tensor of fixed sizes in device memory, shared by graphs.

    device: the runtime Device. dtype: graph dtype (numpy name, e.g. "float32");
    device_dtype: its storage dtype on the device (``runtime.dtypes.device_dtype``);
    shape: sizes. staging: keep the data in device-local memory and go through a
    host-visible staging buffer for ``write``/``read`` (discrete GPUs), else map the
    buffer itself; a state of at most MAPPED_STATE_BYTES is mapped even so where the
    device has device-local, host-visible memory. initial: the first value (``dtype``,
    ``shape``).
    Attributes: ``buffer`` (the memory.Buffer graphs bind), ``nbytes``, ``staged``
    (whether reads and writes go through a staging buffer).
    Raises VkDelegateError for an initial value of another dtype or sizes.
    """

    def __init__(self, device, dtype: str, device_dtype: str, shape, staging: bool,
                 initial: np.ndarray, timeout_s: float = 60.0):
        self.device, self.dtype, self.device_dtype = device, dtype, device_dtype
        self.shape = tuple(int(s) for s in shape)
        self.nbytes = Tensor.nbytes_for(device_dtype, self.shape)
        if staging and self.nbytes <= MAPPED_STATE_BYTES and device.mappable_device_local:
            staging = False
        self.staged = staging
        self.timeout_s = timeout_s
        self.allocator = Allocator(device, block_size=max(self.nbytes, 16))  # no slack
        self._memory = _Memory(device, self.allocator)
        self._finalizer = weakref.finalize(self, self._memory.release)
        self._finalizer.atexit = False
        self.buffer = self.allocator.buffer(self.nbytes, tensor_usage(device), not staging,
                                            "a shared state")
        self.buffer.region = shared_region()
        self._staging = (self.allocator.buffer(self.nbytes, STAGING_USAGE, True,
                                               "a shared state's staging", cached=True)
                         if staging else None)
        self.write(initial)

    @property
    def closed(self) -> bool:
        return self._memory.released

    def _view(self) -> np.ndarray:
        if self.closed:
            raise VkDelegateError("a shared state buffer used after it was closed")
        host = (self._staging or self.buffer).host
        n = int(np.prod(self.shape, dtype=np.int64))
        return host[:self.nbytes].view(self.device_dtype)[:n]

    def write(self, value: np.ndarray) -> None:
        """Replace the contents with ``value`` (ordered after all earlier GPU work)."""
        value = np.asarray(value)
        if value.dtype.name != self.dtype or value.shape != self.shape:
            raise VkDelegateError(f"shared state is {self.dtype}{list(self.shape)}, got "
                                  f"{value.dtype.name}{list(value.shape)}")
        view = self._view()  # every graph run waits for its fence: no GPU read races
        view[:] = to_device(value, self.device_dtype, "shared state").reshape(-1)
        if self._staging is not None:
            commands.copy_once(self.device, [(self._staging, self.buffer, self.nbytes)],
                               self.timeout_s)

    def read(self, rows: "slice | None" = None) -> np.ndarray:
        """The current contents (a new array, ``dtype``, ``shape``), or with ``rows``
        (a slice of the first dim, step 1) those rows only: a mapped state then reads
        just their bytes (the decode loop reads a chunk's new ids from its history).
        Raises VkDelegateError for a slice with another step."""
        view = self._view()
        if self._staging is not None:
            commands.copy_once(self.device, [(self.buffer, self._staging, self.nbytes)],
                               self.timeout_s)
        if rows is None:
            return from_device(view, self.dtype).reshape(self.shape).copy()
        first = self.shape[0] if self.shape else 1
        start, stop, step = rows.indices(first)
        if step != 1:
            raise VkDelegateError(f"shared state rows {rows}: step {step}, not 1")
        stop = max(start, stop)
        inner = int(np.prod(self.shape[1:], dtype=np.int64))
        part = view[start * inner:stop * inner]
        return from_device(part, self.dtype).reshape((stop - start,) + self.shape[1:]).copy()

    def close(self) -> None:
        """Free the memory (idempotent); the graphs bound to it must not run again."""
        self._finalizer()
