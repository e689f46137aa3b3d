"""Device choice, validation messages and the Vulkan call wrapper."""
import time

import numpy as np
import pytest
import vulkan as vk

from vkdelegate.errors import VkDelegateError
from vkdelegate.runtime import Device, list_devices
from vkdelegate.runtime.device import drain_validation_messages
from vkdelegate.runtime.device_info import DeviceInfo, select
from vkdelegate.runtime.vkcall import FenceSubmit, vk_call, wait_fence


def test_list_devices_reports_compute_properties(vk_device):
    infos = list_devices()
    assert infos and infos[0].name
    mine = next(d for d in infos if d.name == vk_device.info.name)
    assert mine.max_storage_buffer_range > 0 and mine.max_workgroup_invocations >= 128


def test_selection_rules():
    infos = [_fake(0, "llvmpipe", "cpu"), _fake(1, "Radeon 780M", "integrated"),
             _fake(2, "RTX 4090", "discrete")]
    assert select(infos, None).name == "RTX 4090"          # discrete first
    assert select(infos[:2], None).name == "Radeon 780M"   # then integrated, then CPU
    assert select(infos, "1").name == "Radeon 780M"        # index
    assert select(infos, "radeon").name == "Radeon 780M"   # name substring
    with pytest.raises(VkDelegateError, match="no Vulkan device name contains 'mali'; "
                                              "devices: 0: llvmpipe, 1: Radeon 780M"):
        select(infos, "mali")
    with pytest.raises(VkDelegateError, match="index 7 out of range"):
        select(infos, 7)


def _fake(index, name, kind):
    return DeviceInfo(index=index, name=name, type=kind, driver="", api_version="1.3")


def test_device_by_name_substring(vk_device):
    word = vk_device.info.name.split()[0]
    dev = Device(word.upper())
    try:
        assert dev.info.name == vk_device.info.name
    finally:
        dev.close()


def test_validation_layer_messages_are_recorded(vk_device):
    # A zero-size buffer is invalid usage: the layer must report it, which proves that
    # the autouse fixture would catch real mistakes.
    info = vk.VkBufferCreateInfo(sType=vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, size=0,
                                 usage=vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT,
                                 sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE)
    try:
        buf = vk.vkCreateBuffer(vk_device.device, info, None)
        vk.vkDestroyBuffer(vk_device.device, buf, None)
    except vk.VkError:
        pass
    messages = drain_validation_messages()
    assert any("VUID-VkBufferCreateInfo-size" in m for m in messages), messages


def test_vk_call_names_the_call_and_object():
    def vkAllocateMemory(*args):
        raise vk.VkErrorOutOfDeviceMemory()
    with pytest.raises(VkDelegateError, match="vkAllocateMemory failed for tensor 3: "
                                              "VkErrorOutOfDeviceMemory"):
        vk_call(vkAllocateMemory, what="tensor 3")


def test_fence_timeout_is_an_error(vk_device):
    dev = vk_device.device
    fence = vk.vkCreateFence(dev, vk.VkFenceCreateInfo(
        sType=vk.VK_STRUCTURE_TYPE_FENCE_CREATE_INFO), None)
    try:
        with pytest.raises(VkDelegateError, match="execute: the GPU did not finish within "
                                                  "0.01 s"):
            wait_fence(dev, fence, 0.01, "execute")
    finally:
        vk.vkDestroyFence(dev, fence, None)


@pytest.mark.parametrize("spin_s", [0.0, 0.002])
def test_fence_submit_runs_and_times_out(vk_device, monkeypatch, spin_s):
    """FenceSubmit's direct calls, blocking at once or polling first: an empty command
    buffer submitted and waited for twice (the fence reset in between), then a wait
    on a fence nothing will signal (the poll gives up, the blocking wait times out)."""
    from vkdelegate.runtime import commands
    monkeypatch.setattr(vk_device, "fence_spin_s", spin_s)
    dev = vk_device.device
    fence = vk.vkCreateFence(dev, vk.VkFenceCreateInfo(
        sType=vk.VK_STRUCTURE_TYPE_FENCE_CREATE_INFO), None)
    cmd = commands.record_join(vk_device)
    try:
        submit = FenceSubmit(vk_device, [cmd, cmd], fence, "a test")
        for _ in range(2):
            submit.submit()
            submit.wait(10.0, "a test")
            assert vk.lib.vkGetFenceStatus(dev, fence) == vk.VK_SUCCESS
        vk.vkResetFences(dev, 1, [fence])
        start = time.perf_counter()
        with pytest.raises(VkDelegateError, match="a test: the GPU did not finish "
                                                  "within 0.01 s"):
            submit.wait(0.01, "a test")
        assert time.perf_counter() - start >= spin_s + 0.01
    finally:
        vk.vkQueueWaitIdle(vk_device.queue)
        vk.vkFreeCommandBuffers(dev, vk_device.command_pool, 1, [cmd])
        vk.vkDestroyFence(dev, fence, None)


