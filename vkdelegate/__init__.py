"""vkdelegate: run torch.export programs as GLSL compute shaders on Vulkan devices.

Importing the package itself pulls in neither torch nor Vulkan; the names below are
loaded on first use so that ``vkdelegate.runtime`` works in an environment without torch.

- ``VulkanPartitioner``, ``to_backend``: lower an ``ExportedProgram`` (needs torch).
- ``load``: load a saved program file (torch only where the program has CPU parts).
- ``quantize_for_vulkan``: quantize a model's linears with torchao ("int8", "int4",
  "8da4w") the way the lowering fuses them (docs/LOWERING.md, "Quantized models").
- ``VkDelegateError``: the one error type for bad input.
"""
from vkdelegate.errors import VkDelegateError

__all__ = ["VkDelegateError", "VulkanPartitioner", "to_backend", "load",
           "quantize_for_vulkan"]
__version__ = "0.1.0"

_LAZY = {
    "VulkanPartitioner": ("vkdelegate.backend.partitioner", "VulkanPartitioner"),
    "to_backend": ("vkdelegate.backend.to_backend", "to_backend"),
    "load": ("vkdelegate.backend.program", "load"),
    "quantize_for_vulkan": ("vkdelegate.backend.quantize", "quantize_for_vulkan"),
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'vkdelegate' has no attribute {name!r}")
