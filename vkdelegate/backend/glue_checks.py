"""Load-time checks of the arguments an allowed op is called with, and of the bytes
creation ops make; shared by the CPU glue (``MethodRunner``) and the reference
executor (``ReferenceGraph``).

The allow-list (``allowed_ops``) says which ops may run; these checks say with what:
a str argument only from the op's fixed choices (``allowed_ops.STR_CHOICES``), never
``pin_memory=True``, in the glue no device but the CPU, and creation ops within
``LoadLimits.max_tensor_bytes`` each and ``max_host_bytes`` together. Any other glue op
that allocates (``sizes_at_call``: not a view) is sized before it runs, by running it on
the meta device, so that a small input cannot grow into a huge tensor (``repeat``,
``constant_pad_nd``, ``expand`` then a copy, broadcasting, a chain of ``cat``): its
outputs count against the same limits. Torch-free at import (the meta run imports
torch; only torch-side glue ops have it).
"""
from __future__ import annotations

from vkdelegate.backend import allowed_ops
from vkdelegate.backend.creation_ops import CREATION_OPS, UNKNOWN, creation_nbytes
from vkdelegate.errors import VkDelegateError
from vkdelegate.limits import LoadLimits, check_limit

_NAMED = ("dtype", "layout", "memory_format")


class Named:
    """A dtype/layout/memory_format argument of a glue node, by name (not a str
    argument of the op)."""

    def __init__(self, name):
        self.name = name

    def __str__(self) -> str:
        return str(self.name)


def glue_literal(arg, where: str):
    """A glue node's JSON argument as a plain value: ``UNKNOWN`` for a value
    reference, a ``Named`` for a dtype/layout/memory_format. VkDelegateError for a
    device other than the CPU (the glue runs on the CPU and allocates nothing else)."""
    if isinstance(arg, dict):
        if "v" in arg:
            return UNKNOWN
        if len(arg) == 1:
            key, name = next(iter(arg.items()))
            if key == "device":
                if not (isinstance(name, str) and name.split(":")[0] == "cpu"):
                    raise VkDelegateError(f"{where} asks for device {name!r}; the CPU "
                                          f"part of a program runs on the CPU only")
                return Named(name)
            if key in _NAMED:
                return Named(name)
        return {k: glue_literal(v, where) for k, v in arg.items()}
    if isinstance(arg, list):
        return [glue_literal(a, where) for a in arg]
    return arg


def _has_str(value) -> bool:
    if isinstance(value, str):
        return True
    if isinstance(value, (list, tuple)):
        return any(_has_str(v) for v in value)
    if isinstance(value, dict):
        return any(_has_str(v) for v in value.values())
    return False


def check_arguments(name: str, fn, args: list, kwargs: dict, where: str) -> None:
    """Refuse a str argument outside the op's choices and ``pin_memory=True``.

    fn: the resolved op (its ``_schema`` maps positions to argument names; builtins
    have none). args/kwargs: plain values (``UNKNOWN`` for run-time ones).
    Raises VkDelegateError naming ``where``, the op and the argument.
    """
    schema = getattr(fn, "_schema", None)
    positional = [a.name for a in schema.arguments if not a.kwarg_only] if schema else []
    choices = allowed_ops.STR_CHOICES.get(name, {})
    pairs = [(positional[i] if i < len(positional) else None, v)
             for i, v in enumerate(args)] + list(kwargs.items())
    for arg, value in pairs:
        label = f"argument {arg!r}" if arg else "an extra argument"
        if arg == "pin_memory" and value is True:
            raise VkDelegateError(f"{where} calls {name} with pin_memory=True, which a "
                                  f"program may not ask for (memory pinning)")
        if isinstance(value, str):
            allowed = choices.get(arg, ())
            if allowed == allowed_ops.MESSAGE:
                if len(value) > allowed_ops.MAX_MESSAGE:
                    raise VkDelegateError(f"{where} passes {name} a {len(value)}-character "
                                          f"{label}, over {allowed_ops.MAX_MESSAGE}")
            elif allowed == allowed_ops.CHAIN:
                from vkdelegate.kernels.elementwise_chain import MAX_INPUTS, MAX_STEPS, parse
                try:  # the grammar and its op list; the kernel checks the counts
                    parse(value, MAX_INPUTS, 4 * MAX_STEPS)
                except VkDelegateError as exc:
                    raise VkDelegateError(f"{where} passes {name} {label}: {exc}") from None
            elif value not in allowed:
                expect = (f"one of {', '.join(map(repr, allowed))}" if allowed
                          else "no string")
                raise VkDelegateError(f"{where} passes {name} the string {value!r} as "
                                      f"{label}, which takes {expect}")
        elif _has_str(value):
            raise VkDelegateError(f"{where} passes {name} a string inside {label}")


#: Glue ops that return views of their inputs (no allocation): not sized at call time.
VIEW_OPS = frozenset({"view", "_unsafe_view", "reshape", "expand", "slice", "select",
                      "squeeze", "unsqueeze", "permute", "transpose", "t", "alias",
                      "detach", "unbind", "split", "split_with_sizes", "narrow",
                      "lift_fresh", "sym_size", "sym_numel", "sym_stride"})


