"""The one place where Vulkan calls are made and their failures translated.

The ``vulkan`` package raises a bare exception class for any result other than
VK_SUCCESS: no message, no name of the call. ``VkTimeout`` (a positive result code)
is not even a subclass of ``VkError``. Every runtime call goes through ``vk_call`` so
that a failure becomes a ``VkDelegateError`` naming the Vulkan function and the object
it was working on; a fence wait that times out is reported by ``wait_fence`` with the
timeout in seconds.
"""
from __future__ import annotations

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


def wait_fence(device, fence, timeout_s: float, what: str) -> None:
    """Block until ``fence`` signals; VkDelegateError if ``timeout_s`` passes first.

    The binding's VkTimeout is a VkException, not a VkError: it is treated here
    explicitly so that a hung dispatch never hangs the caller.
    """
    try:
        vk.vkWaitForFences(device, 1, [fence], vk.VK_TRUE, int(timeout_s * 1e9))
    except vk.VkTimeout:
        raise VkDelegateError(
            f"{what}: the GPU did not finish within {timeout_s:g} s "
            f"(vkWaitForFences timed out)") from None
    except (vk.VkException, vk.VkError) as exc:
        raise VkDelegateError(
            f"vkWaitForFences failed for {what}: {type(exc).__name__}") from None
