"""Vulkan context: instance, physical-device choice, logical device, compute queue.

``Device`` is the owner of everything device-wide: the instance (with the Khronos
validation layer and a debug-utils messenger when asked for), the logical device with
the 8/16-bit storage features enabled where the device has them, one compute queue, a
command pool and the pipeline cache. ``default_device()`` returns one shared Device per
selector, because creating an instance and a device costs far more than a graph.

Choice of the physical device: an explicit ``selector`` argument, else the environment
variable ``VKDELEGATE_DEVICE``; either an index into the enumeration order or a
case-insensitive substring of the device name. Without either, the first discrete GPU,
then integrated, then virtual, then CPU device (lavapipe) is used.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import vulkan as vk

from vkdelegate.errors import VkDelegateError
from vkdelegate.runtime.vkcall import vk_call

VALIDATION_LAYER = "VK_LAYER_KHRONOS_validation"

_TYPE_NAMES = {
    vk.VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: "discrete",
    vk.VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: "integrated",
    vk.VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: "virtual",
    vk.VK_PHYSICAL_DEVICE_TYPE_CPU: "cpu",
    vk.VK_PHYSICAL_DEVICE_TYPE_OTHER: "other",
}
# Preference order when nothing is selected explicitly.
_TYPE_RANK = {"discrete": 0, "integrated": 1, "virtual": 2, "cpu": 3, "other": 4}
_COOPMAT_EXTENSIONS = ("VK_KHR_cooperative_matrix", "VK_NV_cooperative_matrix")
# The binding defines only VK_API_VERSION_1_0; 1.2 is needed for the feature structs.
API_VERSION_1_2 = vk.VK_MAKE_VERSION(1, 2, 0)


@dataclass
class DeviceInfo:
    """What matters for compute about one physical device (see ``vkdelegate devices``).

    Sizes are in bytes; ``timestamp_period_ns`` is nanoseconds per timestamp tick.
    """

    index: int
    name: str
    type: str
    driver: str
    api_version: str
    storage_8bit: bool = False
    storage_16bit: bool = False
    float16_arith: bool = False
    int8_arith: bool = False
    subgroup_size: int = 0
    subgroup_ops: list[str] = field(default_factory=list)
    cooperative_matrix: bool = False
    max_workgroup_count: tuple = ()
    max_workgroup_size: tuple = ()
    max_workgroup_invocations: int = 0
    max_storage_buffer_range: int = 0
    max_uniform_buffer_range: int = 0
    max_allocation_count: int = 0
    max_push_constants: int = 0
    min_storage_offset_alignment: int = 0
    timestamp_period_ns: float = 0.0
    extensions: frozenset = frozenset()


def _text(x) -> str:
    """A char array from the binding as str (some fields already arrive as str)."""
    return x if isinstance(x, str) else vk.ffi.string(x).decode(errors="replace")


def _version(v: int) -> str:
    return f"{v >> 22}.{(v >> 12) & 0x3FF}.{v & 0xFFF}"


def _describe(index: int, pd) -> DeviceInfo:
    props = vk.vkGetPhysicalDeviceProperties(pd)
    limits = props.limits
    exts = frozenset(_text(e.extensionName)
                     for e in vk.vkEnumerateDeviceExtensionProperties(pd, None))
    info = DeviceInfo(
        index=index,
        name=_text(props.deviceName),
        type=_TYPE_NAMES.get(props.deviceType, "other"),
        driver="",
        api_version=_version(props.apiVersion),
        cooperative_matrix=any(e in exts for e in _COOPMAT_EXTENSIONS),
        max_workgroup_count=tuple(limits.maxComputeWorkGroupCount),
        max_workgroup_size=tuple(limits.maxComputeWorkGroupSize),
        max_workgroup_invocations=limits.maxComputeWorkGroupInvocations,
        max_storage_buffer_range=limits.maxStorageBufferRange,
        max_uniform_buffer_range=limits.maxUniformBufferRange,
        max_allocation_count=limits.maxMemoryAllocationCount,
        max_push_constants=limits.maxPushConstantsSize,
        min_storage_offset_alignment=limits.minStorageBufferOffsetAlignment,
        timestamp_period_ns=limits.timestampPeriod,
        extensions=exts,
    )
    if props.apiVersion >= API_VERSION_1_2:
        # Chained queries need Vulkan 1.2 structures; older devices report no extras.
        f11 = vk.VkPhysicalDeviceVulkan11Features(
            sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES)
        f12 = vk.VkPhysicalDeviceVulkan12Features(
            sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES, pNext=f11)
        feats = vk.VkPhysicalDeviceFeatures2(
            sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, pNext=f12)
        vk.vkGetPhysicalDeviceFeatures2(pd, feats)
        info.storage_16bit = bool(f11.storageBuffer16BitAccess)
        info.storage_8bit = bool(f12.storageBuffer8BitAccess)
        info.float16_arith = bool(f12.shaderFloat16)
        info.int8_arith = bool(f12.shaderInt8)
        sub = vk.VkPhysicalDeviceSubgroupProperties(
            sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES)
        drv = vk.VkPhysicalDeviceDriverProperties(
            sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES, pNext=sub)
        props2 = vk.VkPhysicalDeviceProperties2(
            sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, pNext=drv)
        vk.vkGetPhysicalDeviceProperties2(pd, props2)
        info.driver = (f"{_text(drv.driverName)} "
                       f"{_text(drv.driverInfo)}").strip()
        info.subgroup_size = sub.subgroupSize
        info.subgroup_ops = [n for bit, n in (
            (vk.VK_SUBGROUP_FEATURE_BASIC_BIT, "basic"),
            (vk.VK_SUBGROUP_FEATURE_ARITHMETIC_BIT, "arithmetic"),
            (vk.VK_SUBGROUP_FEATURE_SHUFFLE_BIT, "shuffle"),
            (vk.VK_SUBGROUP_FEATURE_BALLOT_BIT, "ballot")) if sub.supportedOperations & bit]
    return info


def _validation_available() -> bool:
    layers = vk.vkEnumerateInstanceLayerProperties()
    return any(_text(p.layerName) == VALIDATION_LAYER for p in layers)


# python-vulkan routes every debug-utils callback through one module-level slot, so one
# function here fans messages out to the validated devices that are alive.
_MESSAGE_SINKS: dict[int, list] = {}


def _on_validation_message(severity, types, data, user_data):
    text = _text(data.pMessage)
    for sink in _MESSAGE_SINKS.values():
        sink.append(text)
    return vk.VK_FALSE


def _create_instance(validation: bool):
    app = vk.VkApplicationInfo(
        sType=vk.VK_STRUCTURE_TYPE_APPLICATION_INFO, pApplicationName="vkdelegate",
        applicationVersion=1, pEngineName="vkdelegate", engineVersion=1,
        apiVersion=API_VERSION_1_2)
    layers = [VALIDATION_LAYER] if validation else []
    extensions = [vk.VK_EXT_DEBUG_UTILS_EXTENSION_NAME] if validation else []
    create = vk.VkInstanceCreateInfo(
        sType=vk.VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, pApplicationInfo=app,
        enabledLayerCount=len(layers), ppEnabledLayerNames=layers,
        enabledExtensionCount=len(extensions), ppEnabledExtensionNames=extensions)
    return vk_call(vk.vkCreateInstance, create, None, what="the Vulkan instance")


def list_devices() -> list[DeviceInfo]:
    """Every physical device the Vulkan loader reports, in enumeration order."""
    instance = _create_instance(validation=False)
    try:
        return [_describe(i, pd) for i, pd in
                enumerate(vk_call(vk.vkEnumeratePhysicalDevices, instance))]
    finally:
        vk.vkDestroyInstance(instance, None)


def _select(infos: list[DeviceInfo], selector) -> DeviceInfo:
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


class Device:
    """One logical Vulkan device with a compute queue.

    selector: device index or name substring (default: ``$VKDELEGATE_DEVICE``, else the
    preferred device). validation: enable VK_LAYER_KHRONOS_validation and record every
    warning and error it reports in ``validation_messages`` (list of str).
    small_storage=False: leave 8/16-bit storage off even where the device has it, so
    that narrow dtypes use the 32-bit fallback (see vkdelegate.runtime.dtypes).
    Raises VkDelegateError when no device matches or a Vulkan call fails. Call
    ``close()`` when done (graphs built on the device must be closed first).
    """

    def __init__(self, selector=None, validation: bool = False,
                 small_storage: bool = True):
        if selector is None:
            selector = os.environ.get("VKDELEGATE_DEVICE")
        if validation and not _validation_available():
            raise VkDelegateError(f"validation requested but {VALIDATION_LAYER} is not "
                                  f"installed (Debian package vulkan-validationlayers)")
        self.validation_messages: list[str] = []
        self._messenger = None
        self.instance = _create_instance(validation)
        if validation:
            self._install_messenger()
        physical = vk_call(vk.vkEnumeratePhysicalDevices, self.instance)
        self.info = _select([_describe(i, pd) for i, pd in enumerate(physical)], selector)
        if not small_storage:
            # Behave like a device without 8/16-bit storage (tests the fallback path).
            self.info.storage_8bit = self.info.storage_16bit = False
        self.physical = physical[self.info.index]
        self.memory_properties = vk.vkGetPhysicalDeviceMemoryProperties(self.physical)
        self.queue_family, self.timestamp_bits = self._compute_family()
        self.device = self._create_device()
        self.queue = vk.vkGetDeviceQueue(self.device, self.queue_family, 0)
        pool_info = vk.VkCommandPoolCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
            flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
            queueFamilyIndex=self.queue_family)
        self.command_pool = vk_call(vk.vkCreateCommandPool, self.device, pool_info, None,
                                    what="the command pool")
        from vkdelegate.runtime.pipeline import PipelineCache
        self.pipelines = PipelineCache(self)
        self._closed = False

    def _install_messenger(self):
        create = vk.VkDebugUtilsMessengerCreateInfoEXT(
            sType=vk.VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT,
            messageSeverity=(vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT
                             | vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT),
            messageType=(vk.VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT
                         | vk.VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT
                         | vk.VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT),
            pfnUserCallback=_on_validation_message)
        create_fn = vk.vkGetInstanceProcAddr(self.instance, "vkCreateDebugUtilsMessengerEXT")
        self._messenger = vk_call(create_fn, self.instance, create, None,
                                  what="the validation messenger")
        _MESSAGE_SINKS[id(self)] = self.validation_messages

    def _compute_family(self):
        families = vk.vkGetPhysicalDeviceQueueFamilyProperties(self.physical)
        for i, fam in enumerate(families):
            if fam.queueFlags & vk.VK_QUEUE_COMPUTE_BIT:
                return i, fam.timestampValidBits
        raise VkDelegateError(f"device {self.info.name} has no compute queue")

    def _create_device(self):
        queue_info = vk.VkDeviceQueueCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
            queueFamilyIndex=self.queue_family, queueCount=1, pQueuePriorities=[1.0])
        chain = None
        if self.info.storage_8bit or self.info.storage_16bit:
            # Enable exactly what the device has; shaders for dtypes it lacks use the
            # 32-bit fallback storage (see vkdelegate.runtime.dtypes).
            f11 = vk.VkPhysicalDeviceVulkan11Features(
                sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES,
                storageBuffer16BitAccess=self.info.storage_16bit)
            chain = vk.VkPhysicalDeviceVulkan12Features(
                sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES,
                pNext=f11, storageBuffer8BitAccess=self.info.storage_8bit)
        create = vk.VkDeviceCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, pNext=chain,
            queueCreateInfoCount=1, pQueueCreateInfos=[queue_info])
        return vk_call(vk.vkCreateDevice, self.physical, create, None,
                       what=f"device {self.info.name}")

    def find_memory_type(self, type_bits: int, required: int, preferred: int = 0) -> int:
        """Index of a memory type allowed by ``type_bits`` with all ``required`` flags,
        preferring one that also has ``preferred``. VkDelegateError if none fits."""
        mp = self.memory_properties
        candidates = [i for i in range(mp.memoryTypeCount)
                      if type_bits & (1 << i)
                      and (mp.memoryTypes[i].propertyFlags & required) == required]
        for i in candidates:
            if (mp.memoryTypes[i].propertyFlags & preferred) == preferred:
                return i
        if candidates:
            return candidates[0]
        raise VkDelegateError(f"device {self.info.name} has no memory type with flags "
                              f"{required:#x} among type bits {type_bits:#x}")

    def memory_flags(self, type_index: int) -> int:
        return self.memory_properties.memoryTypes[type_index].propertyFlags

    def close(self) -> None:
        """Destroy the pipelines, command pool, device and instance (idempotent)."""
        if self._closed:
            return
        self._closed = True
        vk.vkDeviceWaitIdle(self.device)
        self.pipelines.close()
        vk.vkDestroyCommandPool(self.device, self.command_pool, None)
        vk.vkDestroyDevice(self.device, None)
        if self._messenger is not None:
            destroy = vk.vkGetInstanceProcAddr(self.instance,
                                               "vkDestroyDebugUtilsMessengerEXT")
            destroy(self.instance, self._messenger, None)
            _MESSAGE_SINKS.pop(id(self), None)
        vk.vkDestroyInstance(self.instance, None)

    def __repr__(self) -> str:
        return f"Device({self.info.name!r}, {self.info.type})"


_DEFAULT: dict[str, Device] = {}


def default_device(selector=None) -> Device:
    """The shared Device for ``selector`` (see the module docstring), created once.

    With ``VKDELEGATE_VALIDATION=1`` in the environment the device runs under the
    Khronos validation layer (the test suite sets it).
    """
    key = str(selector if selector is not None else os.environ.get("VKDELEGATE_DEVICE", ""))
    if key not in _DEFAULT:
        validation = os.environ.get("VKDELEGATE_VALIDATION") == "1"
        _DEFAULT[key] = Device(selector, validation=validation)
    return _DEFAULT[key]


def drain_validation_messages() -> list[str]:
    """Messages the validation layer reported on any live Device since the last
    call, emptied."""
    out = []
    for sink in _MESSAGE_SINKS.values():
        out.extend(sink)
        sink.clear()
    return out
