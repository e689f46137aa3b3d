"""Constants on the device once per program: a pool the graphs of its methods share.

A lowered LLM has several methods (``prefill``, ``decode``, ``decode_next``...) whose
delegates read the same weights: the program file stores each once (named constants,
keyed by the SHA-256 of their bytes), and a ``ConstantPool`` makes the device hold each
once too. A graph built with a pool (``DelegateGraph(constant_pool=)``) takes the
device buffer of every named constant from it, keyed by the constant's ``named_key``
and dtypes, and so does every copy an op makes of a constant in another layout
(``NodeBuilder.packed_constant``: keyed by the layout too). A constant's own device
copy is made at its first binding: one that every op reads repacked takes no device
memory in its stored layout.

Keys are only trusted within one program (one ``named_data`` namespace): a key seen
again with other bytes (a crafted file naming one key for two segments) is a
VkDelegateError, never a silent reuse. Pooled buffers are only read by dispatches
(``NodeBuilder.dispatch`` refuses a constant among a dispatch's outputs).

Lifetime: the pool's memory (its own ``Allocator``) lives while a graph is attached
(``attach``/``detach``, called by the graph's load and release) and is freed with the
last one, or by ``Device.close()``; a later attach starts an empty pool. ``ConstantPools``
holds one pool per (Device, staging) for a program (``LoweredProgram``).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

import vulkan as vk

from vkdelegate.errors import VkDelegateError
from vkdelegate.runtime.memory import Allocator, Buffer, shared_region
from vkdelegate.runtime.vkcall import vk_call


@dataclass
class PoolEntry:
    """One pooled device buffer: the constant's (or packed copy's) ``shape``, graph
    ``dtype`` and ``device_dtype``, and ``source``, the stored bytes it came from."""

    buffer: Buffer
    shape: tuple
    dtype: str
    device_dtype: str
    source: object


def same_bytes(a, b) -> bool:
    """Whether two bytes-like objects hold the same bytes (the same object at once)."""
    if a is b:
        return True
    a, b = memoryview(a).cast("B"), memoryview(b).cast("B")
    return a.nbytes == b.nbytes and bool(np.array_equal(np.frombuffer(a, np.uint8),
                                                        np.frombuffer(b, np.uint8)))


class ConstantPool:
    """Device buffers of constants shared by the graphs of one program on ``device``
    (see the module docstring). staging: the graphs' tensors are not mapped (the pool's
    buffers are device-local and written through the graph's staging uploads), else
    its buffers are host-visible and written directly.

    ``lock`` (reentrant): a graph holds it from its first allocation to its uploads'
    completion, so that no other graph binds an entry whose bytes are still queued.
    """

    def __init__(self, device, staging: bool):
        self.device, self.staging = device, bool(staging)
        self.lock = threading.RLock()
        self._allocator: Allocator | None = None
        self._entries: dict = {}
        self._users = 0

    def attach(self) -> None:
        """A graph starts using the pool (its memory is created on the first)."""
        with self.lock:
            if self._allocator is None:
                self._allocator = Allocator(self.device)
                self.device.track(self)
            self._users += 1

    def detach(self) -> None:
        """A graph stopped using the pool; the last one frees its memory."""
        with self.lock:
            self._users -= 1
            if self._users <= 0:
                self.release()

    def release(self) -> None:
        """Free every pooled buffer (the last detach, or ``Device.close()``; the GPU
        must be done with them). Idempotent."""
        with self.lock:
            self._users = 0
            self._entries = {}
            allocator, self._allocator = self._allocator, None
            if allocator is None:
                return
            self.device.untrack(self)
            if self.device.closed:
                return
            with self.device.queue_lock:  # a graph's run in flight reads them
                vk_call(vk.vkQueueWaitIdle, self.device.queue,
                        what="freeing the constant pool")
            allocator.close()

    def get(self, key, source, what: str) -> PoolEntry | None:
        """The entry of ``key`` (None if there is none yet). VkDelegateError naming
        ``what`` when it was made from other bytes than ``source``."""
        entry = self._entries.get(key)
        if entry is not None and not same_bytes(entry.source, source):
            name = key[1][0] if key[0] == "packed" else key[0]
            raise VkDelegateError(f"{what}: named constant {name!r} has other bytes "
                                  f"here than in another delegate of this program")
        return entry

    def add(self, key, source, shape, dtype: str, device_dtype: str, nbytes: int,
            usage: int, what: str) -> PoolEntry:
        """A new entry of ``nbytes`` for ``key`` (the caller writes its bytes before
        releasing ``lock``). Raises DeviceLimitError as ``Allocator.buffer`` does."""
        if self._allocator is None:
            raise VkDelegateError(f"{what}: the constant pool is not attached")
        buffer = self._allocator.buffer(nbytes, usage, not self.staging, what)
        buffer.region = shared_region()
        entry = PoolEntry(buffer, tuple(int(s) for s in shape), dtype, device_dtype,
                          source)
        self._entries[key] = entry
        return entry

    def discard(self, keys) -> None:
        """Forget the entries of ``keys`` (their memory stays in the pool's blocks
        until it is freed)."""
        with self.lock:
            for key in keys:
                self._entries.pop(key, None)

    @property
    def entries(self) -> int:
        """How many buffers the pool holds."""
        with self.lock:
            return len(self._entries)

    @property
    def nbytes(self) -> int:
        """Bytes of the pooled buffers (not counting block slack)."""
        with self.lock:
            return sum(e.buffer.size for e in self._entries.values())


class ConstantPools:
    """The ConstantPool of each (Device, staging) a program's graphs were built on."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pools: dict = {}

    def for_device(self, device, staging: bool) -> ConstantPool:
        """The pool for graphs on ``device`` with that ``staging`` (made once)."""
        with self._lock:
            key = (id(device), bool(staging))
            pool = self._pools.get(key)
            if pool is None or pool.device is not device:
                pool = self._pools[key] = ConstantPool(device, staging)
            return pool

    @property
    def nbytes(self) -> int:
        """Bytes of every pool's buffers."""
        with self._lock:
            return sum(p.nbytes for p in self._pools.values())
