"""to_backend: lower exported programs to a LoweredProgram.

Per method: decompose to core ATen and read the graph signature (program_graph), run
the lowering passes, let the partitioner propose partitions, fuse each partition into
a submodule (torch.fx), serialize each submodule as a delegate blob (the builder), and
encode what is left of the parent graph, the CPU glue, as JSON nodes that call the
blobs through ``delegate`` nodes. The result is the same data a program file holds, so
a saved and reloaded program runs exactly the same code path.
"""
from __future__ import annotations

import logging
import math
import operator

import sympy
import torch
from torch.fx.passes.utils.fuser_utils import fuse_by_partitions
from torch.export.graph_signature import InputKind, OutputKind

from vkdelegate.backend import allowed_ops, fp16_ranges, glue_ops, pytree_spec
from vkdelegate.backend.node_specs import (dim_name, dtype_name, from_model_call,
                                          symbol_name)
from vkdelegate.dtypes import TABLE as DTYPE_TABLE
from vkdelegate.backend.options import CompileOptions
from vkdelegate.backend.partitioner import VulkanPartitioner
from vkdelegate.backend.program import Delegate, LoweredProgram, Method
from vkdelegate.backend.program_graph import ProgramGraph
from vkdelegate.errors import VkDelegateError
from vkdelegate.ops.registry import alias_ops
from vkdelegate.serialization.fx_values import ConstantCache

_PREFIX = "vulkan_delegate_"
logger = logging.getLogger("vkdelegate")

#: CPU ops that only a module exported in training mode calls: batch norm updating
#: its running statistics (an eval-mode module's is ``_native_batch_norm_legit_no_
#: training``). Their refusal says to call ``model.eval()`` before exporting.
_TRAINING_OPS = frozenset({"aten._native_batch_norm_legit_functional.default",
                           "aten._native_batch_norm_legit.default"})


def to_backend(programs, partitioner: "VulkanPartitioner | None" = None) -> LoweredProgram:
    """Lower ``programs`` with ``partitioner`` (default: ``VulkanPartitioner()``).

    programs: a ``torch.export.ExportedProgram`` (the method "forward") or a dict of
        method name -> ExportedProgram.
    partitioner: a ``VulkanPartitioner`` (compile options go to it:
        ``VulkanPartitioner({"force_fp16": True})``) or None.
    Returns a LoweredProgram; each method's partition report is ``program.methods[name]
    .report``. Raises VkDelegateError for arguments of the wrong type (an options dict
    or an nn.Module where these go) and for a program vkdelegate cannot run at all
    (control flow, unsupported input kinds, custom Python containers).
    """
    if partitioner is None:
        partitioner = VulkanPartitioner()
    elif isinstance(partitioner, dict):
        raise VkDelegateError("to_backend's second argument is a VulkanPartitioner, got "
                              "a dict; pass the options to it: to_backend(ep, "
                              "VulkanPartitioner(options))")
    elif not isinstance(partitioner, VulkanPartitioner):
        raise VkDelegateError(f"to_backend's second argument must be a "
                              f"VulkanPartitioner, got {type(partitioner).__name__}")
    if isinstance(programs, dict):
        items = programs
    else:
        items = {"forward": programs}
    for name, ep in items.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise VkDelegateError(f"method name {name!r} must be a Python identifier")
        if not isinstance(ep, torch.export.ExportedProgram):
            hint = ("; export it first: torch.export.export(model.eval(), args)"
                    if isinstance(ep, torch.nn.Module) else "")
            raise VkDelegateError(f"method {name!r}: expected a torch.export."
                                  f"ExportedProgram, got {type(ep).__name__}{hint}")
    # A buffer one method mutates is state in every method that reads it (else a reader
    # would hold its export-time value as a constant).
    mutated = frozenset().union(*(mutated_buffers(ep) for ep in items.values()))
    cache = ConstantCache()  # a weight every method holds is copied and hashed once
    methods = {name: lower_method(ep, partitioner, mutated, cache)
               for name, ep in items.items()}
    return LoweredProgram(methods, partitioner.options)


