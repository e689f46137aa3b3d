"""torch.export partition graph -> VkGraph -> delegate blob.

``build_vkgraph(gm, constants)`` walks one partition's ATen graph in node order:

- placeholders named in ``constants`` are constant tensors (weights, buffers, lifted
  constants); the other placeholders, in order, are the inputs (a tensor, or a SymInt
  for a symbolic size input). ``get_attr`` nodes holding tensors are constants too.
- each ATen ``call_function`` becomes one OperatorCall named by its overload
  (``aten.add.Tensor``): its args are value ids in the schema's argument order, kwargs
  made positional and absent arguments given the schema default; the output's id is
  LAST. An op with several outputs gets one ValueList of tensors; ``getitem`` emits no
  op, it maps to the list item. Ops that return nothing (``_assert_tensor_metadata``
  and other checks) are dropped. Non-ATen callables (``operator.mul`` on SymInts) keep
  their ``__name__``, as ET-VK does.
- the output node's args, in order, are the outputs (an input returned as an output,
  or an output returned twice, repeats the id).

Argument encoding (docs/DESIGN.md section 3), chosen so the runtime never sees Python:

========================  ==================================================
Python / fx argument      value
========================  ==================================================
fx node, tensor           VkTensor (dims = upper bounds of dynamic sizes)
fx node, SymInt           SymInt (value = upper bound of its range; the
                          runtime sets the number from the node producing it,
                          ExecuTorch writes 0 here)
bool                      Bool (tested before int: ``True == 1`` in Python)
int / float / str         Int / Double / String
torch.dtype               Int holding the VkDataType value (so _to_copy, full,
                          sum(dtype=...) can read their target dtype; ET-VK
                          writes Null here, so a runtime reading ET-VK blobs
                          must fall back to the output tensor's dtype)
None, device, layout,     Null
memory format
list of bool/int/float    BoolList / IntList / DoubleList (empty: IntList)
list with fx nodes/None   ValueList of the items' ids (tensors, SymInts, Int
                          for plain ints mixed with SymInts, Null for None)
========================  ==================================================

Scalars, strings, Null and scalar lists are shared by (kind, value): ``1`` and
``True`` and ``1.0`` stay three values. Every value is referenced by an op, an input or
an output id: no orphans. Constants are stored once per distinct bytes (SHA-256),
inline or named (``named_constants=True``: key = hex SHA-256, bytes returned in
``named_data``). Intermediate tensors get ``mem_obj_id`` from
:func:`memory_planning.plan_memory` unless ``skip_memory_planning``.
"""
from __future__ import annotations

import operator
import struct
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch
import torch.fx

from vkdelegate.errors import VkDelegateError
from vkdelegate.serialization import vkgraph as vk
from vkdelegate.serialization.blob import write_blob
from vkdelegate.serialization.constant_section import ConstantSection
from vkdelegate.serialization.fx_values import (ConstantCache, tensor_bytes, upper_bound,
                                               vk_dtype)
from vkdelegate.serialization.graph_checks import check_graph
from vkdelegate.serialization.memory_planning import plan_memory

#: Written to VkGraph.version by this builder.
GRAPH_VERSION = "0"

# Python values the schema encodes as Null (docs/DESIGN.md: None, device, layout, memory format).
_NULL_TYPES = (type(None), torch.device, torch.layout, torch.memory_format)


@dataclass
class SerializedPartition:
    """One partition, serialized: the VkGraph, its delegate blob (``write_blob``
    output) and the bytes of its named constants by key (empty unless
    ``named_constants``)."""

    graph: vk.VkGraph
    blob: bytes
    named_data: dict[str, bytes] = field(default_factory=dict)


#: ATen overloads ExecuTorch's Vulkan backend names by their ``__name__`` (its
#: SymIntOps.cpp registers ``sym_size.int``, not ``aten.sym_size.int``).
_ET_BARE_NAMES = {"aten.sym_size.int"}


def op_name(target: Any) -> str:
    """OperatorCall.name of an fx call_function target: ``aten.add.Tensor`` for an ATen
    overload (``sym_size.int`` for aten.sym_size.int, as ExecuTorch writes it),
    ``__name__`` for other callables (``mul`` for operator.mul)."""
    if isinstance(target, torch._ops.OpOverload):
        name = str(target)  # "aten.add.Tensor"
        return target.__name__ if name in _ET_BARE_NAMES else name
    return getattr(target, "__name__", str(target))


def _scalar_key(value) -> tuple:
    # Keys keep kinds apart (True, 1 and 1.0 differ) and doubles by bit pattern
    # (-0.0 is not 0.0; NaN equals itself).
    if isinstance(value, float):
        return ("Double", struct.pack("<d", value))
    return (type(value).__name__, value)


