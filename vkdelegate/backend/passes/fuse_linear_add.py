"""Fuse a linear and the residual add after it into ``vkdelegate.linear_add`` (or
``vkdelegate.linear_q4gsw_add`` for ExecuTorch's int4 weight-only linear,
``vkdelegate.linear_dq8ca_q4gsw_add`` for its 8da4w linear).

Every decoder layer of an HF Llama/Qwen2/Mistral ends its attention and its MLP in
``h + o_proj(attn)`` and ``h + down_proj(mlp)``: the fused op adds the residual as the
linear writes its output, so in a decode step (one row: the GEMV kernels) the linear's
result is never written to device memory and read back, and one dispatch goes per
add. Safe only where the add is exactly that sum, which the pass checks:

- ``aten.add.Tensor`` with alpha 1 (float addition is commutative: either operand
  order fuses);
- of an ``aten.linear.default`` (input, weight, bias?), ``et_vk.linear_q4gsw.default``
  or ``et_vk.linear_dq8ca_q4gsw.default`` (made by passes/quantized_linear from
  torchao's int4 weight-only and 8da4w linears) that nothing else reads;
- and a residual tensor of the add's output shape and dtype, float32 or float16 (no
  broadcasting, no type promotion), which is also the linear's output type.

torchao's int8 weight-only linear, ``aten._weight_int8pack_mm(x2, w, scales)`` of a 2-D
view x2 = [M, K], gives [M, N] where the residual is [..., N] (the view back to x's
rows, or none: a no-op view before an add is dropped); when the residual has M rows in
all (and the add's shape, no broadcasting) the add becomes
``view(weight_int8pack_mm_add(x2, w, scales, view(residual, [M, N])), add's shape)``:
views are aliases, so still one dispatch (``_fuse_int8_adds``).

Runs after the linear passes (quantized_linear, addmm_to_linear, the batch-norm fold,
merge_linears: they need the plain linears) and before fuse_elementwise, which would
otherwise swallow the add into an elementwise chain; only when the registry has the
fused ops.
"""
from __future__ import annotations

import torch

import math

from vkdelegate.backend.custom_ops import (LINEAR_ADD, LINEAR_DQ8CA_Q4GSW,
                                           LINEAR_DQ8CA_Q4GSW_ADD, LINEAR_Q4GSW,
                                           LINEAR_Q4GSW_ADD, WEIGHT_INT8PACK_MM_ADD)
from vkdelegate.backend.passes.residual_add import fuse_adds, plain_add
from vkdelegate.ops import registry

aten = torch.ops.aten
_DTYPES = (torch.float32, torch.float16)


def _fused_call(node) -> "tuple | None":
    """(fused target, its arguments without the residual) of a fusable linear node,
    else None."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function" or node.kwargs:
        return None
    if node.target == aten.linear.default and len(node.args) in (2, 3):
        args = tuple(node.args)
        return LINEAR_ADD.overload(), args + (None,) * (3 - len(args))
    if node.target == LINEAR_Q4GSW.overload() and len(node.args) in (4, 5):
        args = tuple(node.args)
        return LINEAR_Q4GSW_ADD.overload(), args + (None,) * (5 - len(args))
    if node.target == LINEAR_DQ8CA_Q4GSW.overload() and len(node.args) in (7, 8) \
            and LINEAR_DQ8CA_Q4GSW_ADD.name in registry.load_all():
        args = tuple(node.args)
        return LINEAR_DQ8CA_Q4GSW_ADD.overload(), args + (None,) * (8 - len(args))
    return None


def fuse_linear_add(pg) -> bool:
    """Replace each linear -> add pair (see the module docstring) by the fused op;
    True if any."""
    ops = registry.load_all()
    if LINEAR_ADD.name not in ops or LINEAR_Q4GSW_ADD.name not in ops:
        return False
    changed = fuse_adds(pg.gm.graph, _fused_call, _DTYPES)
    if WEIGHT_INT8PACK_MM_ADD.name in ops:
        changed = _fuse_int8_adds(pg.gm.graph) or changed
    return changed


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _int8_product(node):
    """The _weight_int8pack_mm node behind add operand ``node`` (itself, or a view of
    it), when only that add reads it; else None."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function" \
            or len(node.users) != 1:
        return None
    if node.target == aten.view.default:
        node = node.args[0]
        if not isinstance(node, torch.fx.Node) or node.op != "call_function" \
                or len(node.users) != 1:
            return None
    if node.target != aten._weight_int8pack_mm.default or len(node.args) != 3 \
            or node.kwargs:
        return None
    return node


def _static(shape) -> bool:
    return all(isinstance(s, int) for s in shape)


def _fuse_int8_adds(graph) -> bool:
    """The int8 weight-only form of the fusion (module docstring); True if any."""
    fused_op = WEIGHT_INT8PACK_MM_ADD.overload()
    # torchao's view of the product back to x's rows is left dead when an earlier
    # pass dropped it before the add: remove it, so that the product has one reader
    # (run_passes eliminates dead code after the passes anyway).
    graph.eliminate_dead_code()
    changed = False
    for add in list(graph.nodes):
        if not plain_add(add):
            continue
        for operand, other in (add.args, add.args[::-1]):
            mm = _int8_product(operand)
            vm, vo, va = _val(mm), _val(other), _val(add)
            if mm is None or operand is other or not all(
                    isinstance(v, torch.Tensor) for v in (vm, vo, va)):
                continue
            if not (_static(vm.shape) and _static(vo.shape) and _static(va.shape)) or \
                    vm.dtype not in _DTYPES or vo.dtype != vm.dtype or va.dtype != vm.dtype \
                    or tuple(vo.shape) != tuple(va.shape) or vo.dim() < 1 \
                    or vo.shape[-1] != vm.shape[1] \
                    or math.prod(vo.shape[:-1]) != vm.shape[0]:
                continue
            rows = [int(vm.shape[0]), int(vm.shape[1])]
            with graph.inserting_before(add):
                r2 = graph.call_function(aten.view.default, (other, rows))
                fused = graph.call_function(fused_op, tuple(mm.args) + (r2,))
                out = graph.call_function(aten.view.default, (fused, list(va.shape)))
            r2.meta = {"val": vo.reshape(rows)}
            fused.meta = dict(mm.meta)
            out.meta = dict(add.meta)
            add.replace_all_uses_with(out)
            graph.erase_node(add)
            if operand is not mm:
                graph.erase_node(operand)
            graph.erase_node(mm)
            changed = True
            break
    return changed