def mutated_buffers(ep) -> set:
    """FQNs of the buffers ``ep`` mutates: its BUFFER_MUTATION outputs, and buffers an
    in-place op writes (export's IR before decomposition keeps ``copy_`` and friends
    in the graph; functionalization makes them outputs later)."""
    sig = ep.graph_signature
    found = {s.target for s in sig.output_specs if s.kind == OutputKind.BUFFER_MUTATION}
    buffers = {s.arg.name: s.target for s in sig.input_specs
               if s.kind == InputKind.BUFFER}
    for node in ep.graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op != "call_function" or schema is None:
            continue
        for arg, value in zip(schema.arguments, node.args):
            written = arg.alias_info is not None and arg.alias_info.is_write
            if written and isinstance(value, torch.fx.Node) and value.name in buffers:
                found.add(buffers[value.name])
    return found


def lower_method(ep, partitioner: VulkanPartitioner, shared_state=frozenset(),
                 constant_cache: "ConstantCache | None" = None) -> Method:
    """One ExportedProgram -> Method (plan, glue constants, state, delegates, report).
    shared_state: FQNs of the buffers any method of the program mutates.
    constant_cache: the delegate constants' bytes shared with the program's other
    methods (serialization.fx_values.ConstantCache); None: this method's own."""
    pg = partitioner.prepare(ep, shared_state)
    partitions, report = partitioner.propose(pg.gm)
    if partitions:
        fuse_by_partitions(pg.gm, [p.nodes for p in partitions], prefix=_PREFIX,
                           always_return_tuple=True)
    encoder = _GlueEncoder(pg, partitioner.options, constant_cache)
    plan = encoder.encode()
    # Number partitions in the report as the program numbers its delegates (graph
    # order), so that "partition 2" in a report is delegate 2 in profiles and inspect.
    for decision in report.decisions:
        if decision.partition is not None:
            decision.partition = encoder.delegate_index[f"{_PREFIX}{decision.partition}"]
            if decision.name in encoder.fp32_reasons:
                decision.notes = [f"float32 under force_fp16: "
                                  f"{encoder.fp32_reasons[decision.name]}"]
    constants = {k: v for k, v in pg.constants.items() if k in encoder.used}
    return Method(plan=plan, constants=constants, state=dict(pg.state),
                  delegates=encoder.delegates, report=report)


#: The largest coefficient or offset of a derived size the plan records (plan_check).
_AFFINE_LIMIT = 1 << 31


def affine(expr) -> "tuple[str, int, int] | None":
    """(symbol, a, b) where sympy ``expr`` is ``a*symbol + b`` with ints a >= 1 and
    b (a derived ``Dim``: ``2*T``, ``T + 1``; export may also write the root as
    ``s + 1`` and the derived size as ``s``), else None (``s0*s1``, a floor division)."""
    try:
        if len(expr.free_symbols) != 1:
            return None
        sym, = expr.free_symbols
        a, b = sympy.diff(expr, sym), expr.subs(sym, 0)
        if not (isinstance(sym, sympy.Symbol) and isinstance(a, sympy.Integer)
                and isinstance(b, sympy.Integer)
                and sympy.expand(expr - (a * sym + b)) == 0):
            return None
        a, b = int(a), int(b)
    except Exception:  # an expression sympy cannot take apart is not affine
        return None
    if not (1 <= a < _AFFINE_LIMIT and -_AFFINE_LIMIT < b < _AFFINE_LIMIT):
        return None
    return str(sym), a, b


