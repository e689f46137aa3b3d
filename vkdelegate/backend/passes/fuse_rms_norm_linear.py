"""Fold an RMS norm into the product that reads it: ``et_vk.rms_norm(x, w, eps)`` ->
``aten.linear(., weight, bias)`` becomes ``vkdelegate.rms_norm_linear(x, w, eps,
weight, bias)``; -> ``et_vk.linear_q4gsw(., weights, scales, group_size, bias)``
(torchao's int4 weight-only) ``vkdelegate.rms_norm_linear_q4gsw(x, w, eps, weights,
scales, group_size, bias)``; -> ``aten._weight_int8pack_mm(., mat2, scales)`` (int8
weight-only, read through the view to [-1, K] torchao's linear puts first)
``vkdelegate.rms_norm_weight_int8pack_mm(view(x), w, eps, mat2, scales)``, the view
moved before the norm (a view that keeps the last dim keeps the rows the norm
normalizes).

In an HF Llama/Qwen2/Mistral decode step each layer's input norm feeds its merged
q/k/v linear and its post-attention norm the merged gate/up linear (passes/
merge_linears), and the final norm feeds lm_head: each norm is a one-row dispatch
whose cost on a GPU is the dispatch and its barrier, not the arithmetic (5.6 us of
an H200 step per norm). The fused op runs the norm inside the GEMV (gemv.glsl's
RMS_NORM, linear_qw_gemv.glsl's for the quantized products: the norm weight applied
to the row as it is loaded, its sum of squares reduced with the products, each sum
scaled by 1 / rms; one dispatch; ops/families/norm.py, quantized_linear.py), and
records the two dispatches as before where the product takes another form
(prefill's several rows, CPU drivers, linear_qw.glsl's forms) or compile option
``rms_norm_prologue`` is off.

Fused when:

- the norm is ``et_vk.rms_norm`` (passes/fuse_rms_norm makes it from HF's
  decomposed RMSNorm) of an x [..., K] of float32 or float16 with K static;
- every reader of the norm's output is a product with it as its input (and no other
  argument): ``aten.linear.default(y, weight, bias?)`` with weight [N, K] and bias
  [N] of x's dtype; ``et_vk.linear_q4gsw`` with uint8 weights, 2-D scales and a bias
  (or none) of x's dtype; ``aten._weight_int8pack_mm`` of a 2-D y with an int8 weight
  and 1-D scales of x's dtype; each read directly or through an ``aten.view`` whose
  last dim is K and whose every reader is such a product; the outputs are x's dtype
  and neither the norm's output nor a view of it is a graph output;
- one product reads it, or several and every dim of x but the last is statically 1
  (decode): each GEMV then folds the norm in itself, which costs no dispatch. With
  several rows (separate linears of several rows; passes/merge_linears leaves one
  merged product per norm in prefill too) the op's fallback would repeat the norm's
  dispatch for each linear, so that case keeps the norm.

Residual-add readers (``vkdelegate.linear_add`` and its quantized forms: a residual
after a norm is not in Llama, whose norms feed q/k/v and gate/up) and 8da4w
(``et_vk.linear_dq8ca_q4gsw``, which quantizes its input per row) are not fused.
Runs after fuse_rms_norm (which makes the norm), merge_linears (which leaves one
merged product per norm) and fuse_linear_add; only when the registry has the ops.
"""
from __future__ import annotations

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from vkdelegate.backend.custom_ops import (LINEAR_Q4GSW, RMS_NORM, RMS_NORM_LINEAR,
                                           RMS_NORM_LINEAR_Q4GSW,
                                           RMS_NORM_WEIGHT_INT8PACK_MM)
from vkdelegate.ops import registry

aten = torch.ops.aten
_DTYPES = (torch.float32, torch.float16)
_FUSED = (RMS_NORM_LINEAR, RMS_NORM_LINEAR_Q4GSW, RMS_NORM_WEIGHT_INT8PACK_MM)


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _is_one(size) -> bool:
    return isinstance(size, int) and size == 1 or \
        not isinstance(size, int) and statically_known_true(size == 1)


def _tensor(node, dtype=None, dim=None):
    v = _val(node)
    return isinstance(v, torch.Tensor) and (dtype is None or v.dtype == dtype) \
        and (dim is None or v.dim() == dim)


