"""ProgramGraph: one method of an exported program, in the form lowering works on.

torch.export lifts parameters, buffers and constant tensors to placeholders and returns
buffer mutations as extra outputs. Lowering passes and to_backend need to know, per
placeholder, whether it is a user input, a constant (foldable, may be baked into a
delegate) or mutable state (kept between calls, never baked in). This module reads
the graph signature once and records that.
"""
from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from torch.export.graph_signature import InputKind, OutputKind

from vkdelegate.backend import quant_decompositions
from vkdelegate.errors import VkDelegateError


@dataclass
class ProgramGraph:
    """A method's ATen graph plus what each placeholder and output is.

    gm: the graph (placeholders in the exported program's order).
    user_inputs: placeholder names of the user inputs, in call order.
    constants: placeholder name -> tensor, for parameters, buffers that are never
        mutated and lifted constants.
    user_input_labels: the user inputs' names in the exported program's signature (a
        copy may rename a placeholder; users know the signature's names).
    state: placeholder name -> initial tensor, for buffers the program mutates.
    state_fqn: placeholder name of a state buffer -> the buffer's fully qualified name
        in the module (``cache.k0``), which names it program-wide (program_state).
    state_updates: placeholder name of a state buffer -> index in the output tuple
        of its new value.
    input_updates: user input position -> index in the output tuple of its new value
        (the module mutates that input in place).
    user_outputs: indexes in the output tuple of what the module returns.
    in_spec, out_spec: torch pytree specs of the call's (args, kwargs) and result.
    range_constraints: the decomposed program's symbol -> ValueRanges of dynamic sizes.
    fusable: for the fusing passes (passes/fuse_elementwise): whether a node may be
        folded into a fused node; the partitioner sets it (the node would run on
        Vulkan by itself, the ``fuse_elementwise`` option, its allow/block lists), so a
        fused node never delegates an op the user kept on the CPU. None: any node.
    options: the partitioner's CompileOptions, for passes a compile option switches
        (passes/fuse_linear_swiglu); None: the defaults.
    runs_on_vulkan: whether a node would run on Vulkan by itself (the registry's rules,
        the allow/block lists), for passes that replace a node by another op
        (passes/sdpa_seq_first); op_allowed: whether the allow/block lists let an op
        (by name) run on Vulkan. The partitioner sets both; None: any node or op.
    """

    gm: torch.fx.GraphModule
    user_inputs: list[str]
    constants: dict[str, torch.Tensor]
    user_input_labels: list[str] = field(default_factory=list)
    state: dict[str, torch.Tensor] = field(default_factory=dict)
    state_fqn: dict[str, str] = field(default_factory=dict)
    state_updates: dict[str, int] = field(default_factory=dict)
    input_updates: dict[int, int] = field(default_factory=dict)
    user_outputs: list[int] = field(default_factory=list)
    in_spec: object = None
    out_spec: object = None
    range_constraints: dict = field(default_factory=dict)
    fusable: Optional[Callable[[torch.fx.Node], bool]] = None
    options: object = None
    runs_on_vulkan: Optional[Callable[[torch.fx.Node], bool]] = None
    op_allowed: Optional[Callable[[str], bool]] = None

    def placeholder(self, name: str) -> torch.fx.Node:
        for node in self.gm.graph.find_nodes(op="placeholder"):
            if node.name == name:
                return node
        raise KeyError(name)

    def add_constant(self, name_hint: str, value: torch.Tensor) -> torch.fx.Node:
        """A new constant placeholder (after the existing ones) holding ``value``."""
        graph = self.gm.graph
        placeholders = list(graph.find_nodes(op="placeholder"))
        with graph.inserting_after(placeholders[-1]):
            node = graph.placeholder(name_hint)
        # FakeTensor metadata keeps shape/dtype queries working for later passes. A
        # constant's sizes are static: without static_shapes the export's ShapeEnv would
        # give the new fake tensor fresh symbolic sizes with no upper bound.
        fake_mode = torch._guards.detect_fake_mode([p.meta.get("val") for p in placeholders])
        node.meta["val"] = (fake_mode.from_tensor(value, static_shapes=True) if fake_mode
                            else value)
        self.constants[node.name] = value
        return node

    def drop_unused_constants(self) -> None:
        """Erase constant placeholders that no node uses any more."""
        for node in list(self.gm.graph.find_nodes(op="placeholder")):
            if node.name in self.constants and not node.users:
                self.gm.graph.erase_node(node)
                del self.constants[node.name]


