"""Device memory: buffers sub-allocated from large blocks.

Vulkan implementations limit the number of live allocations (``maxMemoryAllocationCount``
can be as low as 4096) and each allocation is slow, so an ``Allocator`` takes memory in
blocks, growing from 1 MiB to ``block_size`` bytes (a larger buffer gets a block of its
own size), and places buffers in them at offsets that respect each buffer's alignment
requirement. Buffers that may alias (tensors with the same ``mem_obj_id``, whose
lifetimes do not overlap) are placed at one offset of one block: the region is as large
as the largest and uses a memory type allowed by the intersection of all their
memory-type bits.

Host-visible blocks are mapped once for their whole size; a ``Buffer`` in such a block
exposes ``host`` (a writable numpy uint8 view of exactly its bytes). ``texel_view``
makes (once per buffer and format) the VkBufferViews that bind a buffer as a uniform
texel buffer (runtime/texel.py). Everything is freed by ``Allocator.close()``, the
views first: an allocator belongs to one graph and lives as long as it.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import vulkan as vk

from vkdelegate.errors import DeviceLimitError, VkDelegateError
from vkdelegate.runtime import texel
from vkdelegate.runtime.vkcall import vk_call

DEFAULT_BLOCK_SIZE = 64 << 20
MIN_BLOCK_SIZE = 1 << 20
HOST_FLAGS = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
STORAGE_USAGE = (vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT
                 | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT)
# Parameter blocks are bound as uniform buffers, or as storage buffers where the
# device's ``params_in_storage`` says so (lavapipe, see Device).
UNIFORM_USAGE = vk.VK_BUFFER_USAGE_UNIFORM_BUFFER_BIT | vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT
STAGING_USAGE = vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT

#: Region ids of buffers that several graphs bind (state buffers, pooled constants):
#: negative, so that they never equal a graph's own (positive, per-allocator) region
#: ids in the recorder's hazard tracking.
_SHARED_REGIONS = itertools.count(-1, -1)


def shared_region() -> int:
    """A new region id for a buffer bound by several graphs (see _SHARED_REGIONS)."""
    return next(_SHARED_REGIONS)


def tensor_usage(device) -> int:
    """Usage flags of a tensor's buffer on ``device``: STORAGE_USAGE, plus uniform texel
    buffer use where kernels may read tensors through texel views
    (``Device.texel_inputs``)."""
    return STORAGE_USAGE | (texel.USAGE if getattr(device, "texel_inputs", False) else 0)


@dataclass
class Buffer:
    """A VkBuffer bound to ``size`` bytes at ``offset`` in a memory block.

    region: id of the memory region; buffers that alias share it (used to find
    read/write hazards between dispatches). host: numpy uint8 view of the buffer's
    bytes when its memory is host-visible, else None. block, offset: where it is bound
    (``Allocator.part`` binds another buffer inside it). usage: its VkBufferUsageFlags.
    """

    handle: object
    size: int
    region: int
    host: np.ndarray | None
    what: str
    block: object = None
    offset: int = 0
    usage: int = 0


class _Block:
    def __init__(self, allocator: "Allocator", type_index: int, size: int, what: str):
        dev = allocator.device
        info = vk.VkMemoryAllocateInfo(sType=vk.VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                                       allocationSize=size, memoryTypeIndex=type_index)
        self.memory = vk_call(vk.vkAllocateMemory, dev.device, info, None,
                              what=f"a {size}-byte memory block for {what}")
        self.type_index = type_index
        self.size = size
        self.used = 0
        self.host = None
        if dev.memory_flags(type_index) & vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT:
            # vkMapMemory in the binding returns a buffer of exactly the size passed.
            mapped = vk_call(vk.vkMapMemory, dev.device, self.memory, 0, size, 0,
                             what="a memory block")
            self.host = np.frombuffer(mapped, dtype=np.uint8)

    def place(self, size: int, alignment: int) -> int | None:
        offset = -(-self.used // alignment) * alignment
        if offset + size > self.size:
            return None
        self.used = offset + size
        return offset


class Allocator:
    """Sub-allocates buffers from large device-memory blocks (see module docstring).

    Raises DeviceLimitError (a VkDelegateError) naming the buffer (``what``) when it
    exceeds a device limit, checked before anything is allocated; VkDelegateError when
    no memory type fits.
    """

    def __init__(self, device, block_size: int = DEFAULT_BLOCK_SIZE):
        self.device = device
        self.block_size = block_size
        self._blocks: list[_Block] = []
        self._buffers: list = []
        self._views: dict = {}  # (id(Buffer), format) -> (Buffer, VkBufferView)
        self._regions = 0

    def buffer(self, size: int, usage: int, host_visible: bool, what: str,
               cached: bool = False) -> Buffer:
        """One buffer of ``size`` bytes (0 is rounded up to 16) in its own region.
        cached: prefer host-cached memory (staging buffers the host reads)."""
        return self.aliased([size], usage, host_visible, [what], cached)[0]

    def aliased(self, sizes: list[int], usage: int, host_visible: bool,
                whats: list[str], cached: bool = False) -> list[Buffer]:
        """Buffers that share one memory region (their contents may alias)."""
        dev = self.device
        handles, type_bits, alignment, need = [], ~0, 1, 1
        for size, what in zip(sizes, whats):
            size = max(int(size), 16)
            if usage & vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT and \
                    size > dev.info.max_storage_buffer_range:
                raise DeviceLimitError(
                    f"{what} needs {size} bytes, over this device's maxStorageBufferRange "
                    f"of {dev.info.max_storage_buffer_range} bytes ({dev.info.name})")
            info = vk.VkBufferCreateInfo(sType=vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
                                         size=size, usage=usage,
                                         sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE)
            handle = vk_call(vk.vkCreateBuffer, dev.device, info, None, what=what)
            self._buffers.append(handle)
            req = vk.vkGetBufferMemoryRequirements(dev.device, handle)
            handles.append((handle, size))
            type_bits &= req.memoryTypeBits
            alignment = max(alignment, req.alignment)
            need = max(need, req.size)
        required = HOST_FLAGS if host_visible else 0
        preferred = (vk.VK_MEMORY_PROPERTY_HOST_CACHED_BIT if cached
                     else vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT)
        type_index = dev.find_memory_type(type_bits & 0xFFFFFFFF, required, preferred)
        block, offset = self._place(type_index, need, alignment, whats[0])
        self._regions += 1
        out = []
        for (handle, size), what in zip(handles, whats):
            vk_call(vk.vkBindBufferMemory, dev.device, handle, block.memory, offset,
                    what=what)
            host = None if block.host is None else block.host[offset:offset + size]
            out.append(Buffer(handle, size, self._regions, host, what, block, offset,
                              usage))
        return out

    def part(self, parent: Buffer, offset: int, size: int, usage: int,
             what: str) -> "Buffer | None":
        """A buffer of ``size`` bytes bound inside ``parent``'s memory at ``offset``
        bytes from its start, in parent's region (the two alias), or None where that
        cannot be: the range is not inside parent, the offset does not meet the new
        buffer's alignment or parent's memory type does not suit it (the caller then
        takes memory of its own)."""
        dev = self.device
        size = max(int(size), 16)
        if parent.block is None or offset < 0 or offset + size > parent.size:
            return None
        info = vk.VkBufferCreateInfo(sType=vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
                                     size=size, usage=usage,
                                     sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE)
        handle = vk_call(vk.vkCreateBuffer, dev.device, info, None, what=what)
        req = vk.vkGetBufferMemoryRequirements(dev.device, handle)
        at = parent.offset + offset
        if at % req.alignment or not (req.memoryTypeBits >> parent.block.type_index) & 1 \
                or offset + req.size > parent.size:
            vk.vkDestroyBuffer(dev.device, handle, None)
            return None
        self._buffers.append(handle)
        vk_call(vk.vkBindBufferMemory, dev.device, handle, parent.block.memory, at,
                what=what)
        host = None if parent.block.host is None else parent.block.host[at:at + size]
        return Buffer(handle, size, parent.region, host, what, parent.block, at, usage)

    def texel_view(self, buffer: Buffer, fmt: str):
        """The VkBufferView of format ``fmt`` (runtime.texel.VK_FORMATS) over the whole
        of ``buffer``, made on first request and destroyed by ``close``. The buffer may
        belong to another allocator (a shared state's) that outlives this one.
        DeviceLimitError when the device cannot view it so (runtime.texel.unfit)."""
        key = (id(buffer), fmt)
        if key not in self._views:
            why = texel.unfit(self.device, buffer, fmt)
            if why is not None:
                raise DeviceLimitError(f"no {fmt} texel view of {buffer.what}: {why}")
            self._views[key] = (buffer, texel.create_view(self.device, buffer, fmt))
        return self._views[key][1]

    def drop_views(self, buffer: Buffer) -> None:
        """Destroy the texel views made of ``buffer`` (before its memory is freed)."""
        for key in [k for k in self._views if k[0] == id(buffer)]:
            _, view = self._views.pop(key)
            vk.vkDestroyBufferView(self.device.device, view, None)

    @property
    def texel_views(self) -> int:
        """How many texel views this allocator holds (0 after ``close``)."""
        return len(self._views)

    def _place(self, type_index: int, size: int, alignment: int, what: str):
        for block in self._blocks:
            if block.type_index == type_index:
                offset = block.place(size, alignment)
                if offset is not None:
                    return block, offset
        info = self.device.info
        if len(self._blocks) >= info.max_allocation_count:
            raise DeviceLimitError(f"{what}: device allocation count limit "
                                   f"({info.max_allocation_count}) reached")
        heap = self.device.memory_properties.memoryTypes[type_index].heapIndex
        heap_size = self.device.memory_properties.memoryHeaps[heap].size
        limit = min(x for x in (info.max_allocation_size, heap_size) if x) or size
        if size > limit:
            raise DeviceLimitError(f"{what} needs {size} bytes, over this device's "
                                   f"largest allocation of {limit} bytes ({info.name})")
        # Blocks grow geometrically (1 MiB, 2 MiB, ... up to block_size) per memory
        # type: a small graph holds little memory, a large one few allocations.
        same_type = sum(1 for b in self._blocks if b.type_index == type_index)
        grown = min(self.block_size, MIN_BLOCK_SIZE << min(same_type, 20))
        block_size = min(max(grown, size), limit)
        block = _Block(self, type_index, block_size, what)
        self._blocks.append(block)
        return block, block.place(size, alignment)

    @property
    def allocated_bytes(self) -> int:
        """Bytes of device memory held in blocks."""
        return sum(b.size for b in self._blocks)

    def close(self) -> None:
        """Destroy every buffer and free every block (the GPU must be done with them)."""
        dev = self.device.device
        for _, view in self._views.values():
            vk.vkDestroyBufferView(dev, view, None)
        self._views = {}
        for handle in self._buffers:
            vk.vkDestroyBuffer(dev, handle, None)
        for block in self._blocks:
            if block.host is not None:
                vk.vkUnmapMemory(dev, block.memory)
            vk.vkFreeMemory(dev, block.memory, None)
        self._buffers, self._blocks = [], []