def test_over_storage_buffer_range_names_the_tensor(vk_device):
    from tests.runtime.graphs import GraphMaker
    limit = vk_device.info.max_storage_buffer_range
    m = GraphMaker()
    ix = m.input((limit // 4 + 1,))
    m.output(m.op("aten.relu.default", [ix], (limit // 4 + 1,)))
    with pytest.raises(VkDelegateError, match=r"tensor 0 needs \d+ bytes, over this "
                                              r"device's maxStorageBufferRange"):
        m.build(vk_device)


def test_synchronization_validation_catches_a_missing_barrier(vk_device, monkeypatch):
    # Drop every compute->compute barrier: the dependent second dispatch then reads
    # the first one's output unsynchronized, which the layer must report.
    from tests.runtime.graphs import GraphMaker
    from vkdelegate.runtime import commands

    original = commands._barrier

    def without_compute_barriers(cmd, src_stage, src_access, dst_stage, dst_access):
        if not (src_stage == dst_stage == commands._COMPUTE):
            original(cmd, src_stage, src_access, dst_stage, dst_access)
    monkeypatch.setattr(commands, "_barrier", without_compute_barriers)
    m = GraphMaker()
    ix = m.input((8,))
    m.output(m.op("aten.neg.default", [m.op("aten.relu.default", [ix], (8,))], (8,)))
    with m.build(vk_device) as graph:
        graph.execute([np.ones(8, np.float32)])
    messages = drain_validation_messages()
    assert any("SYNC-HAZARD-READ-AFTER-WRITE" in msg for msg in messages), messages


def test_tensor_meta_record_mirrors_the_glsl_block():
    # The std140 record in params.py and the GLSL struct in tensor_meta.h must agree:
    # same members in the same order, every member a 16-byte ivec4 row.
    import re

    from vkdelegate.runtime.params import META_BYTES, meta_record
    from vkdelegate.shaders.compiler import GLSL_DIR

    source = (GLSL_DIR / "tensor_meta.h").read_text()
    body = re.search(r"struct TensorMeta \{(.*?)\};", source, re.S).group(1)
    members = re.findall(r"^\s*(\w+)\s+(\w+)(?:\[(\d+)\])?;", body, re.M)
    assert [(t, n) for t, n, _ in members] == [("ivec4", "sizes"), ("ivec4", "strides"),
                                              ("ivec4", "info")]
    assert sum(16 * int(c or 1) for _, _, c in members) == META_BYTES
    rec = meta_record((2, 3, 5))
    assert rec[0:8].tolist() == [5, 3, 2, 1, 1, 1, 1, 1]     # sizes, innermost first
    assert rec[8:16].tolist() == [1, 5, 15, 0, 0, 0, 0, 0]   # strides
    assert rec[16:18].tolist() == [30, 3]                    # numel, ndim


def test_fence_spin_setting(monkeypatch):
    """Device's fence_spin_us: the argument, else $VKDELEGATE_FENCE_SPIN_US, else 2 ms
    on GPUs and 0 on CPU drivers; bad values name the setting."""
    import dataclasses

    from vkdelegate.runtime.device import FENCE_SPIN_S, _fence_spin
    fields = {f.name: None for f in dataclasses.fields(DeviceInfo)}
    gpu = DeviceInfo(**dict(fields, type="discrete"))
    cpu = DeviceInfo(**dict(fields, type="cpu"))
    monkeypatch.delenv("VKDELEGATE_FENCE_SPIN_US", raising=False)
    assert _fence_spin(None, gpu) == FENCE_SPIN_S > 0 and _fence_spin(None, cpu) == 0
    assert _fence_spin(500, cpu) == 0.0005 and _fence_spin(0, gpu) == 0
    monkeypatch.setenv("VKDELEGATE_FENCE_SPIN_US", "250")
    assert _fence_spin(None, cpu) == 0.00025 and _fence_spin(0, cpu) == 0
    for bad in ("-1", "nan", "fast", "2e6"):
        monkeypatch.setenv("VKDELEGATE_FENCE_SPIN_US", bad)
        with pytest.raises(VkDelegateError, match=r"\$VKDELEGATE_FENCE_SPIN_US must be "
                                                  r"a number of microseconds"):
            _fence_spin(None, gpu)
    with pytest.raises(VkDelegateError, match="fence_spin_us must be"):
        _fence_spin(-5, gpu)
