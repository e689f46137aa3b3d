"""torch-side facts the builder needs: dtypes, upper-bound sizes, constant bytes.

Separate from the builder so that the builder reads as graph walking only.
"""
from __future__ import annotations

import hashlib

import torch

from vkdelegate.errors import VkDelegateError
from vkdelegate.serialization.vkgraph import DTYPE_NAMES, VkDataType

#: torch dtype -> VkDataType; other dtypes (bfloat16, int16, complex...) are rejected.
TORCH_TO_VK = {getattr(torch, name): VkDataType[name.upper()]
               for _, name in sorted(DTYPE_NAMES.items())}


def vk_dtype(dtype: torch.dtype, where: str) -> VkDataType:
    """The VkDataType of ``dtype``; VkDelegateError naming ``where`` if there is none."""
    try:
        return TORCH_TO_VK[dtype]
    except KeyError:
        raise VkDelegateError(f"{where}: dtype {dtype} has no Vulkan equivalent "
                              f"(supported: {', '.join(str(d) for d in TORCH_TO_VK)})") from None


def upper_bound(size, where: str) -> int:
    """``size`` as an int: itself when static, the upper end of its value range when
    it is a SymInt of an exported program with dynamic shapes.

    Raises VkDelegateError when the range has no finite upper bound (a torch.export.Dim
    without ``max``): device memory is allocated for the upper bound.
    """
    if not isinstance(size, torch.SymInt):
        return int(size)
    node = size.node
    expr = node.expr
    if expr.is_number:
        return int(expr)
    upper = node.shape_env.bound_sympy(expr).upper
    # torch's int_oo claims is_finite; compare with the infinities instead.
    from torch.utils._sympy.numbers import int_oo
    import sympy

    if upper in (int_oo, sympy.oo) or not upper.is_number:
        raise VkDelegateError(
            f"{where}: size {expr} has no upper bound; export with "
            f"torch.export.Dim(..., max=N) so that memory can be sized for the largest case")
    return int(upper)


class ConstantCache:
    """The bytes and SHA-256 key of each constant tensor, shared by the partitions of
    one lowering (``to_backend``: every method's delegates). The methods of an LLM
    program hold the same weights (the same storages), so each weight is copied to
    bytes and hashed once, not once per method, and every delegate's ``named_data``
    holds the one bytes object of a key (a 4-layer Llama-shaped fp16 program lowered
    with a peak RSS of 3.50 GB instead of 5.29: docs/PERF.md).

    A tensor is recognised by its storage's address, offset, shape, strides, dtype and
    version counter; the cache keeps a reference to it, so the address cannot be reused
    while the cache lives. Tensors without a plain storage (subclasses) are not cached."""

    def __init__(self):
        self._by_tensor: dict[tuple, tuple] = {}
        self._by_key: dict[str, bytes] = {}

    def bytes_of(self, tensor: torch.Tensor, where: str) -> tuple:
        """(hex SHA-256, bytes) of ``tensor`` as ``tensor_bytes`` gives them."""
        ident = _identity(tensor)
        hit = self._by_tensor.get(ident) if ident is not None else None
        if hit is not None:
            return hit[1], hit[2]
        data = tensor_bytes(tensor, where)
        key = hashlib.sha256(data).hexdigest()
        data = self._by_key.setdefault(key, data)
        if ident is not None:
            self._by_tensor[ident] = (tensor, key, data)
        return key, data


def _identity(tensor: torch.Tensor) -> "tuple | None":
    if type(tensor) not in (torch.Tensor, torch.nn.Parameter) or tensor.is_meta:
        return None
    try:  # inference-mode tensors have no version counter: not cached
        return (str(tensor.device), tensor.untyped_storage().data_ptr(),
                tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()),
                tensor.dtype, tensor._version)
    except (RuntimeError, NotImplementedError):
        return None


def tensor_bytes(tensor: torch.Tensor, where: str) -> bytes:
    """The contiguous little-endian bytes of a CPU copy of ``tensor``."""
    vk_dtype(tensor.dtype, where)
    t = tensor.detach().to("cpu").contiguous()
    if t.numel() == 0:
        return b""
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()
