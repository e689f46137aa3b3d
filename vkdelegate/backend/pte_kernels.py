"""An ExecuTorch KernelCall -> a CPU glue node of our plan, through the same allow-list.

ExecuTorch's non-delegated instructions call kernels by operator name, nearly always
the ``out`` variant (``aten::add.out``: every schema argument, the preallocated
``out`` tensors among them, then the returns again). The glue runs functional ATen ops
on torch, so each out variant is mapped to the functional overload of the same op
whose arguments are the out variant's without the outs (``aten.add.Tensor``), and that
name must be on ``allowed_ops``' list and resolve through ``glue_ops.resolve`` like any
glue node of our own programs. The outs become the node's results.

Also mapped: ExecuTorch's own size ops (``executorch_prim::add.Scalar`` & co. ->
``operator.add``; ``executorch_prim::et_view.default`` -> ``aten.view_copy.default``)
and its dim-order copies (``dim_order_ops::_to_dim_order_copy.out`` ->
``aten._to_copy.default``, ``_clone_dim_order.out`` -> ``aten.clone.default``) for
contiguous dim orders. Anything else raises VkDelegateError naming the operator.
Needs torch (the out variants' schemas are torch's).
"""
from __future__ import annotations

import re

from vkdelegate import dtypes
from vkdelegate.backend import allowed_ops, glue_ops
from vkdelegate.errors import VkDelegateError

_PRIM_OPERATORS = {f"executorch_prim::{op}.Scalar": f"operator.{op}"
                   for op in ("add", "sub", "mul", "floordiv", "mod")}
_NAME = re.compile(r"^[a-z][a-z0-9_]*::([a-z_][a-z0-9_]*)(?:\.([A-Za-z][A-Za-z0-9_]*))?$")
#: torch names of ExecuTorch ScalarType codes (an Int argument of type ScalarType).
_DTYPES = dtypes.SCALAR_TYPE_NAMES
_MEMORY_FORMATS = {0: "contiguous_format", 1: "preserve_format", 2: "channels_last",
                   3: "channels_last_3d"}


def _is_out(argument) -> bool:
    return argument.alias_info is not None and argument.alias_info.is_write


def _schema_of(name: str, op: str, overload: str, where: str):
    """The schema of ``aten::op.overload``; only for ops of which some overload is on
    the allow-list (so a crafted name never reaches torch.ops beyond those)."""
    if not any(a.startswith(f"aten.{op}.") for a in allowed_ops.ALLOWED):
        raise allowed_ops.refusal(f"aten.{op}.{overload}", where,
                                  "an ExecuTorch program's CPU part")
    try:
        import torch
    except ImportError:
        raise VkDelegateError(f"{where} runs {name} on the CPU, which needs torch; "
                              f"install torch") from None
    packet = getattr(torch.ops.aten, op, None)
    found = getattr(packet, overload, None) if isinstance(
        packet, torch._ops.OpOverloadPacket) else None
    if not isinstance(found, torch._ops.OpOverload):
        raise VkDelegateError(f"{where} calls {name}, which is not an operator of torch "
                              f"{torch.__version__}")
    return found._schema


def _functional(name: str, op: str, schema, where: str):
    """(allowed glue name, schema) of the functional overload matching out variant
    ``schema``: same argument names and types, without the outs."""
    want = [(a.name, str(a.type)) for a in schema.arguments if not _is_out(a)]
    for candidate in sorted(a for a in allowed_ops.ALLOWED if a.startswith(f"aten.{op}.")):
        try:
            fn = glue_ops.resolve(candidate, where)
        except VkDelegateError:
            continue  # not defined by the installed torch
        other = getattr(fn, "_schema", None)
        if other is not None and not any(_is_out(a) for a in other.arguments) and [
                (a.name, str(a.type)) for a in other.arguments] == want:
            return candidate, other
    raise VkDelegateError(f"{where} calls {name}, an out variant with no allowed "
                          f"functional counterpart (aten.{op}.*) on the glue allow-list")


