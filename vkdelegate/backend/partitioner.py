"""VulkanPartitioner: decide which nodes of an exported program run on Vulkan.

Each call_function node is described as a registry ``NodeSpec`` and checked by its
op's rules. The partitioner never raises on an op it does not know or cannot check:
such a node stays on the CPU, and the report says why. Partitions are the maximal
groups of supported nodes without cycles, as torch.fx's CapabilityBasedPartitioner
forms them. Proposing (``report``) is separate from mutating (``to_backend``).
"""
from __future__ import annotations

import logging
import operator
from typing import Iterable, Optional

import torch
from torch.fx.passes.infra.partitioner import Partition

from vkdelegate.ops import registry
from vkdelegate.backend.glue_ops import BUILTINS, builtin_name
from vkdelegate.backend.node_specs import from_model_call, node_spec
from vkdelegate.backend.passes import bfloat16
from vkdelegate.backend.symint_partitions import (partitions_keeping_symints,
                                                  monotone_reason, is_symint)
from vkdelegate.backend.custom_ops import FUSED_ELEMENTWISE
from vkdelegate.backend.options import CompileOptions, parse_options
from vkdelegate.backend.report import NodeDecision, PartitionReport
from vkdelegate.errors import VkDelegateError
from vkdelegate.kernels.elementwise_chain import describe as describe_chain
from vkdelegate.serialization.builder import op_name

logger = logging.getLogger("vkdelegate")


def _op_label(target) -> str:
    """"aten.add.Tensor" for ATen ops, "operator.getitem" for Python functions."""
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    module = getattr(target, "__module__", None) or ""
    module = "operator" if module == "_operator" else module
    return f"{module}.{getattr(target, '__name__', target)}".lstrip(".")


def _known_op(name: str) -> bool:
    """Whether ``name`` is an op the lists can match: one the registry knows (ours and
    ExecuTorch's custom ops included) or its overload packet, a size operator of the
    glue ("operator.mul"), or an op or overload packet torch defines ("aten.relu",
    "aten.add.Tensor")."""
    specs = registry.load_all()
    if name in specs or name in BUILTINS \
            or any(key.rsplit(".", 1)[0] == name for key in specs):
        return True
    parts = name.split(".")
    if len(parts) not in (2, 3) or not all(p.isidentifier() for p in parts):
        return False
    try:
        packet = getattr(getattr(torch.ops, parts[0]), parts[1])
    except (AttributeError, RuntimeError):
        return False
    return len(parts) == 2 or parts[2] in packet.overloads()


