"""Uniform texel buffers: the tensor inputs a shader reads through a VkBufferView.

A variant declares such an input in its Bindings (``texels``, shaders/bindings.py;
GLSL ``TEXEL_IN`` in common.h). On llvmpipe (lavapipe) a storage-buffer load whose
address is not a compile-time or push-constant expression runs as a loop over the 8
SIMD lanes with a branch per lane, while a ``texelFetch`` from a uniform texel buffer
is one vectorised gather: 4096 invocations summing 256 vec4 loads each took 4.5-8 ms
from a storage buffer and 1.5 ms from a texel buffer (docs/PERF.md, "lavapipe:
texel-buffer loads"). So the CPU drivers' hot kernels read their large read-only
inputs this way (``Device.texel_inputs``); GPUs keep storage buffers.

Limits, read once per device (``DeviceInfo``): a view holds at most
``maxTexelBufferElements`` texels (the spec's minimum is 65536), its offset is a
multiple of ``minTexelBufferOffsetAlignment`` (ours is always 0: every tensor has a
VkBuffer of its own, aliased ones included), its size a multiple of the texel's, and
the format must have VK_FORMAT_FEATURE_UNIFORM_TEXEL_BUFFER_BIT. ``unfit`` says why a
tensor's buffer cannot be viewed; the op then keeps the storage-buffer form.
"""
from __future__ import annotations

import vulkan as vk

from vkdelegate.runtime.vkcall import vk_call
from vkdelegate.shaders.bindings import TEXEL_FORMATS

VK_FORMATS = {
    "rgba32f": vk.VK_FORMAT_R32G32B32A32_SFLOAT,
    "r32f": vk.VK_FORMAT_R32_SFLOAT,
    "rgba16f": vk.VK_FORMAT_R16G16B16A16_SFLOAT,
    "r16f": vk.VK_FORMAT_R16_SFLOAT,
    "rgba32ui": vk.VK_FORMAT_R32G32B32A32_UINT,
}
assert set(VK_FORMATS) == set(TEXEL_FORMATS)
USAGE = vk.VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT


def supported_formats(pd) -> frozenset:
    """The names of VK_FORMATS that physical device ``pd`` can read as uniform texel
    buffers."""
    return frozenset(
        name for name, fmt in VK_FORMATS.items()
        if vk.vkGetPhysicalDeviceFormatProperties(pd, fmt).bufferFeatures
        & vk.VK_FORMAT_FEATURE_UNIFORM_TEXEL_BUFFER_BIT)


def unfit(device, buffer, fmt: str) -> "str | None":
    """None when ``buffer`` (a memory.Buffer) can be bound as a uniform texel buffer of
    format ``fmt`` on ``device`` whole, else why not."""
    info = device.info
    texel = TEXEL_FORMATS[fmt]
    if not getattr(device, "texel_inputs", False):
        return "the device reads inputs from storage buffers"
    if fmt not in info.texel_formats:
        return f"format {fmt} is not a uniform texel buffer format of {info.name}"
    if not buffer.usage & USAGE:
        return f"{buffer.what} was not created for texel views"
    if buffer.size % texel:
        return f"{buffer.what} has {buffer.size} bytes, not whole {texel}-byte texels"
    if buffer.size // texel > info.max_texel_buffer_elements:
        return (f"{buffer.what} has {buffer.size // texel} texels, over the device's "
                f"maxTexelBufferElements {info.max_texel_buffer_elements}")
    return None


def create_view(device, buffer, fmt: str):
    """A VkBufferView of format ``fmt`` over the whole of ``buffer`` (offset 0, which
    meets any minTexelBufferOffsetAlignment); the caller checked ``unfit``."""
    info = vk.VkBufferViewCreateInfo(sType=vk.VK_STRUCTURE_TYPE_BUFFER_VIEW_CREATE_INFO,
                                     buffer=buffer.handle, format=VK_FORMATS[fmt],
                                     offset=0, range=buffer.size)
    return vk_call(vk.vkCreateBufferView, device.device, info, None,
                   what=f"a {fmt} texel view of {buffer.what}")
