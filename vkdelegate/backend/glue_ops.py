"""What the CPU glue of a program may call, and nothing else.

The glue is data (JSON nodes naming ops), so a program file can never name arbitrary
Python: an op name resolves only if it is on the allow-list
(``vkdelegate.backend.allowed_ops``): pure ATen tensor operators, the custom ops our
passes create, and a fixed set of integer operations that size arithmetic in
dynamic-shape programs needs. Anything else is refused when the program is loaded,
before it runs. Torch is imported only when an ATen op is resolved.
"""
from __future__ import annotations

import numbers
import operator

from vkdelegate.backend import allowed_ops, custom_ops
from vkdelegate.backend.creation_ops import creation_nbytes  # noqa: F401 (public here)
from vkdelegate.errors import VkDelegateError

#: Python operators torch.export emits for SymInt arithmetic, by glue name.
_OPERATORS = {name: getattr(operator, name.split(".")[1]) for name in allowed_ops.OPERATORS}

#: The largest magnitude an integer operator may return: sizes are int64 in torch, and
#: a chain of ``mul`` nodes must not grow a Python int without bound.
_INT_LIMIT = 1 << 63


#: Operators on ints and bools only (``|`` and ``&`` of floats raise TypeError).
_INTEGRAL_ONLY = ("operator.or_", "operator.and_")


def _int_op(name: str, fn):
    kind = numbers.Integral if name in _INTEGRAL_ONLY else numbers.Real

    def call(*args):
        if not all(isinstance(a, kind) for a in args):
            kinds = ", ".join(type(a).__name__ for a in args)
            raise VkDelegateError(f"{name} takes ints, got ({kinds})")
        result = fn(*args)
        if isinstance(result, int) and not -_INT_LIMIT <= result < _INT_LIMIT:
            raise VkDelegateError(f"{name}{args} = {result} is past the int64 range")
        return result

    call.__name__ = call.__qualname__ = name
    return call


#: Size arithmetic torch.export emits for SymInts (ints in, int or bool out); each
#: refuses non-numbers (``mul("a", 10**9)`` would make a 1 GB string) and results
#: past int64.
BUILTINS = {name: _int_op(name, fn) for name, fn in _OPERATORS.items()}


def _sym_size(tensor, dim: int) -> int:
    return int(tensor.shape[dim])


#: ATen ops the glue runs without torch (they read only shapes), so that a program
#: whose delegates need a run-time size still loads and runs without torch.
TORCH_FREE = {"aten.sym_size.int": _sym_size}


def builtin_name(target) -> "str | None":
    """The glue name of a Python operator target, or None if it is not allowed."""
    name = f"operator.{getattr(target, '__name__', '')}"
    return name if _OPERATORS.get(name) is target else None


def resolve(name: str, where: "str | None" = None, reference: bool = False):
    """The callable for an allowed op name.

    where: what calls it, for the error ("node 3 of method 'forward'"); reference: the
    reference executor asks (its delegate-only ops are allowed too, resolved by it).
    Raises VkDelegateError naming the op (and the refusal class, "file access", ...)
    for a name not on ``allowed_ops``' list, one the installed torch does not define,
    or when torch is needed but not installed.
    """
    if not isinstance(name, str):
        raise VkDelegateError(f"{where or 'a node'}: op name must be a string, got "
                              f"{type(name).__name__}")
    if not allowed_ops.is_allowed(name):
        caller = ("a delegate run by the reference executor" if reference
                  else "a program's CPU part")
        raise allowed_ops.refusal(name, where or "a node", caller)
    if name in BUILTINS:
        return BUILTINS[name]
    if name in TORCH_FREE:
        return TORCH_FREE[name]
    try:
        import torch
    except ImportError:
        raise VkDelegateError(f"this program runs {name} on the CPU, which needs torch; "
                              f"install torch or lower the program fully to Vulkan") from None
    namespace, op, overload = name.split(".")
    if name in custom_ops.CUSTOM_OPS:
        custom_ops.ensure_defined()
    packet = getattr(getattr(torch.ops, namespace), op, None)
    found = None
    if isinstance(packet, torch._ops.OpOverloadPacket):
        try:
            found = getattr(packet, overload)
        except AttributeError:
            found = None
    if not isinstance(found, torch._ops.OpOverload):
        raise VkDelegateError(f"op {name!r} is not an operator of torch "
                              f"{torch.__version__}")
    if op in _UNINITIALISED:
        return _ZeroFilled(found)
    if name in _VIEWS:
        return _Reshaping(found)
    return found


#: View ops whose CPU result must not depend on the input's strides (see _Reshaping).
_VIEWS = frozenset({"aten.view.default", "aten._unsafe_view.default",
                    "aten.view_copy.default"})


class _Reshaping:
    """A view op run with reshape semantics: the same elements in the same order,
    without ATen's refusal of a view "not compatible with input tensor's size and
    stride". A lowered program treats every tensor as contiguous (its delegates'
    are; the lowering drops clones that only make a tensor contiguous, such as the
    one nn.MultiheadAttention puts between a permute and a view), so a CPU view may
    receive a permuted tensor whose eager counterpart was a contiguous copy. Keeps
    the op's ``_schema`` for the argument checks."""

    def __init__(self, op):
        self.op, self._schema = op, op._schema

    def __call__(self, x, size):
        import torch

        try:
            return self.op(x, size)
        except RuntimeError:
            if not isinstance(x, torch.Tensor) or x.is_contiguous():
                raise
            return self.op(x.contiguous(), size)


#: Creation ops whose result is uninitialised memory.
_UNINITIALISED = frozenset({"empty", "empty_strided", "empty_like", "new_empty",
                            "new_empty_strided"})


class _ZeroFilled:
    """An ``empty*`` op whose result is zero-filled, so that a crafted program cannot
    return uninitialised host memory (bytes this process held before) as an output.
    Keeps the op's ``_schema`` for the argument checks."""

    def __init__(self, op):
        self.op, self._schema = op, op._schema

    def __call__(self, *args, **kwargs):
        return self.op(*args, **kwargs).zero_()
