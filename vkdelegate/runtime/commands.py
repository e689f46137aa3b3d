"""Descriptor sets and command-buffer recording for a list of dispatches.

Recording order: copies of staged inputs into their tensors, the dispatches, copies of
outputs into their staging buffers, and a final barrier that makes results visible to
the host. A pipeline barrier is inserted only before a dispatch that depends on one
since the previous barrier: it reads a memory region an earlier dispatch wrote (RAW),
or writes one an earlier dispatch read or wrote (WAR/WAW). Independent dispatches run
without barriers between them.

For profiling (``timestamps`` given) every dispatch is followed by a timestamp, and a
barrier separates all dispatches so that each interval belongs to one dispatch.
"""
from __future__ import annotations

import vulkan as vk

from vkdelegate.runtime.pipeline import STORAGE, TEXEL, UNIFORM
from vkdelegate.runtime.vkcall import vk_call

_COMPUTE = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT
_TRANSFER = vk.VK_PIPELINE_STAGE_TRANSFER_BIT
_SHADER_RW = vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT


def create_descriptor_sets(device, dispatches, views=None):
    """Allocate and write one descriptor set per dispatch; return the pool (owned by
    the caller, destroyed with vkDestroyDescriptorPool). views: ``(Buffer, format)
    -> VkBufferView`` for the uniform texel buffer bindings (the graph allocator's
    ``texel_view``, which owns the views)."""
    dev = device.device
    counts = {t: sum(d.pipeline.binding_types.count(t) for d in dispatches)
              for t in (STORAGE, UNIFORM, TEXEL)}
    sizes = [vk.VkDescriptorPoolSize(type=t, descriptorCount=max(1, n))
             for t, n in counts.items() if n or t != TEXEL]
    pool_info = vk.VkDescriptorPoolCreateInfo(
        sType=vk.VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO,
        maxSets=max(1, len(dispatches)), poolSizeCount=len(sizes), pPoolSizes=sizes)
    pool = vk_call(vk.vkCreateDescriptorPool, dev, pool_info, None,
                   what="the graph's descriptor pool")
    for d in dispatches:
        alloc = vk.VkDescriptorSetAllocateInfo(
            sType=vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO, descriptorPool=pool,
            descriptorSetCount=1, pSetLayouts=[d.pipeline.set_layout])
        d.descriptor_set = vk_call(vk.vkAllocateDescriptorSets, dev, alloc,
                                   what=f"node {d.node_id} ({d.op})")[0]
        infos, writes = [], []
        for i, (t, b) in enumerate(zip(d.pipeline.binding_types, d.buffers)):
            write = dict(sType=vk.VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET,
                         dstSet=d.descriptor_set, dstBinding=i, descriptorCount=1,
                         descriptorType=t)
            if t == TEXEL:
                infos.append([views(b, d.formats[i])])
                write["pTexelBufferView"] = infos[-1]
            else:
                infos.append([vk.VkDescriptorBufferInfo(buffer=b.handle, offset=0,
                                                        range=b.size)])
                write["pBufferInfo"] = infos[-1]
            writes.append(vk.VkWriteDescriptorSet(**write))
        vk.vkUpdateDescriptorSets(dev, len(writes), writes, 0, None)
        del infos, writes
    return pool


def allocate(device, what: str):
    """A primary command buffer from the device's pool (not begun)."""
    alloc = vk.VkCommandBufferAllocateInfo(
        sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
        commandPool=device.command_pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY,
        commandBufferCount=1)
    return vk_call(vk.vkAllocateCommandBuffers, device.device, alloc, what=what)[0]


def _start(cmd, what: str, flags: int = 0):
    """Begin recording ``cmd`` (a command buffer of the device's pool, which resets
    command buffers: beginning a used one resets it); returns it."""
    begin = vk.VkCommandBufferBeginInfo(
        sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, flags=flags)
    vk_call(vk.vkBeginCommandBuffer, cmd, begin, what=what)
    return cmd


def _begin(device, what: str, flags: int = 0):
    """A primary command buffer from the device's pool, begun for recording."""
    return _start(allocate(device, what), what, flags)


def _barrier(cmd, src_stage, src_access, dst_stage, dst_access):
    mb = vk.VkMemoryBarrier(sType=vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                            srcAccessMask=src_access, dstAccessMask=dst_access)
    vk.vkCmdPipelineBarrier(cmd, src_stage, dst_stage, 0, 1, [mb], 0, None, 0, None)