def _op_names(ops: Optional[Iterable], which: str) -> Optional[frozenset]:
    """Normalize an allow/block list of OpOverloads, overload packets or names to
    names. Raises VkDelegateError naming an entry that is no op (a misspelled name
    would otherwise match nothing, silently)."""
    if ops is None:
        return None
    single = (str, torch._ops.OpOverload, torch._ops.OpOverloadPacket)
    if isinstance(ops, single) or not isinstance(ops, Iterable):
        raise VkDelegateError(f"{which} must be a list of ops (names such as "
                              f"\"aten.relu.default\" or OpOverloads), got "
                              f"{type(ops).__name__} {ops!r}")
    names = []
    for o in ops:
        if isinstance(o, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            names.append(str(o))
        elif isinstance(o, str):
            if not _known_op(o):
                raise VkDelegateError(f"{which} entry {o!r} is not an operator torch or "
                                      f"vkdelegate knows (give an overload such as "
                                      f"\"aten.relu.default\", an overload packet such "
                                      f"as \"aten.relu\", or torch.ops.aten.relu.default)")
            names.append(o)
        elif callable(o):
            names.append(_op_label(o))
        else:
            raise VkDelegateError(f"{which} entry {o!r} of type {type(o).__name__} is "
                                  f"not an operator")
    return frozenset(names)


def _list_keys(target) -> set:
    """What an allow/block list entry may name ``target`` by: its overload name, its
    label and, for an ATen-style op, its overload packet ("aten.relu")."""
    name = str(target)
    keys = {name, _op_label(target)}
    if isinstance(target, torch._ops.OpOverload):
        keys.add(str(target.overloadpacket))
    elif isinstance(target, str) and name.count(".") == 2:
        keys.add(name.rsplit(".", 1)[0])
    return keys


class VulkanPartitioner:
    """Chooses the Vulkan partitions of an (ATen-decomposed) ExportedProgram.

    compile_options: dict of options (see ``vkdelegate.backend.options``); bad keys or
        values raise VkDelegateError here, at construction.
    operator_allowlist: if given, only these ops (OpOverloads or names such as
        "aten.add.Tensor"; an overload packet, "aten.add" or torch.ops.aten.add, names
        all its overloads) may be delegated.
    operator_blocklist: these ops are never delegated.
    A list entry that is no op torch or the registry knows (a misspelled name) raises
    VkDelegateError, at construction.
    """

    def __init__(self, compile_options: "dict | None" = None, operator_allowlist=None,
                 operator_blocklist=None):
        self.options: CompileOptions = parse_options(compile_options)
        self.allowlist = _op_names(operator_allowlist, "operator_allowlist")
        self.blocklist = _op_names(operator_blocklist, "operator_blocklist") or frozenset()

    def _fusable(self, node: torch.fx.Node) -> bool:
        """Whether ``node`` may be folded into a fused node: only where it would run on
        Vulkan itself (``check_node``: the registry's rules, the allow/block lists),
        the ``fuse_elementwise`` option is on and the lists let the fused op run."""
        return self.options.fuse_elementwise and self._op_allowed(FUSED_ELEMENTWISE.name) \
            and not self.check_node(node)

    def _op_allowed(self, name: str) -> bool:
        """Whether the allow/block lists let op ``name`` run on Vulkan."""
        keys = _list_keys(name)
        return not keys & self.blocklist and (self.allowlist is None
                                               or bool(keys & self.allowlist))

    def check_node(self, node: torch.fx.Node) -> list[str]:
        """Reasons ``node`` (a call_function node) cannot run on Vulkan; [] if it can.

        Never raises: an unknown op or a failing check becomes a reason.
        """
        name = str(node.target)
        if node.target is operator.getitem:
            # CapabilityBasedPartitioner puts it with the node it reads from.
            return ["getitem goes with its producer"]
        symint_op = is_symint(node) and builtin_name(node.target) is not None
        if not isinstance(node.target, torch._ops.OpOverload) and not symint_op:
            return [f"{name} is not an ATen operator"]
        if node.meta.get(bfloat16.BOUNDARY_KEY):
            return [bfloat16.BOUNDARY_REASON]
        keys = _list_keys(node.target)
        if self.allowlist is not None and not keys & self.allowlist:
            return ["not in operator_allowlist"]
        if keys & self.blocklist:
            return ["in operator_blocklist"]
        # load_all outside any try: a broken op family is a bug to surface, not a
        # reason to keep every node on the CPU.
        spec = registry.load_all().get(op_name(node.target))
        if spec is None:
            return [f"no Vulkan implementation of {name}{from_model_call(node)}"]
        try:
            described = node_spec(node, op_name(node.target))
        except VkDelegateError as exc:
            return [str(exc)]
        except Exception as exc:  # a node we cannot describe stays on the CPU
            return [f"cannot describe node ({type(exc).__name__}: {exc})"]
        reasons = []
        if self.options.require_dynamic_shapes and not spec.resizable:
            reasons.append("op cannot be resized and require_dynamic_shapes is set")
        try:
            reasons.extend(spec.check(described))
            if spec.returns == "symint" and not reasons:
                reasons.extend(monotone_reason(node, spec, described))
        except Exception as exc:  # a buggy rule must not break lowering
            reasons.append(f"support check failed ({type(exc).__name__}: {exc})")
        return reasons

    def propose(self, graph_module: torch.fx.GraphModule
                ) -> tuple[list[Partition], PartitionReport]:
        """Partitions of ``graph_module`` (not modified) and the report."""
        decisions = []
        supported = set()
        for node in graph_module.graph.nodes:
            if node.op != "call_function":
                continue
            reasons = self.check_node(node)
            if node.target is operator.getitem and getattr(node.args[0], "name", None) \
                    in supported:
                # Supported with its producer (e.g. max_pool2d_with_indices): left
                # unsupported, it would cut the graph there, since the fx partitioner
                # merges a node with its users only through supported nodes.
                reasons = []
            notes = [node.meta[bfloat16.NOTE_KEY]] if bfloat16.NOTE_KEY in node.meta else []
            if str(node.target) == FUSED_ELEMENTWISE.name and isinstance(node.args[1], str):
                notes.append(describe_chain(node.args[1]))
            decisions.append(NodeDecision(node.name, _op_label(node.target), reasons,
                                          notes=notes))
            if not reasons:
                supported.add(node.name)
        partitions, where, crossing = partitions_keeping_symints(graph_module, supported)
        nodes = {n.name: n for n in graph_module.graph.nodes}
        for d in decisions:
            if d.name in crossing:
                d.reasons = [crossing[d.name]]
            d.partition = where.get(d.name)
            if d.partition is not None:
                d.reasons = []
            elif nodes[d.name].target is operator.getitem:
                producer = nodes[d.name].args[0]
                d.reasons = [f"reads an output of {producer.name}, which runs on the CPU"]
        report = PartitionReport(decisions, len(partitions))
        logger.info(report.summary())
        unbounded = {d.name: [r for r in d.reasons if "has no upper bound" in r]
                     for d in report.cpu_nodes}
        unbounded = {k: v for k, v in unbounded.items() if v}
        if unbounded:  # a dynamic export without Dim(max=...): say so, not silently
            reasons = sorted({r for rs in unbounded.values() for r in rs})
            logger.warning("vkdelegate: %d node(s) stay on the CPU: %s", len(unbounded),
                           "; ".join(reasons))
        return partitions, report

    def ops_to_preserve(self, ep) -> set:
        """Ops the default decomposition would split but that every one of their nodes
        in ``ep`` could run on Vulkan whole (e.g. ``aten.linear`` on 3-D inputs,
        which decomposes into views around a matrix multiply)."""
        table = torch.export.default_decompositions()
        verdicts: dict = {}
        for node in ep.graph_module.graph.nodes:
            op = node.target
            if node.op != "call_function" or op not in table or verdicts.get(op) is False:
                continue
            verdicts[op] = not self.check_node(node)
        return {op for op, ok in verdicts.items() if ok}

    def calls_to_preserve(self, ep) -> dict:
        """Ops the default decomposition would split of which only some nodes in ``ep``
        could run on Vulkan whole (an SDPA without dropout next to one with): op -> the
        ``program_graph.call_key``s of those nodes, which stay whole."""
        from vkdelegate.backend.program_graph import call_key

        table = torch.export.default_decompositions()
        keep, split = {}, set()
        for node in ep.graph_module.graph.nodes:
            if node.op != "call_function" or node.target not in table:
                continue
            if self.check_node(node):
                split.add(node.target)
            else:
                keep.setdefault(node.target, set()).add(
                    call_key(node.target, node.args, node.kwargs))
        return {op: keys for op, keys in keep.items() if op in split}

    def prepare(self, ep, shared_state=frozenset()):
        """The ProgramGraph to_backend partitions: ``ep`` decomposed to core ATen,
        with the lowering passes applied (a copy; ``ep`` is not modified).
        shared_state: FQNs other methods mutate (``from_exported_program``)."""
        from vkdelegate.backend.passes import run_passes
        from vkdelegate.backend.program_graph import from_exported_program

        pg = from_exported_program(ep, self.ops_to_preserve(ep), self.calls_to_preserve(ep),
                                   shared_state)
        pg.fusable = self._fusable
        pg.runs_on_vulkan = lambda node: not self.check_node(node)
        pg.op_allowed = self._op_allowed
        pg.options = self.options
        run_passes(pg)
        pg.gm.graph.eliminate_dead_code()
        return pg

    def partition(self, ep) -> list[Partition]:
        """Partitions of ``ep`` as to_backend would form them (nodes of a prepared
        copy, see ``prepare``; for inspection)."""
        return self.propose(self.prepare(ep).gm)[0]

    def report(self, ep) -> PartitionReport:
        """Which nodes of ``ep`` stay on the CPU after decomposition and the lowering
        passes, and why: the same decisions to_backend makes."""
        return self.propose(self.prepare(ep).gm)[1]
