"""The one place where Vulkan calls are made and their failures translated.

The ``vulkan`` package raises a bare exception class for any result other than
VK_SUCCESS: no message, no name of the call. ``VkTimeout`` (a positive result code)
is not even a subclass of ``VkError``. Every runtime call goes through ``vk_call`` so
that a failure becomes a ``VkDelegateError`` naming the Vulkan function and the object
it was working on; a fence wait that times out is reported by ``wait_fence`` with the
timeout in seconds.
"""
from __future__ import annotations

import time

import vulkan as vk

from vkdelegate.errors import VkDelegateError


def vk_call(fn, *args, what: str = ""):
    """Call the Vulkan binding ``fn(*args)`` and return its result.

    what: the object the call works on ("tensor 3", "pipeline binary_op"), put in the
    error message. Raises VkDelegateError naming the call, the result code's name and
    ``what`` when the binding raises (any VkException/VkError, including VkTimeout).
    """
    try:
        return fn(*args)
    except (vk.VkException, vk.VkError) as exc:
        name = getattr(fn, "__name__", str(fn))
        target = f" for {what}" if what else ""
        raise VkDelegateError(
            f"{name} failed{target}: {type(exc).__name__}") from None


def _result_name(code: int) -> str:
    """The binding's exception name for a VkResult code (VkErrorDeviceLost), else the
    number."""
    exc = vk.exception_codes.get(code)
    return exc.__name__ if exc is not None else f"VkResult {code}"


def _check_wait(code: int, timeout_s: float, what: str) -> None:
    if code == vk.VK_SUCCESS:
        return
    if code == vk.VK_TIMEOUT:
        raise VkDelegateError(
            f"{what}: the GPU did not finish within {timeout_s:g} s "
            f"(vkWaitForFences timed out)")
    raise VkDelegateError(f"vkWaitForFences failed for {what}: {_result_name(code)}")


def wait_fence(device, fence, timeout_s: float, what: str) -> None:
    """Block until ``fence`` signals; VkDelegateError if ``timeout_s`` passes first
    (so that a hung dispatch never hangs the caller) or the wait fails (naming the
    result, e.g. VkErrorDeviceLost)."""
    fences = vk.ffi.new("VkFence[1]", [fence])
    _check_wait(vk.lib.vkWaitForFences(device, 1, fences, vk.VK_TRUE,
                                       int(timeout_s * 1e9)), timeout_s, what)


class FenceSubmit:
    """A vkQueueSubmit of fixed command buffers that signals ``fence``, with the
    binding's per-call conversions done once: the submit info, command buffer and
    fence arrays are built here and the three calls of a run (vkResetFences,
    vkQueueSubmit, vkWaitForFences) go to the loader directly. Through the binding's
    wrappers they cost about 4 us each on a 2-core x86 host (their argument
    conversion), directly 0.3 us.

    device: runtime.device.Device (its ``queue`` and ``queue_lock``); cmds: the
    VkCommandBuffer handles in submit order; what: the object named in errors.
    """

    def __init__(self, device, cmds: list, fence, what: str):
        self._device = device
        self._cmds = vk.ffi.new("VkCommandBuffer[]", list(cmds))
        self._info = vk.ffi.new("VkSubmitInfo *")
        self._info.sType = vk.VK_STRUCTURE_TYPE_SUBMIT_INFO
        self._info.commandBufferCount = len(cmds)
        self._info.pCommandBuffers = self._cmds
        self._fences = vk.ffi.new("VkFence[1]", [fence])
        self._what = what

    def submit(self) -> None:
        """Reset the fence and submit (the fence must not be in use: the previous
        submit's wait returned). VkDelegateError naming the failing call's result."""
        dev = self._device.device
        code = vk.lib.vkResetFences(dev, 1, self._fences)
        if code != vk.VK_SUCCESS:
            raise VkDelegateError(f"vkResetFences failed for {self._what}: "
                                  f"{_result_name(code)}")
        with self._device.queue_lock:
            code = vk.lib.vkQueueSubmit(self._device.queue, 1, self._info,
                                        self._fences[0])
        if code != vk.VK_SUCCESS:
            raise VkDelegateError(f"vkQueueSubmit failed for {self._what}: "
                                  f"{_result_name(code)}")

    def wait(self, timeout_s: float, what: str) -> None:
        """``wait_fence`` on this submit's fence, after polling it for the device's
        ``fence_spin_s`` seconds (runtime/device.py ``FENCE_SPIN_S``: a GPU's run
        that ends within it is seen at once instead of after a blocked thread's
        wake-up). The timeout counts from the blocking wait; VkDelegateError as
        ``wait_fence``, or naming vkGetFenceStatus's failure (VkErrorDeviceLost)."""
        dev = self._device.device
        spin = self._device.fence_spin_s
        if spin > 0:
            status, fence, clock = vk.lib.vkGetFenceStatus, self._fences[0], time.perf_counter
            end = clock() + spin
            while True:
                code = status(dev, fence)
                if code == vk.VK_SUCCESS:
                    return
                if code != vk.VK_NOT_READY:
                    raise VkDelegateError(f"vkGetFenceStatus failed for {what}: "
                                          f"{_result_name(code)}")
                if clock() >= end:
                    break
        _check_wait(vk.lib.vkWaitForFences(dev, 1, self._fences, vk.VK_TRUE,
                                           int(timeout_s * 1e9)), timeout_s, what)
