"""The Vulkan side of the capability table (vkdelegate/capabilities.py).

``query`` fills a ``Capabilities`` from one physical device (features through
vkGetPhysicalDeviceFeatures2 with the Vulkan 1.1/1.2/1.3 and cooperative-matrix
structures chained, subgroup size and its range, maxStorageBufferRange, the
cooperative-matrix shapes and VK_NV_cooperative_matrix2's flexible shapes);
``enable_chain`` builds the pNext chain and extension list
that device creation passes, from the same table and the same structure names, so that
what is queried and what is enabled cannot drift apart. Structures of a version above
the effective API version, or of an absent extension, are neither queried nor chained
(the Vulkan spec forbids both).
"""
from __future__ import annotations

import cffi
import vulkan as vk

from vkdelegate.capabilities import (ALL_FEATURES, COOPERATIVE_MATRIX2_EXTENSION,
                                     COOPERATIVE_MATRIX2_FEATURES,
                                     COOPERATIVE_MATRIX_EXTENSION, FEATURES, MAX_API,
                                     Capabilities, CooperativeMatrixShape,
                                     FlexibleMatrixShape)

# VK_NV_cooperative_matrix2 is newer than the headers of the `vulkan` package (1.3.275):
# its structures are declared here, as vulkan_core.h lays them out (enums are 32-bit),
# and linked into pNext chains by address.
_NV = cffi.FFI()
_NV.cdef("""
typedef struct { int32_t sType; void* pNext;
    uint32_t cooperativeMatrixWorkgroupScope, cooperativeMatrixFlexibleDimensions,
    cooperativeMatrixReductions, cooperativeMatrixConversions,
    cooperativeMatrixPerElementOperations, cooperativeMatrixTensorAddressing,
    cooperativeMatrixBlockLoads; } VkPhysicalDeviceCooperativeMatrix2FeaturesNV;
typedef struct { int32_t sType; void* pNext;
    uint32_t MGranularity, NGranularity, KGranularity;
    int32_t AType, BType, CType, ResultType;
    uint32_t saturatingAccumulation; int32_t scope; uint32_t workgroupInvocations;
    } VkCooperativeMatrixFlexibleDimensionsPropertiesNV;
typedef struct { int32_t sType; void* pNext;
    uint32_t cooperativeMatrixWorkgroupScopeMaxWorkgroupSize,
    cooperativeMatrixFlexibleDimensionsMaxDimension,
    cooperativeMatrixWorkgroupScopeReservedSharedMemory;
    } VkPhysicalDeviceCooperativeMatrix2PropertiesNV;
typedef int32_t (*PFN_flexible)(void*, uint32_t*,
                                VkCooperativeMatrixFlexibleDimensionsPropertiesNV*);
""")
_STYPE_NV2_FEATURES = 1000593000
_STYPE_NV2_FLEXIBLE = 1000593001
_STYPE_NV2_PROPERTIES = 1000593002
_SCOPES = {1: "DEVICE", 2: "WORKGROUP", 3: "SUBGROUP", 5: "QUEUE_FAMILY"}

# Structure name -> (sType, the API version it needs, or the extension).
_STRUCTS = {
    "VkPhysicalDeviceVulkan11Features":
        (vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES, (1, 2)),
    "VkPhysicalDeviceVulkan12Features":
        (vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES, (1, 2)),
    "VkPhysicalDeviceVulkan13Features":
        (vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_FEATURES, (1, 3)),
    "VkPhysicalDeviceCooperativeMatrixFeaturesKHR":
        (vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR,
         COOPERATIVE_MATRIX_EXTENSION),
    "VkPhysicalDeviceCooperativeMatrix2FeaturesNV":
        (_STYPE_NV2_FEATURES, COOPERATIVE_MATRIX2_EXTENSION),
}
_COMPONENT_TYPES = {v: k[len("VK_COMPONENT_TYPE_"):] for k, v in vars(vk).items()
                    if k.startswith("VK_COMPONENT_TYPE_") and k.endswith("_KHR")}


def api_version(encoded: int) -> tuple:
    """(major, minor) of a VK_MAKE_API_VERSION value, capped at MAX_API."""
    return min(((encoded >> 22) & 0x7F, (encoded >> 12) & 0x3FF), MAX_API)


def _usable(struct: str, api: tuple, extensions) -> bool:
    need = _STRUCTS[struct][1]
    return need in extensions if isinstance(need, str) else api >= need