def call_key(op, args, kwargs) -> str:
    """The arguments of a call of ``op`` in schema order, defaults filled, tensors (or
    fx nodes, by their value) as dtype and sizes: equal for a node of an exported
    program and the call ``run_decompositions`` makes for it."""
    def one(a):
        if isinstance(a, torch.fx.Node):
            a = a.meta.get("val")
        if isinstance(a, torch.Tensor):
            return ("tensor", str(a.dtype), tuple(str(s) for s in a.shape))
        if isinstance(a, (list, tuple)):
            return tuple(one(x) for x in a)
        return repr(a)

    values = []
    for i, arg in enumerate(op._schema.arguments):
        if arg.name in kwargs:
            values.append(kwargs[arg.name])
        elif i < len(args) and not arg.kwarg_only:
            values.append(args[i])
        else:
            values.append(arg.default_value if arg.has_default_value() else None)
    return repr(tuple(one(v) for v in values))


def _keep_calls(op, decompose, keys):
    """A decomposition of ``op`` that leaves the calls whose ``call_key`` is in
    ``keys`` whole (returning NotImplemented keeps the node) and decomposes the rest."""
    def decomposition(*args, **kwargs):
        if call_key(op, args, kwargs) in keys:
            return NotImplemented
        return decompose(*args, **kwargs)
    return decomposition


def _with_effects_ops(ep) -> list:
    """(node, wrapped function) of each ``with_effects`` node of ``ep``'s graphs."""
    found = []
    for module in ep.graph_module.modules():
        if isinstance(module, torch.fx.GraphModule):
            found += [(node, node.args[1]) for node in module.graph.nodes
                      if node.op == "call_function"
                      and node.target is torch.ops.higher_order.with_effects]
    return found


def without_tokens(ep):
    """``ep`` (a decomposed copy: changed in place) without effect tokens.

    torch.export threads a TOKEN input through each op with a side effect, wrapped
    as ``with_effects(token, op, *args)``, and returns the token as a TOKEN output
    (``run_decompositions`` does so for the error check of ``torch.linalg.inv``,
    ``solve`` and ``cholesky``: ``_linalg_check_errors``). A lowered program runs its
    nodes in graph order, which is the order the tokens impose, so torch's own pass
    (ExecuTorch's ``to_edge`` uses it too) turns each wrapped call into a plain node of
    the op, which then stays on the CPU like any other (the allow-list decides whether
    the program may call it), and drops the tokens. An effect wrapped around anything
    but an ATen operator (a TorchBind method) is refused, naming it.
    """
    effects = _with_effects_ops(ep)
    if not effects and not any(s.kind == InputKind.TOKEN
                               for s in ep.graph_signature.input_specs):
        return ep
    for node, fn in effects:
        if not isinstance(fn, torch._ops.OpOverload):
            raise VkDelegateError(f"node {node.name} calls {fn} with a side effect "
                                  f"(with_effects), which vkdelegate cannot run (only "
                                  f"ATen ops)")
    try:
        from torch.export._remove_effect_tokens_pass import _remove_effect_tokens

        return _remove_effect_tokens(ep)
    except Exception as exc:
        ops = ", ".join(sorted({str(fn) for _, fn in effects})) or "none found"
        raise VkDelegateError(f"the exported program's side-effect ops ({ops}) could "
                              f"not be unwrapped from their effect tokens: "
                              f"{type(exc).__name__}: {exc}") from exc