def _copy(cmd, src, dst, size):
    region = vk.VkBufferCopy(srcOffset=0, dstOffset=0, size=size)
    vk.vkCmdCopyBuffer(cmd, src.handle, dst.handle, 1, [region])


def barriers_before(dispatches) -> list[bool]:
    """Per dispatch, whether ``record`` puts a pipeline barrier before it (without
    timestamps): it reads a region written since the previous barrier, or writes one
    read or written since then. A "stage" is a barrier-free run of dispatches."""
    written, read, out = set(), set(), []
    for d in dispatches:
        hazard = bool((d.reads & written) or (d.writes & (written | read)))
        if hazard:
            written, read = set(), set()
        out.append(hazard)
        written |= d.writes
        read |= d.reads
    return out


def record(device, dispatches, staged_inputs, staged_outputs, timestamps=None,
           state_copies=(), state_in_place=False, indirect_buffer=None):
    """Allocate and record one primary command buffer; return (command buffer,
    number of pipeline barriers between dispatches).

    staged_inputs / staged_outputs: Tensors with a ``staging`` buffer to copy from /
    to. timestamps: a query pool with len(dispatches) + 1 queries, or None.
    indirect_buffer: the graph's VkDispatchIndirectCommand buffer (16 bytes a slot;
    the host writes it before each submit), read by the dispatches whose
    ``indirect`` slot is set (vkCmdDispatchIndirect).
    state_copies: (source Tensor, destination Tensor) pairs copied after every
    dispatch (and after the output downloads): a state output written back into its
    state input for the next run, which the final barrier makes visible to it.
    state_in_place: a dispatch wrote state in place (DeviceState): the first barrier
    after the dispatches also makes their writes visible to the next run's shaders.
    """
    # Simultaneous use: one submit may list the buffer several times (repeats).
    cmd = _begin(device, what="the graph",
                 flags=vk.VK_COMMAND_BUFFER_USAGE_SIMULTANEOUS_USE_BIT)
    if timestamps is not None:
        vk.vkCmdResetQueryPool(cmd, timestamps, 0, len(dispatches) + 1)
    for t in staged_inputs:
        _copy(cmd, t.staging, t.buffer, t.staging.size)
    if staged_inputs:
        _barrier(cmd, _TRANSFER, vk.VK_ACCESS_TRANSFER_WRITE_BIT, _COMPUTE, _SHADER_RW)
    if timestamps is not None:
        # The start: once the input uploads have completed (BOTTOM_OF_PIPE waits for
        # every earlier command), so the first dispatch's time is its own, not the
        # upload's (over PCIe on a discrete GPU, often longer than the dispatch).
        vk.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, timestamps, 0)
    barriers = 0
    for i, (d, hazard) in enumerate(zip(dispatches, barriers_before(dispatches))):
        if hazard or (timestamps is not None and i > 0):
            _barrier(cmd, _COMPUTE, vk.VK_ACCESS_SHADER_WRITE_BIT, _COMPUTE, _SHADER_RW)
            barriers += 1
        vk.vkCmdBindPipeline(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, d.pipeline.pipeline)
        vk.vkCmdBindDescriptorSets(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE,
                                   d.pipeline.layout, 0, 1, [d.descriptor_set], 0, None)
        if d.indirect >= 0:
            vk.vkCmdDispatchIndirect(cmd, indirect_buffer.handle, 16 * d.indirect)
        else:
            vk.vkCmdDispatch(cmd, *d.groups)
        if timestamps is not None:
            vk.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT,
                                   timestamps, i + 1)
    if staged_outputs or state_copies:
        # The host reads the error flags (NodeBuilder.error_flag) straight from the
        # shaders' writes, not through a copy.
        _barrier(cmd, _COMPUTE, vk.VK_ACCESS_SHADER_WRITE_BIT,
                 _TRANSFER | vk.VK_PIPELINE_STAGE_HOST_BIT
                 | (_COMPUTE if state_in_place else 0),
                 vk.VK_ACCESS_TRANSFER_READ_BIT | vk.VK_ACCESS_HOST_READ_BIT
                 | (_SHADER_RW if state_in_place else 0))
        for t in staged_outputs:
            _copy(cmd, t.buffer, t.staging, t.staging.size)
        for src, dst in state_copies:
            _copy(cmd, src.buffer, dst.buffer, src.nbytes_for(src.device_dtype, src.max_shape))
        if state_copies:
            # The state inputs are read by the next run's dispatches (and by the host
            # or a transfer when the program asks for the state's value).
            _barrier(cmd, _TRANSFER, vk.VK_ACCESS_TRANSFER_WRITE_BIT,
                     vk.VK_PIPELINE_STAGE_HOST_BIT | _COMPUTE | _TRANSFER,
                     vk.VK_ACCESS_HOST_READ_BIT | _SHADER_RW | vk.VK_ACCESS_TRANSFER_READ_BIT
                     | vk.VK_ACCESS_TRANSFER_WRITE_BIT)
        else:
            _barrier(cmd, _TRANSFER, vk.VK_ACCESS_TRANSFER_WRITE_BIT,
                     vk.VK_PIPELINE_STAGE_HOST_BIT, vk.VK_ACCESS_HOST_READ_BIT)
    else:
        _barrier(cmd, _COMPUTE, vk.VK_ACCESS_SHADER_WRITE_BIT,
                 vk.VK_PIPELINE_STAGE_HOST_BIT | (_COMPUTE if state_in_place else 0),
                 vk.VK_ACCESS_HOST_READ_BIT | (_SHADER_RW if state_in_place else 0))
    vk_call(vk.vkEndCommandBuffer, cmd, what="the graph")
    return cmd, barriers