class _Builder:
    def __init__(self, gm: torch.fx.GraphModule, constants: Mapping[str, torch.Tensor],
                 named_constants: bool, constant_cache: "ConstantCache | None" = None):
        self.gm = gm
        self.constants = constants
        self.constant_cache = constant_cache
        self.section = ConstantSection(named=named_constants)
        self.graph = vk.VkGraph(version=GRAPH_VERSION)
        self.ids: dict[torch.fx.Node, int] = {}
        self.shared: dict[tuple, int] = {}

    # -- values -------------------------------------------------------------------

    def _add(self, value: vk.Value) -> int:
        self.graph.values.append(value)
        return len(self.graph.values) - 1

    def _shared(self, key: tuple, make) -> int:
        if key not in self.shared:
            self.shared[key] = self._add(make())
        return self.shared[key]

    def _tensor(self, val: torch.Tensor, where: str, constant_id: int = -1) -> int:
        dims = [upper_bound(d, f"{where} dim {i}") for i, d in enumerate(val.shape)]
        return self._add(vk.VkTensor(vk_dtype(val.dtype, where), dims, constant_id=constant_id))

    def _node_value(self, node: torch.fx.Node, val: Any) -> int:
        """A new value for what ``node`` produces (its meta["val"])."""
        where = f"node {node.name!r}"
        if isinstance(val, torch.Tensor):
            return self._tensor(val, where)
        if isinstance(val, torch.SymInt):
            return self._add(vk.SymInt(upper_bound(val, where)))
        if isinstance(val, (list, tuple)) and all(isinstance(v, torch.Tensor) for v in val):
            items = [self._tensor(v, f"{where} output {i}") for i, v in enumerate(val)]
            return self._add(vk.ValueList(items))
        raise VkDelegateError(f"{where} ({node.op} {node.target}) produces "
                              f"{type(val).__name__}; only tensors, tuples of tensors "
                              f"and SymInts can be serialized")

    def _scalar_list(self, items: list) -> int:
        if all(isinstance(x, bool) for x in items) and items:
            return self._shared(("BoolList", tuple(items)), lambda: vk.BoolList(list(items)))
        if all(isinstance(x, int) and not isinstance(x, bool) for x in items):
            return self._shared(("IntList", tuple(items)), lambda: vk.IntList(list(items)))
        if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in items):
            # A float[] argument may hold ints ([2, 1.5]): all become doubles.
            floats = [float(x) for x in items]
            key = ("DoubleList", struct.pack(f"<{len(floats)}d", *floats))
            return self._shared(key, lambda: vk.DoubleList(floats))
        raise VkDelegateError(f"list {items!r} mixes bools with numbers or holds other "
                              f"objects; the wire format has no such list")

    def arg(self, a: Any, where: str) -> int:
        """Value id for one argument (see the module docstring's table)."""
        if isinstance(a, torch.fx.Node):
            if a not in self.ids:
                raise VkDelegateError(f"{where}: uses node {a.name!r} before it is defined")
            return self.ids[a]
        if isinstance(a, _NULL_TYPES):
            return self._shared(("Null",), vk.Null)
        if isinstance(a, torch.dtype):
            code = int(vk_dtype(a, where))
            return self._shared(_scalar_key(code), lambda: vk.Int(code))
        if isinstance(a, bool):
            return self._shared(_scalar_key(a), lambda: vk.Bool(a))
        if isinstance(a, int):
            return self._shared(_scalar_key(a), lambda: vk.Int(a))
        if isinstance(a, float):
            return self._shared(_scalar_key(a), lambda: vk.Double(a))
        if isinstance(a, str):
            return self._shared(("String", a), lambda: vk.String(a))
        if isinstance(a, (list, tuple)):
            if any(isinstance(x, torch.fx.Node) or x is None for x in a):
                items = [self.arg(x, f"{where} item {i}") for i, x in enumerate(a)]
                return self._shared(("ValueList", tuple(items)), lambda: vk.ValueList(items))
            return self._scalar_list(list(a))
        raise VkDelegateError(f"{where}: cannot serialize argument {a!r} "
                              f"of type {type(a).__name__}")

    # -- nodes --------------------------------------------------------------------

    def placeholder(self, node: torch.fx.Node) -> None:
        if node.name in self.constants:
            if node.users:
                self._constant(node, self.constants[node.name])
            return
        val = node.meta.get("val")
        if val is None:
            raise VkDelegateError(f"input {node.name!r} has no meta['val']; build from "
                                  f"a torch.export graph")
        self.ids[node] = self._node_value(node, val)
        self.graph.input_ids.append(self.ids[node])

    def _constant(self, node: torch.fx.Node, tensor: Any) -> None:
        where = f"constant {node.name!r}"
        if not isinstance(tensor, torch.Tensor):
            raise VkDelegateError(f"{where} is a {type(tensor).__name__}, not a tensor")
        if self.constant_cache is not None:
            key, data = self.constant_cache.bytes_of(tensor, where)
            cid = self.section.add(data, key=key)
        else:
            cid = self.section.add(tensor_bytes(tensor, where))
        self.ids[node] = self._tensor(tensor, where, constant_id=cid)

    def get_attr(self, node: torch.fx.Node) -> None:
        if node.users:
            attr = self.gm
            for part in str(node.target).split("."):
                attr = getattr(attr, part)
            self._constant(node, attr)

    def call_function(self, node: torch.fx.Node, node_id: int) -> None:
        if node.target is operator.getitem:
            self._getitem(node)
            return
        schema = getattr(node.target, "_schema", None)
        if schema is not None and not schema.returns:
            return  # runtime checks such as _assert_tensor_metadata: nothing to run
        where = f"node {node.name!r} ({op_name(node.target)})"
        args = [self.arg(a, f"{where} arg {i}") for i, a in enumerate(schema_args(node))]
        if "val" not in node.meta:
            raise VkDelegateError(f"{where} has no meta['val']; build from a "
                                  f"torch.export graph")
        self.ids[node] = self._node_value(node, node.meta["val"])
        self.graph.chain.append(vk.OperatorCall(node_id, op_name(node.target),
                                                args + [self.ids[node]]))

    def _getitem(self, node: torch.fx.Node) -> None:
        source, index = node.args
        value = self.graph.values[self.ids[source]]
        if not isinstance(value, vk.ValueList) or not isinstance(index, int) \
                or not -len(value.items) <= index < len(value.items):
            raise VkDelegateError(f"node {node.name!r}: getitem {index!r} of "
                                  f"{source.name!r}, which is not a list of that length")
        self.ids[node] = value.items[index]

    def output(self, node: torch.fx.Node) -> None:
        outs = node.args[0] if len(node.args) == 1 else node.args
        for i, out in enumerate(outs if isinstance(outs, (list, tuple)) else [outs]):
            if not isinstance(out, torch.fx.Node):
                raise VkDelegateError(f"output {i} is {out!r}, not a graph value; a "
                                      f"partition returns tensors or SymInts only")
            self.graph.output_ids.append(self.arg(out, f"output {i}"))


