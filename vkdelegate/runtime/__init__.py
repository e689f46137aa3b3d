"""The Vulkan runtime: load a delegate blob once, execute it many times.

Imports numpy and the ``vulkan`` bindings, never torch, and the operator registry only
when no ``OpTable`` is injected (runtime/op_table.py): a fully delegated program runs
without PyTorch installed.

- ``load_delegate(blob, named_data=None, device=None) -> DelegateGraph``
- ``DelegateGraph.execute(inputs, profile=False) -> list[np.ndarray]``
- ``Device``, ``list_devices()``, ``default_device()``: device choice and properties.
"""
from __future__ import annotations

from typing import Mapping

from vkdelegate.runtime.device import Device, DeviceInfo, default_device, list_devices
from vkdelegate.runtime.graph import DelegateGraph
from vkdelegate.runtime.op_table import OpTable, RuntimeOp

__all__ = ["load_delegate", "DelegateGraph", "Device", "DeviceInfo", "default_device",
           "list_devices", "OpTable", "RuntimeOp"]


def load_delegate(blob: bytes, named_data: Mapping[str, bytes] | None = None,
                  device=None, limits=None, **options) -> DelegateGraph:
    """Build a DelegateGraph from delegate blob bytes (VH00 header + VK00 flatbuffer).

    named_data: bytes of constants stored outside the blob, keyed by ``named_key``.
    device: a Device, a device index or name substring, or None for the default.
    limits: the resource budget (``vkdelegate.limits.LoadLimits``; None: defaults).
    options: passed to DelegateGraph (staging, timeout_s, progress, ops: an OpTable;
    None: every registered op, imported from vkdelegate.backend on first use;
    constant_pools: a ``constant_pool.ConstantPools`` the graphs of one program share,
    so that each named constant is on the device once).
    Raises VkDelegateError for a malformed blob, a missing constant, an unsupported op,
    a node whose declared output sizes are not the op's, or a device limit;
    ResourceLimitError for a blob over ``limits`` (see DelegateGraph).
    """
    from vkdelegate.limits import resolve_limits
    from vkdelegate.serialization.blob import read_blob

    limits = resolve_limits(limits)
    decoded = read_blob(blob, limits)
    return DelegateGraph(decoded.graph,
                         lambda i: decoded.constant_bytes(i, named_data or {}),
                         device=device, limits=limits, **options)