def record_join(device):
    """A command buffer holding one full memory barrier (every earlier command's
    writes visible to every later command), submitted between two repeats of a
    graph's command buffer in one vkQueueSubmit (``DelegateGraph.execute(repeat=)``):
    run k + 1's input copies and shaders then follow run k's as if run k had been a
    submit of its own that the host waited for."""
    cmd = _begin(device, what="the repeat barrier",
                 flags=vk.VK_COMMAND_BUFFER_USAGE_SIMULTANEOUS_USE_BIT)
    _barrier(cmd, vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, vk.VK_ACCESS_MEMORY_WRITE_BIT,
             vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT,
             vk.VK_ACCESS_MEMORY_READ_BIT | vk.VK_ACCESS_MEMORY_WRITE_BIT)
    vk_call(vk.vkEndCommandBuffer, cmd, what="the repeat barrier")
    return cmd


def run_once(device, fill, timeout_s: float = 60.0) -> None:
    """Record commands with ``fill(cmd)`` into the device's one-off command buffer,
    submit it and wait (used at load, e.g. to copy constants from staging memory, and
    to read or write a state through its staging buffer). The command buffer and fence
    are made once per Device and reused (``Device.one_off``); calls from several
    threads take turns. Raises VkDelegateError if the GPU does not finish within
    ``timeout_s`` (that pair is then never reused)."""
    from vkdelegate.runtime.vkcall import wait_fence
    dev = device.device
    with device.once_lock:
        cmd, fence = device.one_off()
        try:
            _start(cmd, "an upload", vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT)
            fill(cmd)
            vk_call(vk.vkEndCommandBuffer, cmd, what="an upload")
            vk_call(vk.vkResetFences, dev, 1, [fence], what="an upload")
            submit = vk.VkSubmitInfo(sType=vk.VK_STRUCTURE_TYPE_SUBMIT_INFO,
                                     commandBufferCount=1, pCommandBuffers=[cmd])
            with device.queue_lock:
                vk_call(vk.vkQueueSubmit, device.queue, 1, [submit], fence, what="an upload")
            wait_fence(dev, fence, timeout_s, "an upload")
        except BaseException:
            device.drop_one_off()
            raise


def copy_once(device, copies, timeout_s: float = 60.0) -> None:
    """Copy buffers now, ordered after all earlier GPU work and visible to all later
    work and to the host: copies are (source Buffer, destination Buffer, bytes)."""
    everything = (_COMPUTE | _TRANSFER | vk.VK_PIPELINE_STAGE_HOST_BIT)
    access = (_SHADER_RW | vk.VK_ACCESS_TRANSFER_READ_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT
              | vk.VK_ACCESS_HOST_READ_BIT | vk.VK_ACCESS_HOST_WRITE_BIT)

    def fill(cmd):
        _barrier(cmd, everything, access, _TRANSFER,
                 vk.VK_ACCESS_TRANSFER_READ_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT)
        for src, dst, size in copies:
            _copy(cmd, src, dst, size)
        _barrier(cmd, _TRANSFER, vk.VK_ACCESS_TRANSFER_WRITE_BIT, everything, access)
    run_once(device, fill, timeout_s)