def from_exported_program(ep, preserve=(), preserve_calls=None,
                          shared_state=frozenset()) -> ProgramGraph:
    """Decompose ``ep`` to core ATen and read its graph signature.

    preserve: OpOverloads to keep whole instead of decomposing (ops a delegate runs
        better as one node, such as a 3-D ``aten.linear``).
    preserve_calls: OpOverload -> set of ``call_key``s: the nodes of that op to keep
        whole, the op's other nodes being decomposed (an SDPA the delegate runs next to
        one with dropout that it does not).
    shared_state: FQNs of buffers another method of the program mutates: here they
        are state too (read from the program's current value), not constants, even
        where this method only reads them.
    Effect tokens (the ``with_effects`` wrapping that ``run_decompositions`` gives an
    op with a side effect, e.g. the ``_linalg_check_errors`` of ``torch.linalg.inv``)
    are removed: the op becomes a plain node, ordered by the graph (``without_tokens``).
    Raises VkDelegateError for programs we cannot run (higher-order control flow,
    gradients).
    """
    table = torch.export.default_decompositions()
    table.update(quant_decompositions.table())  # PT2E's quantize/dequantize -> ATen
    for op in preserve:
        table.pop(op, None)
    for op, keys in (preserve_calls or {}).items():
        if op in table:
            table[op] = _keep_calls(op, table[op], keys)
    try:
        with warnings.catch_warnings():
            # torch 2.13's own deep copy of the program's TreeSpec trips its own
            # LeafSpec deprecation warning; nothing a user can act on.
            warnings.filterwarnings("ignore", category=FutureWarning,
                                    message=r".*isinstance\(treespec, LeafSpec\)")
            ep = ep.run_decompositions(table)
    except Exception as exc:
        raise VkDelegateError(f"ATen decomposition of the exported program failed: "
                              f"{type(exc).__name__}: {exc}") from exc
    ep = without_tokens(ep)
    gm = copy.deepcopy(ep.graph_module)
    sig = ep.graph_signature
    tensors = {**ep.state_dict, **ep.constants}
    mutated = {spec.target for spec in sig.output_specs
               if spec.kind == OutputKind.BUFFER_MUTATION}
    pg = ProgramGraph(gm=gm, user_inputs=[], constants={},
                      in_spec=ep.call_spec.in_spec, out_spec=ep.call_spec.out_spec,
                      range_constraints=dict(ep.range_constraints))
    placeholder_of = {}
    # Input specs are in placeholder order. Use the nodes' names, not the specs': the
    # copy may rename a placeholder that shadows a builtin ("input" -> "input_1").
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    if len(placeholders) != len(sig.input_specs):
        raise VkDelegateError("graph placeholders do not match the graph signature")
    node_name = {}
    for spec, node in zip(sig.input_specs, placeholders):
        name = node_name[spec.arg.name] = node.name
        if spec.kind == InputKind.USER_INPUT:
            placeholder_of[spec.arg.name] = len(pg.user_inputs)
            pg.user_inputs.append(name)
            pg.user_input_labels.append(spec.arg.name)
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER,
                           InputKind.CONSTANT_TENSOR):
            value = tensors[spec.target]
            if not isinstance(value, torch.Tensor):
                raise VkDelegateError(f"input {name} ({spec.target}) holds a "
                                      f"{type(value).__name__}, not a tensor")
            value = value.detach()
            # A buffer another method mutates is state here only where it is read
            # (export lifts every buffer of the module, used or not).
            if spec.kind == InputKind.BUFFER and (
                    spec.target in mutated or (spec.target in shared_state and node.users)):
                pg.state[name] = value.clone()
                pg.state_fqn[name] = spec.target
            else:
                pg.constants[name] = value
        else:
            raise VkDelegateError(f"input {name} of kind {spec.kind.name} is not supported")
    state_by_target = {s.target: node_name[s.arg.name] for s in sig.input_specs
                       if s.kind == InputKind.BUFFER}
    for i, spec in enumerate(sig.output_specs):
        if spec.kind == OutputKind.USER_OUTPUT:
            pg.user_outputs.append(i)
        elif spec.kind == OutputKind.BUFFER_MUTATION:
            pg.state_updates[state_by_target[spec.target]] = i
        elif spec.kind == OutputKind.USER_INPUT_MUTATION:
            pg.input_updates[placeholder_of[spec.target]] = i
        else:
            raise VkDelegateError(f"output of kind {spec.kind.name} is not supported")
    # ExecuTorch's mutating llama.update_cache arrives auto-functionalized: make it an
    # ATen slice_scatter (passes/cache_positions.py) before the check below.
    from vkdelegate.backend.passes.cache_positions import functional_update_cache

    functional_update_cache(gm)
    for node in gm.graph.nodes:
        if node.op == "call_function" and not isinstance(
                node.target, torch._ops.OpOverload) and node.target.__module__ not in (
                "_operator", "operator"):
            raise VkDelegateError(f"node {node.name} calls {node.target}, which vkdelegate "
                                  f"cannot run (only ATen ops and getitem/arithmetic)")
    return pg