def schema_args(node: torch.fx.Node) -> list:
    """``node``'s arguments in the op schema's order: kwargs made positional, absent
    ones given the schema default. Without a schema (Python operators on SymInts),
    the positional args as they are. VkDelegateError when a required one is missing."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return list(node.args)
    out = []
    for i, sa in enumerate(schema.arguments):
        if not sa.kwarg_only and i < len(node.args):
            out.append(node.args[i])
        elif sa.name in node.kwargs:
            out.append(node.kwargs[sa.name])
        elif sa.has_default_value():
            out.append(sa.default_value)
        else:
            raise VkDelegateError(f"node {node.name!r} ({op_name(node.target)}): "
                                  f"required argument {sa.name!r} is missing")
    return out


def build_vkgraph(gm: torch.fx.GraphModule,
                  constants: Mapping[str, torch.Tensor] | None = None, *,
                  named_constants: bool = False,
                  skip_memory_planning: bool = False,
                  alias_ops: frozenset = frozenset(),
                  constant_cache: "ConstantCache | None" = None) -> SerializedPartition:
    """Serializes one partition (a torch.export ATen graph module) to a delegate blob.

    gm: graph whose placeholders are the partition's inputs and constants, and whose
        nodes carry ``meta["val"]`` (fake tensors / SymInts) as torch.export leaves them.
    constants: tensor for each placeholder name that is a weight, buffer or lifted
        constant (any dtype in ``fx_values.TORCH_TO_VK``; bytes stored as is).
    named_constants: store constants outside the blob, keyed by SHA-256 hex, in
        ``named_data`` (offset 2**64-1), instead of inline in the constants section.
    skip_memory_planning: give every tensor dedicated memory (mem_obj_id -1).
    alias_ops: op names whose output may share its input's memory (``plan_memory``).
    constant_cache: bytes and keys of constants shared with the other partitions of
        one lowering (``fx_values.ConstantCache``); None converts every constant.

    ``OperatorCall.node_id`` is the node's position in ``gm.graph.nodes``, so a
    runtime error about a node can be traced back to the fx node.

    Raises VkDelegateError naming the node for anything that cannot be serialized:
    an unsupported dtype, a dynamic size without upper bound, a non-tensor output,
    call_module/call_method nodes.
    """
    builder = _Builder(gm, constants or {}, named_constants, constant_cache)
    for node_id, node in enumerate(gm.graph.nodes):
        if node.op == "placeholder":
            builder.placeholder(node)
        elif node.op == "get_attr":
            builder.get_attr(node)
        elif node.op == "call_function":
            builder.call_function(node, node_id)
        elif node.op == "output":
            builder.output(node)
        else:
            raise VkDelegateError(f"node {node.name!r}: {node.op} nodes cannot be "
                                  f"serialized; pass an ATen graph from torch.export")
    graph = builder.graph
    graph.constants = builder.section.entries
    if not skip_memory_planning:
        plan_memory(graph, alias_ops)
    check_graph(graph)
    return SerializedPartition(graph, write_blob(graph, builder.section.section),
                               dict(builder.section.named_data))
