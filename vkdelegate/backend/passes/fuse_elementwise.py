"""Fuse chains of float elementwise ops into ``vkdelegate.fused_elementwise``.

A group grows from a fusable node (an op of kernels/elementwise_chain.FUSABLE on
float32 or float16 tensors of one dtype, with constant scalar arguments, or a plain
``aten._to_copy`` between float32 and float16) by taking in the fusable producers all
of whose users are in the group (the producer's value then never leaves it), as long
as the group reads at most ``MAX_INPUTS`` distinct tensors from outside. Each group of
two or more nodes becomes one node: its intermediate tensors are never written to
memory, and one dispatch replaces several (``x * sigmoid(x)``, ``gelu(x) * y + z``, a
decomposed SiLU/GeGLU gate, a scale-and-shift). Broadcasting composes (an input that
broadcasts to an intermediate broadcasts to the output the same way), so a producer of
a smaller shape may join.

Casts: ATen's decompositions compute a float16 op in float32 between two casts
(a float16 HF Llama's MLP exports as ``_to_copy(gate, f32) -> sigmoid, mul ->
_to_copy(f16) -> mul(up)``, its rotary prelude as ``cos(f32) -> _to_copy(f16)``); a
cast joins a chain as a step (kernels/elementwise_chain.py: to float16 rounds to
nearest even, to float32 is exact), so that whole SwiGLU gate is one dispatch. The
inputs of a chain may then differ in dtype, its output has its last node's, and each
step keeps its node's dtype (an fp16 step rounds, an fp32 one does not; a Python scalar
of an fp16 step is rounded as ATen rounds it).

Runs last among the fusions (after conv+clamp, RMS norm and rotary, whose patterns it
would otherwise take apart) and only where the registry has the fused op.
"""
from __future__ import annotations

import torch

from vkdelegate.backend.custom_ops import FUSED_ELEMENTWISE
from vkdelegate.backend.node_specs import schema_args
from vkdelegate.kernels import elementwise_chain as chain
from vkdelegate.kernels.elementwise_exprs import BINARY_OPS, UNARY_OPS
from vkdelegate.ops import registry

_FLOATS = {torch.float32, torch.float16}
_MAX_RANK = 6
#: _to_copy keyword arguments a fusable cast may have, and the values that leave the
#: layout, device and memory format as they are (None: the input's).
_CAST_DEFAULTS = {"layout": (None, torch.strided), "pin_memory": (None, False),
                  "non_blocking": (False,),
                  "memory_format": (None, torch.preserve_format, torch.contiguous_format)}


def _tensor(val):
    return val if isinstance(val, torch.Tensor) else None


