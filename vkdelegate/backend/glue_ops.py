"""What the CPU glue of a program may call, and nothing else.

The glue is data (JSON nodes naming ops), so a program file can never name arbitrary
Python: an op name resolves only to an ATen operator overload
(``torch.ops.aten.<op>.<overload>``), one of the few custom ops our passes create
(``CUSTOM_OPS``), or one of a fixed set of integer operations that size arithmetic in
dynamic-shape programs needs. Anything else is refused when the
program is loaded, before it runs. Torch is imported only when an ATen op is resolved.
"""
from __future__ import annotations

import operator
import re

from vkdelegate.errors import VkDelegateError

#: Size arithmetic torch.export emits for SymInts (ints in, int or bool out).
BUILTINS = {
    "operator.add": operator.add, "operator.sub": operator.sub,
    "operator.mul": operator.mul, "operator.floordiv": operator.floordiv,
    "operator.mod": operator.mod, "operator.neg": operator.neg,
    "operator.eq": operator.eq, "operator.ne": operator.ne,
    "operator.lt": operator.lt, "operator.le": operator.le,
    "operator.gt": operator.gt, "operator.ge": operator.ge,
}



def _sym_size(tensor, dim: int) -> int:
    return int(tensor.shape[dim])


#: ATen ops the glue runs without torch (they read only shapes), so that a program
#: whose delegates need a run-time size still loads and runs without torch.
TORCH_FREE = {"aten.sym_size.int": _sym_size}

_ATEN_NAME = re.compile(r"^aten\.([A-Za-z_][A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)$")

#: Custom ops (ExecuTorch Vulkan's) a graph may hold after our lowering passes; torch
#: learns them from ``vkdelegate.backend.et_vk_ops``.
CUSTOM_OPS = frozenset({"et_vk.conv_with_clamp.default"})


def builtin_name(target) -> "str | None":
    """The glue name of a Python operator target, or None if it is not allowed."""
    name = f"operator.{getattr(target, '__name__', '')}"
    return name if BUILTINS.get(name) is target else None


def resolve(name: str):
    """The callable for a glue op name; VkDelegateError for any name not allowed.

    Raises VkDelegateError naming the op when it is not an ATen overload known to the
    installed torch, or when torch is needed but not installed.
    """
    if not isinstance(name, str):
        raise VkDelegateError(f"op name must be a string, got {type(name).__name__}")
    if name in BUILTINS:
        return BUILTINS[name]
    if name in TORCH_FREE:
        return TORCH_FREE[name]
    if name in CUSTOM_OPS:
        return _custom(name)
    match = _ATEN_NAME.match(name)
    if not match:
        raise VkDelegateError(f"op {name!r} is not allowed in a program's CPU part "
                              f"(only aten.<op>.<overload> and integer operators)")
    try:
        import torch
    except ImportError:
        raise VkDelegateError(f"this program runs {name} on the CPU, which needs torch; "
                              f"install torch or lower the program fully to Vulkan") from None
    packet = getattr(torch.ops.aten, match.group(1), None)
    overload = None
    if isinstance(packet, torch._ops.OpOverloadPacket):
        try:
            overload = getattr(packet, match.group(2))
        except AttributeError:
            overload = None
    if not isinstance(overload, torch._ops.OpOverload):
        raise VkDelegateError(f"op {name!r} is not an ATen operator of torch "
                              f"{torch.__version__}")
    return overload


def _custom(name: str):
    try:
        import torch
    except ImportError:
        raise VkDelegateError(f"this program runs {name} on the CPU, which needs torch; "
                              f"install torch or lower the program fully to Vulkan") from None
    from vkdelegate.backend.et_vk_ops import ensure_defined

    ensure_defined()
    namespace, op, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), op), overload)
