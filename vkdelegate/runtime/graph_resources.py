"""The Vulkan objects one ``DelegateGraph`` owns, released exactly once.

They live in a ``GraphResources`` rather than on the graph so that a finalizer can
free them without referencing the graph (``weakref.finalize(graph, res.release)``: a
graph dropped without ``close()`` is released when it is collected, and nothing is
resurrected). The Device keeps the resources of its open graphs and releases them
first when it is closed, so a graph never outlives the VkDevice its objects belong to.

``lock`` serialises a run (``DelegateGraph.execute`` holds it from the input upload to
the output download) against ``release``: closing a graph while another thread calls
it waits for that call's fence, and every later call sees ``closed``.
"""
from __future__ import annotations

import threading

import vulkan as vk

from vkdelegate.runtime.vkcall import vk_call


class GraphResources:
    """Command buffers, query pool, fence, descriptor pool and memory of one graph.

    device: the runtime Device. allocator: the graph's memory.Allocator. values: its
    GraphValues (upload staging), set once created. ``closed``: no run may start
    (True until the load has finished, and after ``release``).
    """

    def __init__(self, device, allocator):
        self.device = device
        self.allocator = allocator
        self.values = None
        self.constant_pool = None  # the program's ConstantPool the graph attached to
        self.cmd = self.profile_cmd = self.query_pool = self.fence = self.pool = None
        self.join_cmd = None  # the barrier between repeats (DelegateGraph.execute)
        self.lock = threading.Lock()
        self.closed = True
        self.released = False
        device.track(self)

    def release(self) -> None:
        """Wait for a run in flight, then free everything (idempotent, thread-safe).

        Also the finalizer of the graph; it does nothing when the Device is already
        closed (its objects went with it) or when the interpreter is shutting down.
        """
        with self.lock:
            if self.released:
                return
            self.released = self.closed = True
            self.device.untrack(self)
            if self.device.closed or vk is None:
                return
            try:
                self._free()
            finally:
                if self.constant_pool is not None:
                    self.constant_pool.detach()  # after this graph's last run
                    self.constant_pool = None

    def _free(self) -> None:
        device = self.device
        dev = device.device
        with device.queue_lock:
            vk_call(vk.vkQueueWaitIdle, device.queue, what="closing the graph")
        cmds = [c for c in (self.cmd, self.profile_cmd, self.join_cmd) if c is not None]
        if cmds:
            vk.vkFreeCommandBuffers(dev, device.command_pool, len(cmds), cmds)
        if self.query_pool is not None:
            vk.vkDestroyQueryPool(dev, self.query_pool, None)
        if self.fence is not None:
            vk.vkDestroyFence(dev, self.fence, None)
        if self.pool is not None:
            vk.vkDestroyDescriptorPool(dev, self.pool, None)
        self.cmd = self.profile_cmd = self.query_pool = self.fence = self.pool = None
        self.join_cmd = None
        if self.values is not None:
            self.values.close_uploads()
        self.allocator.close()
        if self.values is not None:  # after the allocator's texel views of them
            self.values.close_own()


class owned:
    """A ``DelegateGraph`` attribute stored in its ``GraphResources`` (``_cmd`` is
    ``graph._res.cmd``), so that the graph's code reads and writes it as before."""

    def __set_name__(self, owner, name: str) -> None:
        self.key = name.lstrip("_")

    def __get__(self, obj, cls=None):
        return self if obj is None else getattr(obj._res, self.key)

    def __set__(self, obj, value) -> None:
        setattr(obj._res, self.key, value)