def _dim_spec(dim, where: str = "an input dim") -> "int | dict":
    """A plan input's size: an int, ``{"sym": s}`` for a dynamic size, ``{"affine":
    [s, a, b]}`` for a size derived from one (``a*s + b``; checked at each call,
    input_checks), or ``{"expr": text}`` for any other expression, which calls do not
    check (a warning at lowering says so)."""
    if isinstance(dim, int):
        return dim
    expr = dim.node.expr
    if isinstance(expr, sympy.Symbol):
        return {"sym": str(expr)}
    if expr.is_number:
        return int(expr)
    derived = affine(expr)
    if derived is not None:
        return {"affine": list(derived)}
    logger.warning("vkdelegate: %s has the size %s, which is not a*s + b of one dynamic "
                   "size; calls do not check it (a wrong size fails inside the graph)",
                   where, expr)
    return {"expr": str(expr)}


def _ranges(pg: ProgramGraph) -> dict:
    """symbol -> [low, high or None]. Unbacked symbols (a size or index read from a
    tensor, e.g. ``x[t]`` with a 0-d ``t``) may have no bound at either end; they are
    never input sizes, so an unbounded low end is recorded as 0."""
    ranges = {}
    for sym, vr in pg.range_constraints.items():
        lo, hi = float(vr.lower), float(vr.upper)
        ranges[str(sym)] = [int(lo) if math.isfinite(lo) else 0,
                            int(hi) if math.isfinite(hi) else None]
    return ranges


def _dim_names(pg: ProgramGraph) -> dict:
    """symbol -> the user's ``Dim`` name (``s77`` -> ``batch``) for the input sizes
    export kept one for (``node_specs.dim_name``), so any torch without them simply
    gives no names and error messages use the symbols."""
    names = {}
    for name in pg.user_inputs:
        val = pg.placeholder(name).meta.get("val")
        for dim in getattr(val, "shape", ()):
            expr = getattr(getattr(dim, "node", None), "expr", None)
            if not isinstance(expr, sympy.Symbol) or str(expr) in names:
                continue
            debug = dim_name(dim.node)
            if debug is not None:
                names[str(expr)] = debug
    for name in pg.user_inputs:  # the symbols only derived sizes use (2*s39: h)
        val = pg.placeholder(name).meta.get("val")
        for dim in getattr(val, "shape", ()):
            expr = getattr(getattr(dim, "node", None), "expr", None)
            derived = affine(expr) if isinstance(expr, sympy.Expr) and not isinstance(
                expr, sympy.Symbol) else None
            if derived is None or derived[0] in names:
                continue
            sym = next(iter(expr.free_symbols))
            debug = symbol_name(getattr(dim.node, "shape_env", None), sym)
            if debug is not None:
                names[derived[0]] = debug
    return names


def _apply_blob_options(blob: bytes, named_data: dict, options: CompileOptions,
                        keep_ids: "set | None" = None) -> tuple[bytes, dict, list, list]:
    """Record the overrides and force_fp16 in a blob's VkGraph.

    Returns (blob, named_data, input casts, output casts): with force_fp16 every fp32
    tensor of the delegate becomes fp16 except those of the nodes in ``keep_ids``
    (``OperatorCall.node_id``s, see fp16_ranges), its constants are converted, and the
    glue casts fp16-homed inputs from fp32 and outputs back to fp32 at the delegate
    boundary (a cast per input and output, None where no cast is needed).
    """
    if not (options.force_fp16 or options.storage_type_override
            or options.memory_layout_override):
        return blob, named_data, [], []
    from vkdelegate.backend.fp16_cast import apply_force_fp16
    from vkdelegate.serialization.blob import read_blob, write_blob

    decoded = read_blob(blob)
    graph = decoded.graph
    graph.storage_type_override = options.storage_type
    graph.memory_layout_override = options.memory_layout
    if not options.force_fp16:
        return write_blob(graph, bytes(decoded.constants_section)), named_data, [], []
    named_data, casts_in, casts_out = apply_force_fp16(
        graph, named_data, keep_ids or set(), planned=not options.skip_memory_planning)
    return (write_blob(graph, bytes(decoded.constants_section)), named_data, casts_in,
            casts_out)


