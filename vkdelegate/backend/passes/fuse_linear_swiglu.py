"""Fold the SwiGLU chain after a merged gate/up linear into the linear:
``vkdelegate.fused_elementwise([narrow_last(y, 0, F), narrow_last(y, F, F)], steps)``
of y = ``aten.linear(x, weight [2F, K], bias?)`` becomes ``vkdelegate.linear_swiglu(x,
weight, bias, steps')`` (kernels/swiglu.py): one dispatch instead of two per decode
layer, the chain computed in the GEMV's epilogue (gemv.glsl's SWIGLU; linear.glsl's on
CPU drivers) from the gate and up sums rounded as the linear's store rounds them, so
the output's bits are the unfused pair's. The quantized linears the same way: y =
``et_vk.linear_q4gsw(x, weights, scales, group_size, bias?)`` (torchao's int4
weight-only) becomes ``vkdelegate.linear_q4gsw_swiglu(x, weights, scales, group_size,
bias, steps')``, y = ``aten._weight_int8pack_mm(x, weight, scales)`` (int8 weight-only)
``vkdelegate.weight_int8pack_mm_swiglu(x, weight, scales, steps')``, y =
``et_vk.linear_dq8ca_q4gsw(x, x_scales, x_zp, weights, sums, scales, group_size, bias?)``
(8da4w) ``vkdelegate.linear_dq8ca_q4gsw_swiglu(..., bias, steps')``
(ops/families/quantized_linear.py: the chain in linear_qw_gemv.glsl's and linear_qw.glsl's
epilogues).

In an HF Llama/Qwen2/Mistral decode step (and prefill), passes/merge_linears merges
gate_proj and up_proj into one linear whose two ``narrow_last`` parts the SiLU gate
chain reads (passes/fuse_elementwise: ``silu(gate) * up``, in float16 with ATen's casts
around the SiLU). Fused only when exactly that is there:

- the fused chain reads only the two ``vkdelegate.narrow_last`` parts of one producer,
  the first half [0, F) and the second [F, 2F) of its last dim (2F static), each
  directly or through ``aten.view`` nodes that only add or drop leading size-1 dims
  (torchao's int8 linear views its [1, 2F]-row output back to [1, 1, N]: its chain
  reads the gate through such a view and, after cse, also directly); the chain is the
  only reader of the parts and views (but for each other), the two parts are the
  producer's only readers; where views are involved, the parts, the views and the
  chain's output are equal up to leading size-1 dims (one row's elements: the chain's
  broadcasting is elementwise), and the fused op's output [..., F] is viewed to the
  chain's shape where they differ;
- the producer is ``aten.linear.default(x, weight, bias?)`` with a weight [2F, K] and a
  bias [2F] (or none), or ``vkdelegate.rms_norm_linear`` (passes/fuse_rms_norm_linear:
  the post-attention norm folded into the merged linear), which makes the fused node
  ``vkdelegate.rms_norm_linear_swiglu(x, norm_weight, eps, weight, bias, steps')``
  (the norm, the GEMV and the chain in one dispatch; with compile option
  ``rms_norm_prologue`` off the op records the norm's dispatch first);
  or ``et_vk.linear_q4gsw`` with weights uint8 [2F, K/2], scales [K/gs, >= 2F] of
  the output's dtype and a bias [2F] (or none); or ``aten._weight_int8pack_mm`` with
  an int8 weight [2F, K] and scales [2F] of the output's dtype; or their forms with
  the norm folded in (``vkdelegate.rms_norm_linear_q4gsw`` /
  ``rms_norm_weight_int8pack_mm``, passes/fuse_rms_norm_linear), which make
  ``vkdelegate.rms_norm_linear_q4gsw_swiglu(x, norm_weight, eps, weights, scales,
  group_size, bias, steps')`` / ``rms_norm_weight_int8pack_mm_swiglu(x, norm_weight,
  eps, mat2, scales, steps')``; or ``et_vk.linear_dq8ca_q4gsw`` (8da4w, merged by
  merge_linears) with int4 weights [2F, K/2] and sums and scales of >= 2F columns;
- the producer's output, the parts and the chain's output are float32 or float16 of
  one dtype, and the chain computes exactly one of kernels/swiglu.py's ``CHAINS``
  (``swiglu.match_roles``: SiLU of the first half times the second, with the same
  rounding steps; no scalars), whose canonical text the fused op then carries.

A chain over the halves in the other roles (SiLU of the second half), a GeGLU (gemma's
gelu), a part read elsewhere or a graph output, a merged q/k/v linear: left alone.
Runs right after fuse_elementwise (which makes the chain); off with compile option
``fuse_linear_swiglu`` = False, and where the registry lacks the fused op.
"""
from __future__ import annotations