class KernelMapper:
    """Turns KernelCalls into glue nodes; ``arg(index, type)`` converts a value index
    to a glue argument (the method builder provides it)."""

    def __init__(self, arg, dtype_of):
        self.arg = arg            # (value index, schema type str or None) -> argument
        self.dtype_of = dtype_of  # value index -> numpy dtype name of a Tensor value

    def node(self, name: str, args: list, where: str) -> tuple[dict, list]:
        """(node without "out", value indices of its results in order)."""
        if name in _PRIM_OPERATORS:
            self._count(name, args, 3, where)
            return {"op": _PRIM_OPERATORS[name], "args": [self.arg(a, None)
                                                          for a in args[:2]]}, [args[2]]
        if name == "executorch_prim::et_view.default":
            self._count(name, args, 3, where)
            return {"op": "aten.view_copy.default",
                    "args": [self.arg(args[0], None), self.arg(args[1], None)]}, [args[2]]
        if name in ("dim_order_ops::_to_dim_order_copy.out",
                    "dim_order_ops::_clone_dim_order.out"):
            return self._dim_order_copy(name, args, where)
        # fullmatch: "$" alone also matches before a trailing newline (a fuzzer's
        # "aten::cumsum.ou\n" reached torch.ops and a two-line message).
        match = _NAME.fullmatch(name) if isinstance(name, str) else None
        if match is None or not name.startswith("aten::"):
            raise VkDelegateError(f"{where} calls operator {name!r}, which vkdelegate "
                                  f"does not run (ATen operators and ExecuTorch's size "
                                  f"and dim-order ops only)")
        op, overload = match.group(1), match.group(2) or "default"
        schema = _schema_of(name, op, overload, where)
        self._count(name, args, len(schema.arguments) + len(schema.returns), where)
        by_name = {a.name: i for a, i in zip(schema.arguments, args)}
        outs = [i for a, i in zip(schema.arguments, args) if _is_out(a)]
        if outs:
            glue, target = _functional(name, op, schema, where)
        else:
            glue, target = f"aten.{op}.{overload}", schema
            outs = args[len(schema.arguments):]
            if not allowed_ops.is_allowed(glue):
                raise allowed_ops.refusal(glue, where, "an ExecuTorch program's CPU part")
        node = {"op": glue, "args": [], "kwargs": {}}
        for a in target.arguments:
            value = self.arg(by_name[a.name], str(a.type))
            if a.kwarg_only:
                node["kwargs"][a.name] = value
            else:
                node["args"].append(value)
        return node, outs

    def _dim_order_copy(self, name: str, args: list, where: str) -> tuple[dict, list]:
        # to: (self, *, non_blocking, dim_order, out); clone: (self, *, non_blocking,
        # dim_order, out); both return out. The dtype is the out tensor's.
        self._count(name, args, 5, where)
        order = self.arg(args[2], None)
        if order is not None and order != list(range(len(order))):
            raise VkDelegateError(f"{where} calls {name} with dim order {order}; "
                                  f"vkdelegate runs contiguous tensors only")
        source = self.arg(args[0], None)
        if name.endswith("_clone_dim_order.out"):
            return {"op": "aten.clone.default", "args": [source]}, [args[3]]
        return {"op": "aten._to_copy.default", "args": [source],
                "kwargs": {"dtype": {"dtype": self.dtype_of(args[3])}}}, [args[3]]

    @staticmethod
    def _count(name: str, args: list, want: int, where: str) -> None:
        if len(args) != want:
            raise VkDelegateError(f"{where} calls {name} with {len(args)} arguments; "
                                  f"its schema takes {want} (arguments and returns)")


def typed_int(value: int, type_str: "str | None", where: str):
    """An ExecuTorch Int argument as the glue passes it: a dtype / memory format /
    layout by name where the schema's type says so, else the int."""
    base = (type_str or "").rstrip("?")
    table = {"ScalarType": ("dtype", _DTYPES), "MemoryFormat":
             ("memory_format", _MEMORY_FORMATS), "Layout": ("layout", {0: "strided"})}
    if base not in table:
        return value
    key, names = table[base]
    if value not in names:
        raise VkDelegateError(f"{where}: {base} code {value} is not one vkdelegate runs")
    return {key: names[value]}