def _address(obj, ffi) -> int:
    """The address of cdata ``obj`` of ``ffi`` (a pointer, or a structure the `vulkan`
    package's constructors return); 0 for None."""
    if obj is None:
        return 0
    if ffi.typeof(obj).kind == "struct":
        obj = ffi.addressof(obj)
    return int(ffi.cast("uintptr_t", obj))


def _chain(api: tuple, extensions, values=None):
    """The feature structures usable on the device, chained, with ``values`` (feature
    name -> bool) set; returns (head, {struct name: struct}) keeping them alive."""
    structs, head = {}, None
    for name, (stype, _) in _STRUCTS.items():
        if not _usable(name, api, extensions):
            continue
        fields = {f: bool(values and values.get(f)) for f in FEATURES[name]}
        if hasattr(vk, name):
            head = structs[name] = getattr(vk, name)(sType=stype, pNext=head, **fields)
            continue
        raw = _NV.new(f"{name}*")  # declared above; zeroed: every other feature off
        raw.sType = stype
        raw.pNext = _NV.cast("void*", _address(head, vk.ffi))
        for f, v in fields.items():
            setattr(raw, f, int(v))
        structs[name] = raw
        head = vk.ffi.cast("void*", _address(raw, _NV))
    return head, structs


def query(instance, pd, extensions: frozenset, validation: bool = False) -> Capabilities:
    """The capability table of physical device ``pd`` of ``instance`` (``extensions``:
    its extension names). A device below Vulkan 1.2 reports only core features and
    limits. ``validation``: the instance runs the validation layer, whose Debian 12
    version (1.3.239) predates VK_NV_cooperative_matrix2: its structure is left out
    (a validated device enables none of its features anyway, runtime/device.py)."""
    if validation:
        extensions = frozenset(extensions) - {COOPERATIVE_MATRIX2_EXTENSION}
    props = vk.vkGetPhysicalDeviceProperties(pd)
    api = api_version(props.apiVersion)
    core = vk.vkGetPhysicalDeviceFeatures(pd)
    present = {f for f in FEATURES["VkPhysicalDeviceFeatures"] if getattr(core, f)}
    sub = (0, 0, 0)
    shapes = ()
    if api >= (1, 2):
        head, structs = _chain(api, extensions)
        vk.vkGetPhysicalDeviceFeatures2(pd, vk.VkPhysicalDeviceFeatures2(
            sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, pNext=head))
        present |= {f for name, s in structs.items() for f in FEATURES[name]
                    if getattr(s, f)}
        sub = _subgroup_sizes(pd, api)
        if "cooperativeMatrix" in present:
            shapes = _cooperative_matrix_shapes(instance, pd)
        else:
            present -= set(COOPERATIVE_MATRIX2_FEATURES)
    flexible, max_dim = ((), 0)
    if "cooperativeMatrixFlexibleDimensions" in present:
        flexible, max_dim = _flexible_shapes(instance, pd)
    return Capabilities(api_version=api, features=frozenset(present),
                        subgroup_size=sub[0], min_subgroup_size=sub[1],
                        max_subgroup_size=sub[2],
                        max_storage_buffer_range=props.limits.maxStorageBufferRange,
                        cooperative_matrix_shapes=shapes,
                        flexible_matrix_shapes=flexible,
                        cooperative_matrix_max_dimension=max_dim)


def _subgroup_sizes(pd, api: tuple) -> tuple:
    """(subgroupSize, minSubgroupSize, maxSubgroupSize); the range only on 1.3."""
    v13 = vk.VkPhysicalDeviceVulkan13Properties(
        sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_PROPERTIES) \
        if api >= (1, 3) else None
    v11 = vk.VkPhysicalDeviceVulkan11Properties(
        sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_PROPERTIES, pNext=v13)
    vk.vkGetPhysicalDeviceProperties2(pd, vk.VkPhysicalDeviceProperties2(
        sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, pNext=v11))
    if v13 is None:
        return v11.subgroupSize, v11.subgroupSize, v11.subgroupSize
    return v11.subgroupSize, v13.minSubgroupSize, v13.maxSubgroupSize