import torch

from vkdelegate.backend.custom_ops import (FUSED_ELEMENTWISE, LINEAR_DQ8CA_Q4GSW,
                                           LINEAR_DQ8CA_Q4GSW_SWIGLU, LINEAR_Q4GSW,
                                           LINEAR_Q4GSW_SWIGLU, LINEAR_SWIGLU,
                                           RMS_NORM_LINEAR, RMS_NORM_LINEAR_Q4GSW,
                                           RMS_NORM_LINEAR_Q4GSW_SWIGLU,
                                           RMS_NORM_LINEAR_SWIGLU,
                                           RMS_NORM_WEIGHT_INT8PACK_MM,
                                           RMS_NORM_WEIGHT_INT8PACK_MM_SWIGLU,
                                           WEIGHT_INT8PACK_MM_SWIGLU)
from vkdelegate.backend.custom_ops_llm import NARROW_LAST
from vkdelegate.kernels import swiglu
from vkdelegate.ops import registry

aten = torch.ops.aten
_DTYPES = {torch.float32: "float32", torch.float16: "float16"}


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _part(node):
    """(producer, start, length) of a ``narrow_last`` node with int arguments, else
    None."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function" \
            or node.target != NARROW_LAST.overload() or node.kwargs or len(node.args) != 3:
        return None
    src, start, length = node.args
    if not isinstance(src, torch.fx.Node) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in (start, length)):
        return None
    return src, start, length


#: The quantized products' fused ops, int4 and int8 (with the norm: its x,
#: norm_weight and eps before the product's weight).
_Q4 = (LINEAR_Q4GSW_SWIGLU, RMS_NORM_LINEAR_Q4GSW_SWIGLU)
_Q8 = (WEIGHT_INT8PACK_MM_SWIGLU, RMS_NORM_WEIGHT_INT8PACK_MM_SWIGLU)


def _linear_args(producer):
    """(fused op, [x, ...the fused op's arguments but steps], weight, bias, scales,
    group size) of a fusable producer (scales and group size None where it has
    none), else None."""
    found = _producer_args(producer)
    if found is None:
        return None
    fused, args, w, bias = found
    at = 3 if fused in (RMS_NORM_LINEAR_Q4GSW_SWIGLU, RMS_NORM_WEIGHT_INT8PACK_MM_SWIGLU,
                        LINEAR_DQ8CA_Q4GSW_SWIGLU) else 1  # the weight's position
    if fused is LINEAR_DQ8CA_Q4GSW_SWIGLU:  # x, its qparams, weights, sums, scales, gs
        return fused, args, w, bias, args[5], args[6]
    if fused in _Q4:
        return fused, args, w, bias, args[at + 1], args[at + 2]
    if fused in _Q8:
        return fused, args, w, bias, args[at + 1], None
    return fused, args, w, bias, None, None


def _producer_args(producer):
    """(fused op, [x, ...the fused op's arguments but steps], weight, bias) of a
    fusable producer, else None."""
    if producer.op != "call_function" or producer.kwargs:
        return None
    args = producer.args
    if producer.target == aten.linear.default and len(args) in (2, 3):
        bias = args[2] if len(args) == 3 else None
        return LINEAR_SWIGLU, [args[0], args[1], bias], args[1], bias
    if producer.target == RMS_NORM_LINEAR.overload() and len(args) in (4, 5):
        x, nw, eps, w = args[:4]
        bias = args[4] if len(args) == 5 else None
        return RMS_NORM_LINEAR_SWIGLU, [x, nw, eps, w, bias], w, bias
    if producer.target == LINEAR_Q4GSW.overload() and len(args) in (4, 5):
        bias = args[4] if len(args) == 5 else None
        return LINEAR_Q4GSW_SWIGLU, [args[0], args[1], args[2], args[3], bias], args[1], \
            bias
    if producer.target == LINEAR_DQ8CA_Q4GSW.overload() and len(args) in (7, 8):
        bias = args[7] if len(args) == 8 else None
        return LINEAR_DQ8CA_Q4GSW_SWIGLU, list(args[:7]) + [bias], args[3], bias
    if producer.target == aten._weight_int8pack_mm.default and len(args) == 3:
        return WEIGHT_INT8PACK_MM_SWIGLU, list(args), args[1], None
    if producer.target == RMS_NORM_LINEAR_Q4GSW.overload() and len(args) in (6, 7):
        bias = args[6] if len(args) == 7 else None
        return RMS_NORM_LINEAR_Q4GSW_SWIGLU, list(args[:6]) + [bias], args[3], bias
    if producer.target == RMS_NORM_WEIGHT_INT8PACK_MM.overload() and len(args) == 5:
        return RMS_NORM_WEIGHT_INT8PACK_MM_SWIGLU, list(args), args[3], None
    return None


def _weight_ok(fused, w, scales, group, f: int, dtype) -> bool:
    """Whether the producer's weight (and int4 group size, scales) are a merged gate/up
    product's of 2F rows for activations of ``dtype``, as the fused op's rules want."""
    wv = _val(w)
    if not isinstance(wv, torch.Tensor) or wv.dim() != 2 or wv.shape[0] != 2 * f:
        return False
    if fused in (LINEAR_SWIGLU, RMS_NORM_LINEAR_SWIGLU):
        return wv.dtype == dtype
    sv = _val(scales)
    if not isinstance(sv, torch.Tensor) or sv.dtype != dtype:
        return False
    if fused in _Q4 or fused is LINEAR_DQ8CA_Q4GSW_SWIGLU:
        return wv.dtype == torch.uint8 and sv.dim() == 2 and sv.shape[1] >= 2 * f \
            and isinstance(group, int) and not isinstance(group, bool)
    return wv.dtype == torch.int8 and tuple(sv.shape) == (2 * f,)


def _same_rows(a, b) -> bool:
    """Whether static shapes a and b are equal up to leading size-1 dims (the same
    elements in the same order, and broadcasting each against the other changes
    neither's values)."""
    def strip(shape):
        shape = list(shape)
        while shape and shape[0] == 1:
            shape.pop(0)
        return shape
    return all(isinstance(s, int) for s in tuple(a) + tuple(b)) and strip(a) == strip(b)


def _resolve(node, producer):
    """(part node, [views between it and ``node``]) where ``node`` is a narrow_last part
    of ``producer`` or a chain of ``aten.view`` nodes of one that only add or drop
    leading size-1 dims (torchao's int8 linear views its [1, N] output back to
    [1, 1, N]); None otherwise."""
    views = []
    while isinstance(node, torch.fx.Node) and node.op == "call_function" \
            and node.target == aten.view.default and not node.kwargs and node.args:
        src = node.args[0]
        if not isinstance(_val(src), torch.Tensor) or not isinstance(_val(node), torch.Tensor) \
                or not _same_rows(_val(src).shape, _val(node).shape):
            return None
        views.append(node)
        node = src
    part = _part(node)
    if part is None or part[0] is not producer:
        return None
    return node, views


def _match(node):
    """(producer, fused op, its arguments but steps, canonical steps, the nodes
    the fused op replaces) for a fusable chain ``node`` (module docstring), else
    None."""
    if node.op != "call_function" or node.target != FUSED_ELEMENTWISE.overload() \
            or node.kwargs or len(node.args) != 3:
        return None
    inputs, steps, scalars = node.args
    if not isinstance(inputs, (list, tuple)) or len(inputs) < 2 \
            or len(set(inputs)) != len(inputs) or not isinstance(steps, str):
        return None
    producer = None
    # The producer: the one every input resolves to (through views) a part of.
    for inp in inputs:
        probe = inp
        while isinstance(probe, torch.fx.Node) and probe.op == "call_function" \
                and probe.target == aten.view.default and probe.args:
            probe = probe.args[0]
        part = _part(probe)
        if part is None:
            return None
        producer = part[0] if producer is None else producer
    resolved = [_resolve(inp, producer) for inp in inputs]
    if None in resolved:
        return None
    parts = {p for p, _ in resolved}
    between = parts | {v for _, views in resolved for v in views}
    # The parts and views feed only the chain (or each other), the producer only the
    # two parts.
    if len(parts) != 2 or set(producer.users) != parts \
            or any(not set(n.users) <= between | {node} for n in between):
        return None
    out, y = _val(node), _val(producer)
    if not isinstance(out, torch.Tensor) or not isinstance(y, torch.Tensor) \
            or out.dtype not in _DTYPES or y.dtype != out.dtype or y.dim() < 1 \
            or not isinstance(y.shape[-1], int) or y.shape[-1] < 2 or y.shape[-1] % 2:
        return None
    f = y.shape[-1] // 2
    spans = {p: _part(p)[1:] for p in parts}
    if sorted(spans.values()) != [(0, f), (f, f)] or \
            any(_val(p) is None or _val(p).dtype != out.dtype for p in between):
        return None
    found = _linear_args(producer)
    if found is None:
        return None
    fused, args, w, bias, scales, group = found
    if fused.name not in registry.load_all() or not _weight_ok(fused, w, scales, group, f,
                                                               out.dtype):
        return None
    bv = _val(bias)
    if bias is not None and (not isinstance(bv, torch.Tensor) or bv.dtype != out.dtype
                             or tuple(bv.shape) != (2 * f,)):
        return None
    part_shape = tuple(_val(next(iter(parts))).shape)
    if any(v for _, v in resolved) or tuple(out.shape) != part_shape:
        # Views in between: every tensor of one row's elements (equal up to leading
        # size-1 dims), so that the chain's broadcasting is elementwise.
        if not all(_same_rows(_val(n).shape, part_shape) for n in list(between) + [node]):
            return None
    roles = ["gate" if spans[p] == (0, f) else "up" for p, _ in resolved]
    canon = swiglu.match_roles(steps, list(scalars), _DTYPES[out.dtype], roles)
    if canon is None:
        return None
    return producer, fused, args, canon, between


def fuse_linear_swiglu(pg) -> bool:
    """Replace each merged gate/up linear and its SwiGLU chain (module docstring) by
    ``vkdelegate.linear_swiglu`` (or its int4 / int8 form); True if any."""
    options = getattr(pg, "options", None)
    if options is not None and not options.fuse_linear_swiglu:
        return False
    graph = pg.gm.graph
    changed = False
    for node in list(graph.nodes):
        found = _match(node)
        if found is None:
            continue
        producer, fused_op, args, canon, between = found
        with graph.inserting_before(node):
            fused = graph.call_function(fused_op.overload(), tuple(args) + (canon,))
            out = _val(node)
            xv = _val(args[0])
            shape = tuple(xv.shape[:-1]) + (out.shape[-1],)
            fused.meta = dict(node.meta)
            result = fused
            if all(isinstance(d, int) for d in shape + tuple(out.shape)) \
                    and shape != tuple(out.shape):
                # torchao's int8 linear: the op's [M, F], the chain's [1, 1, F] (views
                # join only static shapes: _same_rows).
                fused.meta["val"] = out.new_empty(shape)
                result = graph.call_function(aten.view.default, (fused, list(out.shape)))
                result.meta = dict(node.meta)
        node.replace_all_uses_with(result)
        graph.erase_node(node)
        dead = set(between)  # the parts and views: readers first
        while dead:
            free = [n for n in dead if not n.users]
            for n in free:
                graph.erase_node(n)
            dead -= set(free)
        graph.erase_node(producer)
        changed = True
    return changed