def sizes_at_call(name: str) -> bool:
    """Whether glue op ``name`` (a torch op, not a creation op: those are sized from
    their arguments) is sized on the meta device before each call."""
    parts = name.split(".")
    return (len(parts) == 3 and parts[0] != "operator" and name not in CREATION_OPS
            and parts[1] not in VIEW_OPS)


def meta_output_bytes(fn, args: list, kwargs: dict) -> "int | None":
    """Bytes of the tensors ``fn(*args, **kwargs)`` returns, computed on the meta device
    (no data is touched or allocated); None where the op cannot run there (an output
    size that depends on the data, as ``nonzero``'s: at most its input's elements)."""
    import torch
    from torch.utils import _pytree

    def meta(v):
        if isinstance(v, torch.Tensor):
            return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
        return v
    op = getattr(fn, "op", fn)  # glue_ops' wrappers keep the op as .op
    try:
        out = op(*_pytree.tree_map(meta, list(args)), **_pytree.tree_map(meta, kwargs))
    except Exception:  # no meta kernel, data-dependent sizes: the op checks itself
        return None
    return sum(t.numel() * t.element_size() for t in _pytree.tree_leaves(out)
               if isinstance(t, torch.Tensor))


def _signature(args, kwargs) -> tuple:
    """What a glue op's output sizes depend on: each tensor's sizes, strides and dtype,
    every other value as it is (nested lists and dicts made hashable)."""
    def one(v):
        shape = getattr(v, "shape", None)
        if shape is not None and hasattr(v, "dtype"):
            stride = v.stride() if callable(getattr(v, "stride", None)) else v.strides
            return ("t", tuple(shape), tuple(stride), str(v.dtype))
        if isinstance(v, (list, tuple)):
            return tuple(one(x) for x in v)
        if isinstance(v, dict):
            return tuple((k, one(x)) for k, x in sorted(v.items()))
        return v if isinstance(v, (int, float, bool, str, type(None))) else repr(v)
    return one(list(args)), one(kwargs)


class CreationBudget:
    """Bytes the creation ops of one method (or one delegate blob) make.

    ``static_bytes``: the sum sized at load (from literal sizes). Raises
    ResourceLimitError (via ``check_limit``) for one tensor over
    ``limits.max_tensor_bytes`` or a sum over ``limits.max_host_bytes``, naming the node.
    """

    def __init__(self, limits: LoadLimits):
        self.limits = limits
        self.static_bytes = 0
        self.at_run_time: set = set()  # keys of creation ops sized before each call
        self._sized: dict = {}  # check_growth: key -> (argument signature, bytes)

    def add(self, key, name: str, args: list, kwargs: dict, where: str) -> None:
        """At load: size creation op ``name`` (node ``key``, described by ``where``)
        from its literal arguments, or leave it to ``check_call``."""
        if name not in CREATION_OPS:
            return
        nbytes = creation_nbytes(name, args, kwargs)
        if nbytes is None:
            self.at_run_time.add(key)
            return
        self._check(nbytes, where, self.static_bytes)
        self.static_bytes += nbytes

    def check_call(self, name: str, args: list, kwargs: dict, where: str,
                   spent: int) -> int:
        """Before a call: the bytes this creation op makes with its run-time
        arguments (``spent``: bytes the earlier ones of this call made), checked."""
        nbytes = creation_nbytes(name, args, kwargs)
        if nbytes is None:
            raise VkDelegateError(f"{where}: {name} is called with sizes that are not "
                                  f"integers")
        self._check(nbytes, where, self.static_bytes + spent)
        return nbytes

    def check_growth(self, key, fn, args: list, kwargs: dict, where: str,
                     spent: int) -> int:
        """Before a call of glue node ``key``, an op that allocates
        (``sizes_at_call``): the bytes it will return, from a meta-device run, checked
        against ``max_tensor_bytes`` (the whole output) and, with ``spent`` (bytes this
        call's earlier checked ops made), ``max_host_bytes``; 0 where the meta run
        cannot size it. The meta run (hundreds of microseconds: Python meta kernels) is
        redone only when the node's argument signature (tensor sizes, strides and
        dtypes, other values) differs from its last call's."""
        signature = _signature(args, kwargs)
        last = self._sized.get(key)
        if last is not None and last[0] == signature:
            nbytes = last[1]
        else:
            nbytes = meta_output_bytes(fn, args, kwargs)
            self._sized[key] = (signature, nbytes)
        if nbytes is None:
            return 0
        self._check(nbytes, where, self.static_bytes + spent)
        return nbytes

    def _check(self, nbytes: int, where: str, before: int) -> None:
        check_limit("the tensor it makes, in bytes,", nbytes,
                    self.limits.max_tensor_bytes, "max_tensor_bytes", where)
        check_limit("host memory of the creation ops up to it, in bytes,",
                    before + nbytes, self.limits.max_host_bytes, "max_host_bytes", where)