class _GlueEncoder:
    """Encodes the fused parent graph as JSON glue nodes; builds the delegates."""

    def __init__(self, pg: ProgramGraph, options: CompileOptions,
                 constant_cache: "ConstantCache | None" = None):
        self.pg, self.options = pg, options
        self.constant_cache = constant_cache
        self.delegates: list[Delegate] = []
        self.delegate_index: dict[str, int] = {}  # fused submodule name -> index
        self.used: set[str] = set()
        # force_fp16: node name -> why it stays float32; glue values that may
        # exceed float16 (a delegate's wide output, a CPU node reading one).
        self.fp32_reasons: dict[str, str] = {}
        self.wide: set[str] = set()
        self.wide_outputs: dict[str, list] = {}   # delegate node -> per output

    def arg(self, a, where: str):
        if isinstance(a, torch.fx.Node):
            self.used.add(a.name)
            return {"v": a.name}
        if a is None or isinstance(a, (bool, int, float, str)):
            return a
        if isinstance(a, (list, tuple)):
            return [self.arg(x, where) for x in a]
        if isinstance(a, torch.dtype):
            return {"dtype": str(a).replace("torch.", "")}
        if isinstance(a, torch.device):
            return {"device": str(a)}
        if isinstance(a, torch.layout):
            return {"layout": str(a).replace("torch.", "")}
        if isinstance(a, torch.memory_format):
            return {"memory_format": str(a).replace("torch.", "")}
        raise VkDelegateError(f"{where}: argument of type {type(a).__name__} cannot be "
                              f"saved in a program")

    def delegate(self, node: torch.fx.Node) -> dict:
        from vkdelegate.serialization.builder import build_vkgraph

        sub = self.pg.gm.get_submodule(node.target)
        placeholders = list(sub.graph.find_nodes(op="placeholder"))
        constants, inputs = {}, []
        for ph, outer in zip(placeholders, node.args):
            if isinstance(outer, torch.fx.Node) and outer.name in self.pg.constants:
                constants[ph.name] = self.pg.constants[outer.name]
            else:
                inputs.append(self.arg(outer, node.name))
        try:
            serialized = build_vkgraph(sub, constants, named_constants=True,
                                       skip_memory_planning=self.options.skip_memory_planning,
                                       alias_ops=alias_ops(),
                                       constant_cache=self.constant_cache)
        except VkDelegateError as exc:
            raise VkDelegateError(f"serializing partition {node.target} failed: {exc}") from exc
        keep_ids = self._fp32_node_ids(node, sub, placeholders, constants) \
            if self.options.force_fp16 else set()
        blob, named_data, casts_in, casts_out = _apply_blob_options(
            serialized.blob, dict(serialized.named_data), self.options, keep_ids)
        self.delegate_index[node.target] = len(self.delegates)
        self.delegates.append(Delegate(blob, named_data))
        call = {"op": "delegate", "index": len(self.delegates) - 1, "args": inputs,
                "out": node.name}
        if any(casts_in) or any(casts_out):
            call.update(cast_inputs=casts_in, cast_outputs=casts_out)
        return call

    def _fp32_node_ids(self, node, sub, placeholders, constants) -> set:
        """force_fp16: node_ids of the partition's nodes that stay float32
        (fp16_ranges); records their reasons and which outputs may exceed float16."""
        known = {name: t.detach().cpu().numpy() for name, t in constants.items()
                 if isinstance(t, torch.Tensor) and t.dtype == torch.float32}
        wide_inputs = set()
        for ph, outer in zip(placeholders, node.args):
            if not isinstance(outer, torch.fx.Node):
                continue
            literal = fp16_ranges.cpu_literal(outer)
            if literal is not None:
                known[ph.name] = literal
            if outer.name in self.wide:
                wide_inputs.add(ph.name)
        reasons, self.wide_outputs[node.name] = fp16_ranges.fp32_nodes(sub, known,
                                                                      wide_inputs)
        self.fp32_reasons.update(reasons)
        return {i for i, n in enumerate(sub.graph.nodes) if n.name in reasons}

    def _track_wide(self, node: torch.fx.Node) -> None:
        """force_fp16: whether glue value ``node`` may exceed float16."""
        if node.target is operator.getitem and node.args[0].name in self.wide_outputs:
            flags = self.wide_outputs[node.args[0].name]
            if node.args[1] < len(flags) and flags[node.args[1]]:
                self.wide.add(node.name)
        elif node.op == "call_function" and str(node.target) not in fp16_ranges.NARROWING \
                and any(a.name in self.wide for a in node.all_input_nodes):
            self.wide.add(node.name)

    def node(self, node: torch.fx.Node) -> dict:
        if self.options.force_fp16:
            self._track_wide(node)
        if node.op == "call_module":
            return self.delegate(node)
        target = node.target
        if target is operator.getitem:
            return {"op": "getitem", "args": [self.arg(node.args[0], node.name),
                                              node.args[1]], "out": node.name}
        if isinstance(target, torch._ops.OpOverload):
            name = str(target)
            if not allowed_ops.is_allowed(name):
                # A file that calls it would not load (a user's custom op, say).
                refused = allowed_ops.refusal(
                    name, f"node {node.name}{from_model_call(node)}, which stays on the "
                          f"CPU,")
                if name in _TRAINING_OPS:
                    raise VkDelegateError(f"{refused}; it is batch norm updating its "
                                          f"running statistics: the model was exported "
                                          f"in training mode; call model.eval() before "
                                          f"torch.export.export")
                raise VkDelegateError(f"{refused}; docs/LOWERING.md lists what it may "
                                      f"call")
        else:
            name = glue_ops.builtin_name(target)
            if name is None:
                raise VkDelegateError(f"node {node.name} calls {target}, which a program "
                                      f"cannot run on the CPU")
        return {"op": name, "args": self.arg(list(node.args), node.name),
                "kwargs": {k: self.arg(v, node.name) for k, v in node.kwargs.items()},
                "out": node.name}

    def encode(self) -> dict:
        pg = self.pg
        nodes, outputs = [], []
        inputs = []
        for name, label in zip(pg.user_inputs, pg.user_input_labels):
            val = pg.placeholder(name).meta["val"]
            if val is None or isinstance(val, (bool, int, float, str)):
                # torch.export specializes a Python scalar input to its example value.
                inputs.append({"name": label, "value": name, "const": val})
                continue
            if not isinstance(val, torch.Tensor):
                raise VkDelegateError(f"input {name!r} of type {type(val).__name__} is not "
                                      f"supported (tensors and Python scalars are)")
            if dtype_name(val.dtype) not in DTYPE_TABLE:
                raise VkDelegateError(
                    f"input {label!r} has dtype {dtype_name(val.dtype)}, which a program "
                    f"cannot hold (inputs may be {', '.join(sorted(DTYPE_TABLE))})")
            # "name": what users call the input; "value": the glue value it binds.
            inputs.append({"name": label, "value": name, "dtype": dtype_name(val.dtype),
                           "shape": [_dim_spec(d, f"input {label!r} dim {i}")
                                     for i, d in enumerate(val.shape)]})
        for node in pg.gm.graph.nodes:
            if node.op in ("call_function", "call_module"):
                nodes.append(self.node(node))
            elif node.op == "output":
                outputs = self.arg(list(node.args[0]), "output")
            elif node.op != "placeholder":
                raise VkDelegateError(f"node {node.name}: {node.op} nodes are not supported")
        return {
            "inputs": inputs,
            "ranges": _ranges(pg),
            "dim_names": _dim_names(pg),
            "in_spec": pytree_spec.from_treespec(pg.in_spec),
            "out_spec": pytree_spec.from_treespec(pg.out_spec),
            "nodes": nodes,
            "outputs": outputs,
            "user_outputs": pg.user_outputs,
            "state_updates": pg.state_updates,
            "state_fqn": dict(pg.state_fqn),
            "input_updates": {str(k): v for k, v in pg.input_updates.items()},
        }
