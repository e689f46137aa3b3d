"""The memory a VkGraph's tensors ask for, checked against the load limits.

A blob declares every tensor's sizes (upper bounds for dynamic dims); the runtime
allocates them all at load and the reference executor materialises its constants. A
few kilobytes of flatbuffer can declare gigabytes, so both call ``check_tensor_budget``
before anything is allocated. Sizes are Python ints: a 2**64 (or any absurd) dim
product is measured exactly and refused, never overflowed. Torch-free and Vulkan-free.
"""
from __future__ import annotations

from typing import Callable

from vkdelegate.errors import VkDelegateError
from vkdelegate.limits import LoadLimits, check_limit
from vkdelegate.serialization import vkgraph as vk

#: Bytes per element of each graph dtype (numpy's itemsize).
ITEMSIZE = {"bool": 1, "uint8": 1, "int8": 1, "int32": 4, "float16": 2, "float32": 4,
            "float64": 8, "int64": 8}
#: What a tensor without a known dtype is counted at (the allocator refuses it later).
_WIDEST = max(ITEMSIZE.values())


def _shape_text(dims) -> str:
    shown = ", ".join(str(d) for d in dims[:8])
    return f"[{shown}{', ...' if len(dims) > 8 else ''}] ({len(dims)} dims)" \
        if len(dims) > 8 else f"[{shown}]"


def tensor_nbytes(vid: int, tensor: vk.VkTensor,
                  itemsize: Callable[[str], int] | None = None) -> int:
    """Bytes of tensor value ``vid`` at its declared (upper-bound) dims.

    itemsize: graph dtype name -> bytes per element as stored (default: the graph
    dtype's own size; the runtime passes its device dtype's). Raises VkDelegateError
    naming the value for a dim that is not a non-negative int.
    """
    numel = 1
    for d in tensor.dims:
        if isinstance(d, bool) or not isinstance(d, int) or d < 0:
            raise VkDelegateError(f"value {vid} (VkTensor) has size {d!r} in dims "
                                  f"{_shape_text(list(tensor.dims))}: sizes are ints >= 0")
        numel *= d
    name = vk.DTYPE_NAMES.get(tensor.datatype)
    if name is None:
        return numel * _WIDEST
    return numel * (itemsize(name) if itemsize else ITEMSIZE[name])


def check_tensor_budget(graph: vk.VkGraph, limits: LoadLimits,
                        itemsize: Callable[[str], int] | None = None) -> int:
    """Check every tensor of ``graph`` against ``limits.max_tensor_bytes`` and all of
    them together against ``limits.max_device_bytes``; return the total in bytes.

    Tensors sharing a ``mem_obj_id`` (constants never share) count once, at their
    largest member, as the runtime allocates them. Raises ResourceLimitError naming the
    value id (or the blob, for the total) and VkDelegateError for a bad dim. A blob over
    its load limits is refused on every executor (no CPU fallback: the limits bound
    what a file may make this process allocate); a tensor within them but over the
    device's own limits is the allocator's DeviceLimitError.
    """
    return _check(graph, limits, itemsize)


def _check(graph, limits, itemsize) -> int:
    shared: dict[int, int] = {}
    total = 0
    for vid, value in enumerate(graph.values):
        if not isinstance(value, vk.VkTensor):
            continue
        nbytes = tensor_nbytes(vid, value, itemsize)
        dtype = vk.DTYPE_NAMES.get(value.datatype, f"datatype {int(value.datatype)}")
        check_limit(f"tensor {dtype} {_shape_text(list(value.dims))} in bytes", nbytes,
                    limits.max_tensor_bytes, "max_tensor_bytes", f"value {vid}")
        if value.mem_obj_id >= 0 and value.constant_id < 0:
            shared[value.mem_obj_id] = max(shared.get(value.mem_obj_id, 0), nbytes)
        else:
            total += nbytes
    total += sum(shared.values())
    check_limit("the memory of all tensors in bytes (shared mem_obj_ids counted once)",
                total, limits.max_device_bytes, "max_device_bytes", "delegate blob")
    return total
