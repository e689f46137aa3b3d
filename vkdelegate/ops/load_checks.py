"""Load-time checks of a blob's nodes against their registry declarations.

A delegate blob is untrusted: before anything is allocated or compiled, every
``OperatorCall`` of its VkGraph is looked up in the registry, its arguments are checked
by the op's rules (as the partitioner did when the blob was made) and its declared
output sizes are compared with what the op's shape function gives for the declared
input sizes. Dims are upper bounds for dynamic sizes; shape functions are monotone in
their inputs, so at the upper-bound inputs they give exactly the declared upper-bound
outputs. A blob whose output sizes disagree would run and return wrong numbers (or
write past a buffer), so it is refused here. Torch-free and Vulkan-free.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from vkdelegate.ops.registry import NodeSpec, OpSpec, TensorSpec, lookup
from vkdelegate.errors import VkDelegateError, node_label, printable
from vkdelegate.serialization import vkgraph as g

_SCALARS = {g.Int: "int_val", g.Double: "double_val", g.Bool: "bool_val",
            g.String: "string_val", g.SymInt: "value"}
#: Attributes only tensors have: reading one from anything else means a non-tensor
#: value sits where the op expects a tensor.
_TENSOR_ATTRIBUTES = {"shape", "dtype", "rank", "dynamic", "is_dynamic", "ndim"}


class DeclaredValues:
    """Values of a VkGraph as rules and shape functions see them: a tensor as a
    TensorSpec of its dtype name and declared dims, scalars and lists as Python values,
    a ValueList as a list (the graph's ValueLists must be acyclic: ``check_graph``)."""

    def __init__(self, graph: g.VkGraph):
        self.graph = graph
        self._cache: dict[int, object] = {}
        # SymInt value id -> the number its node gives at the declared sizes (the
        # serialized number is ExecuTorch's placeholder 0, or our upper bound).
        self.symints: dict[int, int] = {}

    def is_symbolic(self, vid: int) -> bool:
        """Whether value ``vid`` is a SymInt or a ValueList holding one (at any depth;
        the graph's ValueLists are acyclic: ``check_graph``)."""
        v = self.graph.values[vid]
        if isinstance(v, g.SymInt):
            return True
        return isinstance(v, g.ValueList) and any(self.is_symbolic(i) for i in v.items)

    def __call__(self, vid: int):
        if vid in self.symints:
            return self.symints[vid]
        if vid in self._cache:
            return self._cache[vid]
        v = self.graph.values[vid]
        if isinstance(v, g.ValueList) and self.is_symbolic(vid):
            return [self(i) for i in v.items]  # not cached: its SymInts are set later
        if isinstance(v, g.VkTensor):
            dtype = g.DTYPE_NAMES.get(v.datatype)
            if dtype is None:
                raise VkDelegateError(f"tensor {vid} has no dtype (datatype "
                                      f"{int(v.datatype)})")
            out = TensorSpec(dtype, tuple(v.dims))
        elif isinstance(v, g.Null):
            out = None
        elif type(v) in _SCALARS:
            out = getattr(v, _SCALARS[type(v)])
        elif isinstance(v, g.ValueList):
            out = [self(i) for i in v.items]
        else:
            out = list(v.items)
        self._cache[vid] = out
        return out


def _kind(graph: g.VkGraph, vid: int) -> str:
    return type(graph.values[vid]).__name__


def _malformed(graph, call, args, exc) -> VkDelegateError:
    """The error for a rule or shape function that failed on the node's arguments:
    names the argument and value id when a non-tensor sat where a tensor belongs."""
    where = node_label(call.node_id, call.name)
    obj = getattr(exc, "obj", None)
    if isinstance(exc, AttributeError) and getattr(exc, "name", None) in _TENSOR_ATTRIBUTES:
        for i, (vid, a) in enumerate(zip(call.args, args)):
            if a is obj and not isinstance(a, TensorSpec):
                return VkDelegateError(f"{where}: argument {i} (value {vid}) is "
                                       f"{_kind(graph, vid)}, where the op expects a tensor")
    return VkDelegateError(f"{where}: malformed arguments {call.args}: {exc}")


def _dims(t) -> str:
    return f"[{', '.join(str(d) for d in t)}]"


def _check_sizes(call, spec: OpSpec, args, outs) -> None:
    where = node_label(call.node_id, call.name)
    fn = spec.shape_fn
    if fn is None:
        raise VkDelegateError(f"{where}: the op has no shape function, so its declared "
                              f"output sizes cannot be checked")
    try:
        sizes = fn(args)
    except VkDelegateError as exc:
        raise VkDelegateError(f"{where}: {exc}") from None
    sizes = sizes if isinstance(sizes, list) else [sizes]
    if len(sizes) != len(outs):
        raise VkDelegateError(f"{where}: declares {len(outs)} outputs, the op gives "
                              f"{len(sizes)}")
    out_ids = call.args[-1:]
    for k, (t, size) in enumerate(zip(outs, sizes)):
        size = tuple(size)
        if size != tuple(t.shape):
            inputs = ", ".join(_dims(a.shape) for a in args if isinstance(a, TensorSpec))
            which = f"output value {out_ids[0]}" + (f" item {k}" if len(outs) > 1 else "")
            raise VkDelegateError(f"{where}: declares {which} as {_dims(t.shape)}, the "
                                  f"op gives {_dims(size)} for inputs {inputs or '(none)'}")


def _has_int32(args, outs) -> bool:
    return any(isinstance(t, TensorSpec) and t.dtype == "int32"
               for t in [*outs, *args, *(x for a in args if isinstance(a, list) for x in a)])


def _widen(values: list) -> list:
    """``values`` with every int32 TensorSpec (also inside lists) read as int64."""
    def one(v):
        if isinstance(v, TensorSpec) and v.dtype == "int32":
            return dataclasses.replace(v, dtype="int64")
        return [one(x) for x in v] if isinstance(v, list) else v
    return [one(v) for v in values]


def check_node(graph: g.VkGraph, call: g.OperatorCall, values: DeclaredValues,
               lookup: Callable[[str], OpSpec] = lookup) -> OpSpec:
    """Check one node (see the module docstring); return its OpSpec (found by
    ``lookup``, the registry's by default).

    Raises VkDelegateError naming the node: unknown op, an output that is not a
    tensor, a non-tensor where a tensor is expected (with its value id), the op's
    rules' reasons, or declared output sizes that differ from the shape function's.
    """
    spec = lookup(call.name)
    where = node_label(call.node_id, call.name)
    if spec.returns == "symint":
        return _check_symint_node(graph, call, spec, values)
    out_id = call.args[-1]
    out = values(out_id)
    is_list = isinstance(graph.values[out_id], g.ValueList)
    outs = out if is_list else [out]
    for k, t in enumerate(outs):
        if not isinstance(t, TensorSpec):
            item = graph.values[out_id].items[k] if is_list else out_id
            raise VkDelegateError(f"{where}: output value {item} is {_kind(graph, item)}, "
                                  f"expected a tensor")
    args = [values(a) for a in call.args[:-1]]
    try:
        symbolic = _symbolic(values, call)
        reasons = spec.check(NodeSpec(call.name, tuple(args), tuple(outs), symbolic))
        if reasons and _has_int32(args, outs):
            # ExecuTorch's VulkanBackend (preprocess's downcast_64_bit) declares the
            # graph's int64 tensors int32; the device holds int64 as int32 anyway.
            wide_args, wide_outs = _widen(args), _widen(outs)
            if not spec.check(NodeSpec(call.name, tuple(wide_args), tuple(wide_outs),
                                       symbolic)):
                reasons, args, outs = [], wide_args, wide_outs
        if not reasons:
            _check_sizes(call, spec, args, outs)
    except VkDelegateError:
        raise
    except (AttributeError, TypeError, IndexError, KeyError, ValueError,
            ZeroDivisionError, OverflowError) as exc:
        raise _malformed(graph, call, args, exc) from exc
    if reasons:
        # A rule may quote a crafted value (a string of control characters): one
        # printable line whatever the rules say (errors.printable).
        raise VkDelegateError(f"{where}: {printable('; '.join(reasons))}")
    return spec


def _symbolic(values: DeclaredValues, call: g.OperatorCall) -> frozenset:
    return frozenset(i for i, a in enumerate(call.args[:-1]) if values.is_symbolic(a))


def _check_symint_node(graph, call, spec: OpSpec, values: DeclaredValues) -> OpSpec:
    """A node returning a SymInt: its output is a SymInt value, its rules accept the
    arguments, and its number at the declared sizes is what later nodes see."""
    where = node_label(call.node_id, call.name)
    out_id = call.args[-1]
    if not isinstance(graph.values[out_id], g.SymInt):
        raise VkDelegateError(f"{where}: output value {out_id} is {_kind(graph, out_id)}, "
                              f"expected a SymInt")
    args = [values(a) for a in call.args[:-1]]
    try:
        reasons = spec.check(NodeSpec(call.name, tuple(args), (), _symbolic(values, call)))
        if not reasons:
            values.symints[out_id] = spec.shape_fn(args)
    except VkDelegateError as exc:
        raise VkDelegateError(f"{where}: {exc}") from None
    except (AttributeError, TypeError, IndexError, KeyError, ValueError) as exc:
        raise _malformed(graph, call, args, exc) from exc
    if reasons:
        raise VkDelegateError(f"{where}: {'; '.join(reasons)}")
    return spec


def check_nodes(graph: g.VkGraph,
                lookup: Callable[[str], OpSpec] = lookup) -> list[OpSpec]:
    """``check_node`` for every node of the chain, in order; their OpSpecs."""
    values = DeclaredValues(graph)
    return [check_node(graph, call, values, lookup) for call in graph.chain]
