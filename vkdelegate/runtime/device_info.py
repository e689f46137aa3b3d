"""What a physical device offers for compute, and the rule that picks one.

``describe`` queries properties, limits, driver and extensions into a ``DeviceInfo``,
whose ``capabilities`` is the device-capability table (vkdelegate/capabilities.py,
filled by runtime/device_features.py: features, subgroup sizes, cooperative matrices); ``select`` applies the device
choice rule (an index, a name substring, or the preference discrete > integrated >
virtual > CPU). Used by ``Device`` and by ``vkdelegate devices``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import vulkan as vk

from vkdelegate.capabilities import Capabilities
from vkdelegate.errors import VkDelegateError
from vkdelegate.runtime import device_features, texel
from vkdelegate.runtime.vkcall import vk_call

_TYPE_NAMES = {
    vk.VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: "discrete",
    vk.VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: "integrated",
    vk.VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: "virtual",
    vk.VK_PHYSICAL_DEVICE_TYPE_CPU: "cpu",
    vk.VK_PHYSICAL_DEVICE_TYPE_OTHER: "other",
}
# Preference order when nothing is selected explicitly.
_TYPE_RANK = {"discrete": 0, "integrated": 1, "virtual": 2, "cpu": 3, "other": 4}
# The binding defines only VK_API_VERSION_1_0; 1.2 is needed for the properties structs.
API_VERSION_1_2 = vk.VK_MAKE_VERSION(1, 2, 0)


def _feature(name: str) -> property:
    """A read-only flag: whether the capability table has Vulkan feature ``name``."""
    return property(lambda self: name in self.capabilities.features,
                    doc=f"Whether the device has {name} (Capabilities.features).")


@dataclass
class DeviceInfo:
    """What matters for compute about one physical device (see ``vkdelegate devices``).

    Sizes are in bytes; ``timestamp_period_ns`` is nanoseconds per timestamp tick.
    ``api_version`` is the device's own; ``capabilities.api_version`` the one used.
    The feature flags (``storage_16bit`` ...) read ``capabilities``.
    """

    index: int
    name: str
    type: str
    driver: str
    api_version: str
    capabilities: Capabilities = Capabilities()
    subgroup_ops: list[str] = field(default_factory=list)
    max_workgroup_count: tuple = ()
    max_workgroup_size: tuple = ()
    max_workgroup_invocations: int = 0
    max_uniform_buffer_range: int = 0
    max_allocation_count: int = 0
    max_allocation_size: int = 0
    max_push_constants: int = 0
    max_shared_memory: int = 0  # maxComputeSharedMemorySize, bytes
    min_storage_offset_alignment: int = 0
    # Uniform texel buffers (runtime/texel.py): texels per view, view offset alignment,
    # and the texel formats (runtime.texel.VK_FORMATS names) the device can read so.
    max_texel_buffer_elements: int = 0
    min_texel_offset_alignment: int = 0
    texel_formats: frozenset = frozenset()
    timestamp_period_ns: float = 0.0
    extensions: frozenset = frozenset()

    storage_16bit = _feature("storageBuffer16BitAccess")
    storage_8bit = _feature("storageBuffer8BitAccess")
    float16_arith = _feature("shaderFloat16")
    int8_arith = _feature("shaderInt8")
    cooperative_matrix = _feature("cooperativeMatrix")
    subgroup_size = property(lambda self: self.capabilities.subgroup_size,
                             doc="Capabilities.subgroup_size (invocations).")
    max_storage_buffer_range = property(
        lambda self: self.capabilities.max_storage_buffer_range,
        doc="Capabilities.max_storage_buffer_range (bytes).")


def text(x) -> str:
    """A char array from the binding as str (some fields already arrive as str)."""
    return x if isinstance(x, str) else vk.ffi.string(x).decode(errors="replace")


def _version(v: int) -> str:
    return f"{v >> 22}.{(v >> 12) & 0x3FF}.{v & 0xFFF}"


def describe(index: int, pd, instance, validation: bool = False) -> DeviceInfo:
    """DeviceInfo of physical device ``pd`` of ``instance`` (enumeration index
    ``index``); ``validation``: the instance runs the validation layer, so structures
    newer than the layer stay out of the queries (device_features.query)."""
    props = vk.vkGetPhysicalDeviceProperties(pd)
    limits = props.limits
    exts = frozenset(text(e.extensionName)
                     for e in vk_call(vk.vkEnumerateDeviceExtensionProperties, pd, None,
                                      what=f"device {index}"))
    info = DeviceInfo(
        index=index,
        name=text(props.deviceName),
        type=_TYPE_NAMES.get(props.deviceType, "other"),
        driver="",
        api_version=_version(props.apiVersion),
        capabilities=device_features.query(instance, pd, exts, validation),
        max_workgroup_count=tuple(limits.maxComputeWorkGroupCount),
        max_workgroup_size=tuple(limits.maxComputeWorkGroupSize),
        max_workgroup_invocations=limits.maxComputeWorkGroupInvocations,
        max_uniform_buffer_range=limits.maxUniformBufferRange,
        max_allocation_count=limits.maxMemoryAllocationCount,
        max_push_constants=limits.maxPushConstantsSize,
        max_shared_memory=limits.maxComputeSharedMemorySize,
        min_storage_offset_alignment=limits.minStorageBufferOffsetAlignment,
        max_texel_buffer_elements=limits.maxTexelBufferElements,
        min_texel_offset_alignment=limits.minTexelBufferOffsetAlignment,
        texel_formats=texel.supported_formats(pd),
        timestamp_period_ns=limits.timestampPeriod,
        extensions=exts,
    )
    if props.apiVersion >= API_VERSION_1_2:
        # Chained queries need Vulkan 1.2 structures; older devices report no extras.
        sub = vk.VkPhysicalDeviceSubgroupProperties(
            sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES)
        maint3 = vk.VkPhysicalDeviceMaintenance3Properties(
            sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES, pNext=sub)
        drv = vk.VkPhysicalDeviceDriverProperties(
            sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES, pNext=maint3)
        props2 = vk.VkPhysicalDeviceProperties2(
            sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, pNext=drv)
        vk.vkGetPhysicalDeviceProperties2(pd, props2)
        info.driver = (f"{text(drv.driverName)} "
                       f"{text(drv.driverInfo)}").strip()
        info.max_allocation_size = maint3.maxMemoryAllocationSize
        info.subgroup_ops = [n for bit, n in (
            (vk.VK_SUBGROUP_FEATURE_BASIC_BIT, "basic"),
            (vk.VK_SUBGROUP_FEATURE_ARITHMETIC_BIT, "arithmetic"),
            (vk.VK_SUBGROUP_FEATURE_SHUFFLE_BIT, "shuffle"),
            (vk.VK_SUBGROUP_FEATURE_BALLOT_BIT, "ballot")) if sub.supportedOperations & bit]
    return info


def select(infos: list[DeviceInfo], selector) -> DeviceInfo:
    """The device ``selector`` names (index or name substring, case-insensitive), or
    for None the first discrete, else integrated, virtual, CPU device. VkDelegateError
    lists the devices when nothing matches."""
    if not infos:
        raise VkDelegateError("no Vulkan device found (is a driver such as lavapipe, "
                              "Debian package mesa-vulkan-drivers, installed?)")
    if selector is None or selector == "":
        return min(infos, key=lambda d: (_TYPE_RANK[d.type], d.index))
    names = ", ".join(f"{d.index}: {d.name}" for d in infos)
    text = str(selector)
    if text.isdigit():
        if int(text) < len(infos):
            return infos[int(text)]
        raise VkDelegateError(f"Vulkan device index {text} out of range; devices: {names}")
    for d in infos:
        if text.lower() in d.name.lower():
            return d
    raise VkDelegateError(f"no Vulkan device name contains {text!r}; devices: {names}")
