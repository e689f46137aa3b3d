"""What the driver's compiler made of a shader: VK_KHR_pipeline_executable_properties.

A tuning aid, off by default. With ``VKDELEGATE_PIPELINE_STATS=1`` in the environment
(or ``Device(pipeline_statistics=True)``) a device that has the extension enables it
(feature ``pipelineExecutableInfo``) and creates every pipeline with
VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR; ``Pipeline.statistics()`` then returns
the driver's statistics of each executable of the pipeline (a compute pipeline has
one): names and meanings are the driver's own (NVIDIA reports e.g. a register count;
Mesa's RADV/ANV report instruction, register and spill counts; lavapipe has no such
extension). Capturing may slow pipeline creation and disable the driver's own caches,
hence opt-in.

Convention: the Vulkan spec, "Pipeline Properties" (vkGetPipelineExecutablePropertiesKHR,
vkGetPipelineExecutableStatisticsKHR).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import vulkan as vk

from vkdelegate.errors import VkDelegateError

EXTENSION = "VK_KHR_pipeline_executable_properties"
ENV = "VKDELEGATE_PIPELINE_STATS"


def requested() -> bool:
    """Whether the environment asks for pipeline statistics (``VKDELEGATE_PIPELINE_STATS=1``)."""
    return os.environ.get(ENV) == "1"


def feature_struct(pnext):
    """The feature structure that enables ``pipelineExecutableInfo``, chained before
    ``pnext`` (the rest of VkDeviceCreateInfo's pNext chain, or None)."""
    return vk.VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR(
        sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR,
        pNext=pnext, pipelineExecutableInfo=vk.VK_TRUE)


def create_flags(device) -> int:
    """VkPipelineCreateFlags for a pipeline of ``device``: capture statistics where the
    device has them enabled, else 0."""
    return vk.VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR \
        if getattr(device, "pipeline_statistics", False) else 0


@dataclass
class Executable:
    """One executable of a pipeline: ``name`` and ``description`` as the driver gives
    them, ``subgroup_size`` (0 where the driver does not say) and ``statistics``
    (statistic name -> bool, int or float; units as the statistic's description)."""

    name: str
    description: str
    subgroup_size: int
    statistics: dict = field(default_factory=dict)


_VALUE_FIELDS = {
    vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR: ("b32", bool),
    vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR: ("i64", int),
    vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR: ("u64", int),
    vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_FLOAT64_KHR: ("f64", float),
}


def _entry(device, name: str):
    ptr = vk.lib.vkGetDeviceProcAddr(device.device, name.encode())
    if ptr == vk.ffi.NULL:
        raise VkDelegateError(f"device {device.info.name}: {name} is missing although "
                              f"{EXTENSION} is enabled")
    return vk.ffi.cast(f"PFN_{name}", ptr)


def _check(result, what: str) -> None:
    if result not in (vk.VK_SUCCESS, vk.VK_INCOMPLETE):
        raise VkDelegateError(f"{what} failed with VkResult {result}")


def executables(device, pipeline) -> list[Executable]:
    """The statistics of each executable of VkPipeline ``pipeline`` of ``device``.

    Raises VkDelegateError when the device was created without pipeline statistics
    (``device.pipeline_statistics`` false: the extension is missing, or
    ``VKDELEGATE_PIPELINE_STATS=1`` was not set) or a query fails."""
    if not getattr(device, "pipeline_statistics", False):
        raise VkDelegateError(
            f"device {device.info.name}: pipeline statistics are off (set {ENV}=1 before "
            f"the device is created; the device needs {EXTENSION})")
    get_props = _entry(device, "vkGetPipelineExecutablePropertiesKHR")
    get_stats = _entry(device, "vkGetPipelineExecutableStatisticsKHR")
    info = vk.ffi.new("VkPipelineInfoKHR*")
    info.sType = vk.VK_STRUCTURE_TYPE_PIPELINE_INFO_KHR
    info.pipeline = pipeline
    count = vk.ffi.new("uint32_t*")
    _check(get_props(device.device, info, count, vk.ffi.NULL), "vkGetPipelineExecutablePropertiesKHR")
    props = vk.ffi.new("VkPipelineExecutablePropertiesKHR[]", count[0])
    for i in range(count[0]):
        props[i].sType = vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_PROPERTIES_KHR
    _check(get_props(device.device, info, count, props), "vkGetPipelineExecutablePropertiesKHR")
    out = []
    for i in range(count[0]):
        exe = vk.ffi.new("VkPipelineExecutableInfoKHR*")
        exe.sType = vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR
        exe.pipeline = pipeline
        exe.executableIndex = i
        n = vk.ffi.new("uint32_t*")
        _check(get_stats(device.device, exe, n, vk.ffi.NULL), "vkGetPipelineExecutableStatisticsKHR")
        stats = vk.ffi.new("VkPipelineExecutableStatisticKHR[]", n[0])
        for j in range(n[0]):
            stats[j].sType = vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR
        _check(get_stats(device.device, exe, n, stats), "vkGetPipelineExecutableStatisticsKHR")
        values = {}
        for j in range(n[0]):
            slot, kind = _VALUE_FIELDS.get(stats[j].format, (None, None))
            if slot is not None:
                values[vk.ffi.string(stats[j].name).decode()] = kind(getattr(stats[j].value, slot))
        out.append(Executable(vk.ffi.string(props[i].name).decode(),
                              vk.ffi.string(props[i].description).decode(),
                              int(props[i].subgroupSize), values))
    return out
