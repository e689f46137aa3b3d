"""commands.run_once / copy_once: one command buffer and fence per Device, reused
(a fresh pair per call cost ~1 ms on an H100, once per decode chunk for the history
read), and a failed call leaves the next one working."""
import numpy as np
import pytest

from tests.vulkan_skip import vulkan_unavailable
from vkdelegate.runtime import commands
from vkdelegate.runtime.device import default_device
from vkdelegate.runtime.memory import STAGING_USAGE, Allocator

pytestmark = pytest.mark.skipif(bool(vulkan_unavailable()), reason="no Vulkan device")


def _pair(device, n):
    alloc = Allocator(device, block_size=1 << 16)
    src = alloc.buffer(4 * n, STAGING_USAGE, True, "source")
    dst = alloc.buffer(4 * n, STAGING_USAGE, True, "destination")
    return alloc, src, dst


def _view(buf, n):
    return buf.host[:4 * n].view(np.int32)


def test_copies_reuse_one_command_buffer_and_fence():
    device = default_device()
    alloc, src, dst = _pair(device, 64)
    try:
        seen = []
        for k in range(3):
            _view(src, 64)[:] = np.arange(64, dtype=np.int32) * (k + 1)
            commands.copy_once(device, [(src, dst, 4 * 64)])
            np.testing.assert_array_equal(_view(dst, 64), np.arange(64) * (k + 1))
            seen.append(device.one_off())
        assert seen[0] == seen[1] == seen[2]
    finally:
        alloc.close()


def test_a_failed_fill_drops_the_pair_and_the_next_call_works():
    device = default_device()
    alloc, src, dst = _pair(device, 16)
    try:
        commands.copy_once(device, [(src, dst, 64)])
        before = device.one_off()

        def broken(cmd):
            raise RuntimeError("recording failed")
        with pytest.raises(RuntimeError, match="recording failed"):
            commands.run_once(device, broken)
        _view(src, 16)[:] = 7
        commands.copy_once(device, [(src, dst, 64)])
        np.testing.assert_array_equal(_view(dst, 16), np.full(16, 7))
        assert device.one_off() != before  # a fresh pair after the failure
    finally:
        alloc.close()
