"""The device-capability table: what one Vulkan device offers compute shaders.

Read once, when a device is described (vkdelegate/runtime/device_features.py queries
it), and then the only source for: which features and extensions device creation
enables (those of ``ALL_FEATURES`` the device has), the SPIR-V target environment the shader compiler
uses (``target_env``, part of the SPIR-V cache key), and whether a shader variant that
declares ``requires=`` fits the device (vkdelegate/shaders/variants.py). Torch- and
Vulkan-free, so that every layer may import it.

Feature names are the Vulkan spec's member names of VkPhysicalDeviceFeatures,
VkPhysicalDeviceVulkan11/12/13Features, VkPhysicalDeviceCooperativeMatrixFeaturesKHR
and VkPhysicalDeviceCooperativeMatrix2FeaturesNV (``shaderFloat16``,
``storageBuffer16BitAccess``, ``cooperativeMatrix``,
``cooperativeMatrixWorkgroupScope``, ...).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from vkdelegate.errors import VkDelegateError

#: Every feature the table records, by the Vulkan structure that holds it.
FEATURES = {
    "VkPhysicalDeviceFeatures": ("shaderFloat64", "shaderInt64", "shaderInt16"),
    "VkPhysicalDeviceVulkan11Features": ("storageBuffer16BitAccess",),
    # Not vulkanMemoryModel: enabled without vulkanMemoryModelDeviceScope it makes the
    # Device-scope atomics of today's shaders invalid (VUID-RuntimeSpirv-
    # vulkanMemoryModel-06265); a variant that needs the model adds both together.
    "VkPhysicalDeviceVulkan12Features": ("storageBuffer8BitAccess", "shaderFloat16",
                                         "shaderInt8"),
    "VkPhysicalDeviceVulkan13Features": ("subgroupSizeControl", "computeFullSubgroups",
                                         "shaderIntegerDotProduct", "maintenance4"),
    "VkPhysicalDeviceCooperativeMatrixFeaturesKHR": ("cooperativeMatrix",),
    # VK_NV_cooperative_matrix2: matrices of workgroup scope (the driver stages their
    # loads through shared memory) in sizes from the flexible-dimension list, loaded
    # and stored through tensor layouts, with per-element operations, row/column
    # reductions and conversions between uses (sdpa_coopmat_wg.glsl: SPIR-V
    # capabilities CooperativeMatrixReductionsNV and CooperativeMatrixConversionsNV).
    "VkPhysicalDeviceCooperativeMatrix2FeaturesNV": (
        "cooperativeMatrixWorkgroupScope", "cooperativeMatrixFlexibleDimensions",
        "cooperativeMatrixTensorAddressing", "cooperativeMatrixPerElementOperations",
        "cooperativeMatrixReductions", "cooperativeMatrixConversions"),
}
#: Device creation enables each of these the device has (and never one it lacks):
#: the ones a shader variant may use (64/16-bit integers and doubles, narrow storage
#: and arithmetic, subgroup size control, integer dot product, cooperative matrices,
#: and maintenance4, which the LocalSizeId execution mode of SPIR-V 1.6 needs).
ALL_FEATURES = frozenset(n for names in FEATURES.values() for n in names)
#: The extension that brings ``cooperativeMatrix`` (enabled with it).
COOPERATIVE_MATRIX_EXTENSION = "VK_KHR_cooperative_matrix"
#: The extension that brings ``cooperativeMatrixWorkgroupScope`` and the other
#: features of its structure above (enabled with them; it needs the one above).
COOPERATIVE_MATRIX2_EXTENSION = "VK_NV_cooperative_matrix2"
#: The features of that extension's structure.
COOPERATIVE_MATRIX2_FEATURES = FEATURES["VkPhysicalDeviceCooperativeMatrix2FeaturesNV"]
#: The highest Vulkan version vkdelegate asks the instance for (and targets).
MAX_API = (1, 3)


@dataclass(frozen=True)
class CooperativeMatrixShape:
    """One VkCooperativeMatrixPropertiesKHR entry: an M x N x K shape and its component
    types (VkComponentTypeKHR names without the prefix, e.g. "FLOAT16_KHR")."""

    m: int
    n: int
    k: int
    a: str
    b: str
    c: str
    result: str


@dataclass(frozen=True)
class FlexibleMatrixShape:
    """One VkCooperativeMatrixFlexibleDimensionsPropertiesNV entry (VK_NV_cooperative_
    matrix2): matrices of any M x N x K that are multiples of ``m`` x ``n`` x ``k`` (up to
    the device's ``cooperative_matrix_max_dimension``), these component types (as in
    CooperativeMatrixShape), ``scope`` ("WORKGROUP" or "SUBGROUP", VkScopeKHR without
    the prefix and suffix) and, for workgroup scope, the workgroup size in invocations
    a shader using them must have."""

    m: int
    n: int
    k: int
    a: str
    b: str
    c: str
    result: str
    scope: str
    workgroup_invocations: int


@dataclass(frozen=True)
class Capabilities:
    """What one device offers, as used: ``api_version`` is the effective version
    (the smaller of the device's and ``MAX_API``), (major, minor). ``features``: the
    Vulkan feature names present (and, on a created Device, enabled). Subgroup sizes are
    invocations; ``max_storage_buffer_range`` is bytes (VkPhysicalDeviceLimits)."""

    api_version: tuple = (1, 0)
    features: frozenset = frozenset()
    subgroup_size: int = 0
    min_subgroup_size: int = 0
    max_subgroup_size: int = 0
    max_storage_buffer_range: int = 0
    cooperative_matrix_shapes: tuple = field(default=())
    #: FlexibleMatrixShape entries (VK_NV_cooperative_matrix2), and the largest
    #: dimension they may take (cooperativeMatrixFlexibleDimensionsMaxDimension).
    flexible_matrix_shapes: tuple = field(default=())
    cooperative_matrix_max_dimension: int = 0

    def has(self, feature: str) -> bool:
        """Whether the device has Vulkan feature ``feature``; VkDelegateError for a
        name the table does not know (a typo in a ``requires=``)."""
        if feature not in ALL_FEATURES:
            raise VkDelegateError(f"unknown Vulkan feature {feature!r}; known: "
                                  f"{', '.join(sorted(ALL_FEATURES))}")
        return feature in self.features

    def workgroup_matrix_invocations(self, types: tuple, m=(), n=(), k=()) -> int:
        """The largest workgroup size (invocations) among the flexible shapes of
        workgroup scope (VK_NV_cooperative_matrix2) with component types ``types`` (A,
        B, C, result) whose M, N and K granularities divide every size of ``m``, ``n``
        and ``k`` (the M, N and K sizes of a shader's matrices), each size at most
        ``cooperative_matrix_max_dimension``; 0 where none does."""
        if max((*m, *n, *k), default=0) > self.cooperative_matrix_max_dimension:
            return 0
        return max((s.workgroup_invocations for s in self.flexible_matrix_shapes
                    if s.scope == "WORKGROUP" and (s.a, s.b, s.c, s.result) == tuple(types)
                    and all(x % s.m == 0 for x in m) and all(x % s.n == 0 for x in n)
                    and all(x % s.k == 0 for x in k)), default=0)

    def missing(self, requires) -> list[str]:
        """The features of ``requires`` (Vulkan names) this device lacks."""
        return [f for f in requires if not self.has(f)]

    def without(self, *features: str) -> "Capabilities":
        """The same table with ``features`` off (e.g. a device created with 8/16-bit
        storage left disabled)."""
        return replace(self, features=self.features - set(features))

    @property
    def target_env(self) -> str:
        """glslang's ``--target-env`` for this device: vulkan1.3 (SPIR-V 1.6) where
        the device runs Vulkan 1.3 with maintenance4 (SPIR-V 1.6 puts the workgroup
        size in LocalSizeId, which needs it), else vulkan1.2 (SPIR-V 1.5) on 1.2,
        else vulkan1.1 (SPIR-V 1.3)."""
        if self.api_version >= (1, 3) and "maintenance4" in self.features:
            return "vulkan1.3"
        if self.api_version >= (1, 2):
            return "vulkan1.2"
        return "vulkan1.1"

    def as_dict(self) -> dict:
        """JSON-ready form (``vkdelegate devices --json``)."""
        return {"api_version": ".".join(map(str, self.api_version)),
                "target_env": self.target_env,
                "features": {f: f in self.features for f in sorted(ALL_FEATURES)},
                "subgroup_size": self.subgroup_size,
                "subgroup_size_range": [self.min_subgroup_size, self.max_subgroup_size],
                "max_storage_buffer_range": self.max_storage_buffer_range,
                "cooperative_matrix_shapes": [vars(s) for s in
                                              self.cooperative_matrix_shapes],
                "flexible_matrix_shapes": [vars(s) for s in self.flexible_matrix_shapes],
                "cooperative_matrix_max_dimension": self.cooperative_matrix_max_dimension}


#: The table assumed where no device is at hand (``vkdelegate build-shaders`` without
#: ``--device``, the default compiler before a device exists): Vulkan 1.1, nothing
#: optional, the portable target every conformant device runs.
PORTABLE = Capabilities(api_version=(1, 1))