def _candidate(node, fusable=None):
    """(ATen name, schema args) of a node that may join a chain, else None.
    ``fusable``: ProgramGraph.fusable (None: any node)."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return None
    name = str(node.target)
    out = _tensor(node.meta.get("val"))
    if name not in chain.FUSABLE or out is None or out.dtype not in _FLOATS \
            or out.dim() > _MAX_RANK:
        return None
    args = schema_args(node)
    if name == chain.CAST:
        if not _plain_cast(node, args, out):
            return None
    elif not _plain_op(name, args, out):
        return None
    if fusable is not None and not fusable(node):
        return None
    return name, args


def _plain_op(name: str, args: list, out) -> bool:
    """Whether a unary or binary op of FUSABLE with schema ``args`` fits a chain: its
    tensors of ``out``'s dtype, its other arguments numbers (or gelu's choice)."""
    tensors = [a for a in args if isinstance(a, torch.fx.Node)]
    for t in tensors:
        v = _tensor(t.meta.get("val"))
        if v is None or v.dtype != out.dtype or v.dim() > _MAX_RANK:
            return False
    if name in BINARY_OPS:
        ops = args[:2]
        if not isinstance(ops[0], torch.fx.Node) or not all(
                isinstance(a, torch.fx.Node) or _number(a) for a in ops):
            return False
        if BINARY_OPS[name].alpha is not None and not _number(args[2]):
            return False
        return len(args) <= (3 if BINARY_OPS[name].alpha is not None else 2)
    if len(tensors) != 1 or args[0] is not tensors[0]:
        return False
    expr = UNARY_OPS[name].expr
    if isinstance(expr, dict):
        return len(args) >= 2 and args[1] in expr
    return all(_number(a) or a is None for a in args[1:])


def _plain_cast(node, args, out) -> bool:
    """Whether ``_to_copy`` node ``node`` (schema ``args``: self, dtype, layout, device,
    pin_memory, non_blocking, memory_format) only converts a float32 tensor to float16
    or back: its other arguments are absent or the defaults that keep the layout,
    device and memory format (a stored tensor is contiguous, so contiguous_format
    changes nothing either)."""
    x = args[0]
    src = _tensor(x.meta.get("val")) if isinstance(x, torch.fx.Node) else None
    if src is None or src.dtype not in _FLOATS or src.dtype == out.dtype \
            or src.dim() > _MAX_RANK or args[1] != out.dtype:
        return False
    names = [a.name for a in node.target._schema.arguments]
    for key, value in zip(names, args):
        if key in _CAST_DEFAULTS and value not in _CAST_DEFAULTS[key]:
            return False
    device = args[names.index("device")]
    return device is None or torch.device(device) == src.device


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class _Group:
    def __init__(self, root, nodes):
        self.root = root      # the node whose value leaves the group
        self.nodes = nodes    # in graph order


def _external_inputs(nodes: list) -> list:
    inside = set(nodes)
    found = []
    for n in nodes:
        for a in schema_args(n):
            if isinstance(a, torch.fx.Node) and a not in inside and a not in found:
                found.append(a)
    return found


def _encode(group: _Group) -> tuple[list, str, list]:
    """(inputs, steps text, scalars) of a group. Its inputs are read from the nodes
    now: an earlier group's root they read has become that group's fused node."""
    inputs = _external_inputs(group.nodes)
    regs = {n: k for k, n in enumerate(inputs)}
    scalars, texts = [], []

    def slot(v, rounds: bool = False) -> str:
        # A Python-scalar operand of an fp16 op that ATen rounds to fp16 first (all
        # but mul and div: elementwise_exprs.Binary.fp32_scalar), rounded the same way.
        scalars.append(float(torch.tensor(float(v), dtype=torch.float16)) if rounds
                       else float(v))
        return f"s{len(scalars) - 1}"

    for n in group.nodes:
        name, args = _candidate(n)
        half = n.meta["val"].dtype == torch.float16   # this step's dtype
        if name == chain.CAST:
            ops = [f"r{regs[args[0]]}", f"'{str(args[1]).replace('torch.', '')}'"]
        elif name in BINARY_OPS:
            rounds = half and not BINARY_OPS[name].fp32_scalar
            ops = [f"r{regs[a]}" if isinstance(a, torch.fx.Node) else slot(a, rounds)
                   for a in args[:2]]
            if BINARY_OPS[name].alpha is not None:
                ops.append(slot(args[2]))
        else:
            op = UNARY_OPS[name]
            ops = [f"r{regs[args[0]]}"]
            if isinstance(op.expr, dict):
                ops.append(f"'{args[1]}'")
            elif op.params is not None:
                ops += [slot(v) for v in op.params(list(args[1:]), True)]
        texts.append(f"{name}({','.join(ops)})")
        regs[n] = len(regs)
    return inputs, ";".join(texts), scalars


def _grow(members: list, group_of: dict, order: dict) -> list:
    """``members`` with the groups of its producers taken in, one at a time in input
    order, while the chain stays within its limits: a producer's group joins when the
    producer is its group's root and every user of it is a member (so ``x * sigmoid(x)``
    takes in x's cast, read twice, once both readers are in). Members' values other
    than the root's are then read only inside the group, so it is convex."""
    grown = True
    while grown:
        grown = False
        inside = set(members)
        for a in _external_inputs(members):
            g = group_of.get(a)
            if g is None or g.root is not a or not all(u in inside for u in a.users):
                continue
            trial = sorted(g.nodes + members, key=order.__getitem__)
            if len(trial) <= chain.MAX_STEPS and \
                    len(_external_inputs(trial)) <= chain.MAX_INPUTS:
                members, grown = trial, True
                break
    return members


def fuse_elementwise(pg) -> bool:
    """Replace each chain of two or more fusable nodes by one fused node; True if
    any."""
    if FUSED_ELEMENTWISE.name not in registry.load_all():
        return False
    graph = pg.gm.graph
    order = {n: i for i, n in enumerate(graph.nodes)}
    group_of: dict = {}
    groups = []
    for node in list(graph.nodes):
        if _candidate(node, pg.fusable) is None:
            continue
        members = _grow([node], group_of, order)
        group = _Group(node, members)
        for m in members:
            old = group_of.get(m)
            if old is not None and old in groups:
                groups.remove(old)
            group_of[m] = group
        groups.append(group)
    fused_op = FUSED_ELEMENTWISE.overload()
    changed = False
    for group in groups:
        if len(group.nodes) < 2:
            continue
        inputs, steps, scalars = _encode(group)
        with graph.inserting_before(group.root):
            fused = graph.call_function(fused_op, (inputs, steps, scalars))
        fused.meta = dict(group.root.meta)
        group.root.replace_all_uses_with(fused)
        for n in reversed(group.nodes):
            graph.erase_node(n)
        changed = True
    return changed

