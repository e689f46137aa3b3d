"""How many bytes a creation op (``full``, ``zeros``, ``arange``, ...) makes.

A 4 KB glue node ``aten.full.default([2**28], 1.0)`` allocates 1 GiB, so the CPU glue
and the reference executor size every creation op before calling it and check the bytes
against the load limits (``LoadLimits.max_tensor_bytes``, ``max_host_bytes``): at load
when the sizes are literals, right before the call when a size is computed at run time.
Torch-free: a dtype is a name (``"float32"``) or a ``torch.dtype``.
"""
from __future__ import annotations

import math
import numbers
import sys

from vkdelegate import dtypes

#: Bytes per element by dtype name: the dtype table's, then torch's other dtypes and
#: aliases (which no Vulkan op takes, but glue may create).
_ITEMSIZE = {
    **dtypes.ITEMSIZE,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "short": 2, "uint16": 2, "half": 2,
    "int": 4, "uint32": 4, "float": 4, "complex32": 4, "chalf": 4, "long": 8,
    "uint64": 8, "double": 8, "complex64": 8, "cfloat": 8, "complex128": 16,
    "cdouble": 16,
}
_WIDEST = 16  # an unknown dtype is sized as complex128

#: op name -> (positional argument names, which ones are sizes). "self" is a tensor
#: whose dtype is the default dtype of ``new_*`` ops.
_SIGNATURES = {
    "aten.full.default": ("size", "fill_value"),
    "aten.zeros.default": ("size",),
    "aten.ones.default": ("size",),
    "aten.empty.memory_format": ("size",),
    "aten.rand.default": ("size",),
    "aten.randn.default": ("size",),
    "aten.empty_strided.default": ("size", "stride"),
    "aten.arange.default": ("end",),
    "aten.arange.start": ("start", "end"),
    "aten.arange.start_step": ("start", "end", "step"),
    "aten.scalar_tensor.default": ("s",),
    "aten.randperm.default": ("n",),
    "aten.new_full.default": ("self", "size", "fill_value"),
    "aten.new_zeros.default": ("self", "size"),
    "aten.new_ones.default": ("self", "size"),
    "aten.new_empty.default": ("self", "size"),
    "aten.new_empty_strided.default": ("self", "size", "stride"),
}

#: The creation ops whose sizes come from arguments (``*_like`` ops copy an input's).
CREATION_OPS = frozenset(_SIGNATURES)


class _Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN"


#: A value only known at run time (a glue value reference, a SymInt); pass it for any
#: argument that is not a literal.
UNKNOWN = _Unknown()


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _numel(size) -> "int | None":
    """Elements of a tensor of ``size`` (negative sizes count 0: torch refuses them)."""
    if not isinstance(size, (list, tuple)) or not all(_is_int(d) for d in size):
        return None
    return math.prod(max(int(d), 0) for d in size)  # int(): no numpy wrap-around


def _itemsize(dtype, default: "int | None") -> "int | None":
    if dtype is None:
        return default
    if dtype is UNKNOWN:
        return None
    size = getattr(dtype, "itemsize", None)  # a torch.dtype
    if _is_int(size):
        return size
    return _ITEMSIZE.get(str(dtype).replace("torch.", ""), _WIDEST)


def _default_float() -> int:
    torch = sys.modules.get("torch")
    return torch.get_default_dtype().itemsize if torch is not None else 4


def _scalar_dtype(*values) -> "int | None":
    """torch's dtype inference for a Python scalar: bool, int64, default float or
    its complex (the widest of ``values``)."""
    if any(v is UNKNOWN for v in values):
        return None
    if any(isinstance(v, complex) for v in values):
        return 2 * _default_float()
    if any(isinstance(v, float) for v in values):
        return _default_float()
    if all(isinstance(v, bool) for v in values):
        return 1
    return 8


def _arange_numel(start, end, step) -> "int | None":
    if not all(isinstance(v, numbers.Real) for v in (start, end, step)):
        return None
    from vkdelegate.errors import VkDelegateError

    if not all(math.isfinite(v) for v in (start, end, step)):
        raise VkDelegateError(f"arange({start}, {end}, {step}): bounds must be finite")
    if step == 0:
        return 0  # torch refuses it when called
    return max(math.ceil((end - start) / step), 0)


def creation_nbytes(op_name: str, args: list, kwargs: "dict | None" = None
                    ) -> "int | None":
    """Bytes the creation op ``op_name`` makes when called with ``args``/``kwargs``.

    Arguments are Python values (``UNKNOWN`` where only the run time knows one);
    keyword-only ``dtype`` is a dtype name or ``torch.dtype`` (None: torch's default
    for the op). Returns None when ``op_name`` is not in ``CREATION_OPS`` or a value
    the size depends on is not known yet (call again with the run-time values).
    Raises VkDelegateError for non-finite ``arange`` bounds.
    """
    names = _SIGNATURES.get(op_name)
    if names is None:
        return None
    bound = dict(kwargs or {})
    bound.update(zip(names, args))
    dtype = bound.get("dtype")
    if op_name.startswith("aten.arange."):
        numel = _arange_numel(bound.get("start", 0), bound.get("end", UNKNOWN),
                              bound.get("step", 1))
        default = _scalar_dtype(bound.get("start", 0), bound.get("end"),
                                bound.get("step", 1))
    elif op_name == "aten.randperm.default":
        numel = int(bound["n"]) if _is_int(bound.get("n")) else None
        default = 8
    elif op_name == "aten.scalar_tensor.default":
        numel, default = 1, _default_float()
    else:
        numel = _numel(bound.get("size"))
        if "stride" in names and numel:
            strides = bound.get("stride")
            if not isinstance(strides, (list, tuple)) or not all(
                    _is_int(s) for s in strides):
                return None
            numel = 1 + sum((int(d) - 1) * abs(int(s))
                            for d, s in zip(bound["size"], strides))
        if op_name.startswith("aten.new_"):
            default = getattr(getattr(bound.get("self"), "dtype", None), "itemsize", None)
        elif op_name.endswith("full.default"):
            default = _scalar_dtype(bound.get("fill_value"))
        else:
            default = _default_float()
    itemsize = _itemsize(dtype, default)
    if numel is None or itemsize is None:
        return None
    return numel * itemsize