def _reader_args(reader, y, k: int, dtype):
    """(fused op, the product's arguments after its input) when ``reader`` is a
    fusable product of ``y`` (module docstring), else None."""
    if reader.op != "call_function" or reader.kwargs or not reader.args \
            or reader.args[0] is not y or any(a is y for a in reader.args[1:]) \
            or not _tensor(reader, dtype):
        return None
    args, target = reader.args, reader.target
    if target == aten.linear.default and len(args) in (2, 3):
        weight, bias = args[1], args[2] if len(args) == 3 else None
        w = _val(weight)
        if not _tensor(weight, dtype, 2) or not isinstance(w.shape[1], int) \
                or w.shape[1] != k:
            return None
        if bias is not None and (not _tensor(bias, dtype, 1)
                                 or not statically_known_true(_val(bias).shape[0]
                                                              == w.shape[0])):
            return None
        return RMS_NORM_LINEAR, [weight, bias]
    if target == LINEAR_Q4GSW.overload() and len(args) in (4, 5):
        weights, scales, group = args[1:4]
        bias = args[4] if len(args) == 5 else None
        if not _tensor(weights, torch.uint8, 2) or not _tensor(scales, dtype, 2) \
                or not isinstance(group, int) or isinstance(group, bool) \
                or bias is not None and not _tensor(bias, dtype, 1):
            return None
        return RMS_NORM_LINEAR_Q4GSW, [weights, scales, group, bias]
    if target == aten._weight_int8pack_mm.default and len(args) == 3:
        if not _tensor(args[1], torch.int8, 2) or not _tensor(args[2], dtype, 1) \
                or not _tensor(y, dim=2):
            return None
        return RMS_NORM_WEIGHT_INT8PACK_MM, [args[1], args[2]]
    return None


def _view_of_rows(view, y, k: int) -> bool:
    """Whether ``view`` is an ``aten.view`` of y (only) whose last dim is y's, k: the
    same rows of K elements (torchao's int8 linear views its input to [-1, K])."""
    if view.op != "call_function" or view.target != aten.view.default or view.kwargs \
            or len(view.args) != 2 or view.args[0] is not y:
        return False
    v = _val(view)
    return isinstance(v, torch.Tensor) and v.dim() >= 1 and isinstance(v.shape[-1], int) \
        and v.shape[-1] == k and not any(u.op == "output" for u in view.users)


def _fusable(norm):
    """The (product, view or None, fused op, the product's other arguments) readers
    of an et_vk.rms_norm node that fuse, else None."""
    if len(norm.args) != 3 or norm.kwargs:
        return None
    x, nw, eps = norm.args
    xv, nv = _val(x), _val(nw)
    if not isinstance(xv, torch.Tensor) or xv.dtype not in _DTYPES or xv.dim() < 1 \
            or not isinstance(nv, torch.Tensor) or nv.dtype != xv.dtype \
            or not isinstance(eps, (int, float)) or isinstance(eps, bool):
        return None
    k = xv.shape[-1]
    if not isinstance(k, int) or k < 1 or tuple(nv.shape) != (k,):
        return None
    users = list(norm.users)
    if not users or any(u.op == "output" for u in users):
        return None
    found = []
    for user in users:
        if _view_of_rows(user, norm, k):
            readers = [(r, user) for r in user.users]
            if not readers:
                return None
        else:
            readers = [(user, None)]
        for reader, view in readers:
            args = _reader_args(reader, view if view is not None else norm, k, xv.dtype)
            if args is None:
                return None
            found.append((reader, view) + args)
    if not found or len(found) > 1 and not all(_is_one(s) for s in xv.shape[:-1]):
        return None
    return found


def fuse_rms_norm_linear(pg) -> bool:
    """Replace each et_vk.rms_norm -> aten.linear (see the module docstring) by
    ``vkdelegate.rms_norm_linear``; True if any."""
    ops = registry.load_all()
    if any(op.name not in ops for op in _FUSED):
        return False
    graph = pg.gm.graph
    norm_op = RMS_NORM.overload()
    changed = False
    for norm in list(graph.nodes):
        if norm.op != "call_function" or norm.target != norm_op:
            continue
        found = _fusable(norm)
        if found is None:
            continue
        x, nw, eps = norm.args
        rows = {}  # view of the norm -> the same view of x
        for product, view, fused_op, rest in found:
            src = x
            if view is not None:
                if view not in rows:
                    with graph.inserting_before(view):
                        rows[view] = graph.call_function(aten.view.default,
                                                         (x,) + tuple(view.args[1:]))
                    rows[view].meta = dict(view.meta)
                src = rows[view]
            with graph.inserting_before(product):
                fused = graph.call_function(fused_op.overload(),
                                            (src, nw, eps) + tuple(rest))
            fused.meta = dict(product.meta)
            product.replace_all_uses_with(fused)
            graph.erase_node(product)
        for view in rows:
            graph.erase_node(view)
        graph.erase_node(norm)
        changed = True
    return changed