def _cooperative_matrix_shapes(instance, pd) -> tuple:
    """vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR's list, as shapes (the raw
    entry point: each output structure needs its sType set before the second call)."""
    name = b"vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR"
    ptr = vk.lib.vkGetInstanceProcAddr(instance, name)
    if ptr == vk.ffi.NULL:
        return ()
    fn = vk.ffi.cast("PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR", ptr)
    count = vk.ffi.new("uint32_t*")
    if fn(pd, count, vk.ffi.NULL) != vk.VK_SUCCESS or not count[0]:
        return ()
    props = vk.ffi.new("VkCooperativeMatrixPropertiesKHR[]", count[0])
    for i in range(count[0]):
        props[i].sType = vk.VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_KHR
    if fn(pd, count, props) not in (vk.VK_SUCCESS, vk.VK_INCOMPLETE):
        return ()
    t = _COMPONENT_TYPES.get
    return tuple(CooperativeMatrixShape(p.MSize, p.NSize, p.KSize, t(p.AType, "?"),
                                        t(p.BType, "?"), t(p.CType, "?"),
                                        t(p.ResultType, "?"))
                 for p in (props[i] for i in range(count[0])))


def _flexible_shapes(instance, pd) -> tuple:
    """(vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV's list as
    FlexibleMatrixShape entries, cooperativeMatrixFlexibleDimensionsMaxDimension);
    ((), 0) where the entry point is missing or fails."""
    ptr = vk.lib.vkGetInstanceProcAddr(
        instance, b"vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV")
    if ptr == vk.ffi.NULL:
        return (), 0
    fn = _NV.cast("PFN_flexible", _address(ptr, vk.ffi))
    handle = _NV.cast("void*", _address(pd, vk.ffi))
    count = _NV.new("uint32_t*")
    if fn(handle, count, _NV.NULL) != vk.VK_SUCCESS or not count[0]:
        return (), 0
    props = _NV.new("VkCooperativeMatrixFlexibleDimensionsPropertiesNV[]", count[0])
    for i in range(count[0]):
        props[i].sType = _STYPE_NV2_FLEXIBLE
    if fn(handle, count, props) not in (vk.VK_SUCCESS, vk.VK_INCOMPLETE):
        return (), 0
    limits = _NV.new("VkPhysicalDeviceCooperativeMatrix2PropertiesNV*")
    limits.sType = _STYPE_NV2_PROPERTIES
    vk.vkGetPhysicalDeviceProperties2(pd, vk.VkPhysicalDeviceProperties2(
        sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2,
        pNext=vk.ffi.cast("void*", _address(limits, _NV))))
    t = _COMPONENT_TYPES.get
    shapes = tuple(FlexibleMatrixShape(p.MGranularity, p.NGranularity, p.KGranularity,
                                       t(p.AType, "?"), t(p.BType, "?"), t(p.CType, "?"),
                                       t(p.ResultType, "?"), _SCOPES.get(p.scope, "?"),
                                       p.workgroupInvocations)
                   for p in (props[i] for i in range(count[0])))
    return shapes, limits.cooperativeMatrixFlexibleDimensionsMaxDimension


def enable_chain(caps: Capabilities, extensions: frozenset):
    """What VkDeviceCreateInfo passes to enable every feature of the table that
    ``caps`` has, each in the structure that holds it (none that it lacks): returns
    (pNext head or None, pEnabledFeatures or None, structures to keep alive, extension
    names: the cooperative-matrix extensions where their features are on)."""
    values = {f: f in caps.features for f in ALL_FEATURES}
    core = vk.VkPhysicalDeviceFeatures(**{f: values[f]
                                          for f in FEATURES["VkPhysicalDeviceFeatures"]})
    nv2 = values["cooperativeMatrix"] and any(
        values[f] for f in COOPERATIVE_MATRIX2_FEATURES)
    exts = ([COOPERATIVE_MATRIX_EXTENSION] if values["cooperativeMatrix"] else []) + \
        ([COOPERATIVE_MATRIX2_EXTENSION] if nv2 else [])
    # An extension's feature structure goes in the chain only with that extension
    # enabled (else a validation layer may not know the structure at all).
    extensions = frozenset(extensions) - (
        {COOPERATIVE_MATRIX_EXTENSION, COOPERATIVE_MATRIX2_EXTENSION} - set(exts))
    head, structs = _chain(caps.api_version, extensions, values)
    if head is None:  # below Vulkan 1.2: core features only
        return None, core, [core], exts
    feats = vk.VkPhysicalDeviceFeatures2(
        sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, pNext=head, features=core)
    return feats, None, [feats, core, *structs.values()], exts
