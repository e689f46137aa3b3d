"""Fold an RMS norm into the linear that reads it: ``et_vk.rms_norm(x, w, eps)`` ->
``aten.linear(., weight, bias)`` becomes ``vkdelegate.rms_norm_linear(x, w, eps,
weight, bias)``.

In an HF Llama/Qwen2/Mistral decode step each layer's input norm feeds its merged
q/k/v linear and its post-attention norm the merged gate/up linear (passes/
merge_linears), and the final norm feeds lm_head: each norm is a one-row dispatch
whose cost on a GPU is the dispatch and its barrier, not the arithmetic (5.6 us of
an H200 step per norm). The fused op runs the norm inside the GEMV (gemv.glsl's
RMS_NORM: the norm weight applied to the row as it is loaded, its sum of squares
reduced with the products, each sum scaled by 1 / rms; one dispatch;
ops/families/norm.py), and records the two dispatches as before where the product
takes another form (prefill's several rows, CPU drivers) or compile option
``rms_norm_prologue`` is off.

Fused when:

- the norm is ``et_vk.rms_norm`` (passes/fuse_rms_norm makes it from HF's
  decomposed RMSNorm) of an x [..., K] of float32 or float16 with K static;
- every reader of the norm's output is an ``aten.linear.default(y, weight, bias?)``
  with y as its input (not its weight), weight [N, K] and bias [N] of x's dtype, and
  the output is not a graph output;
- one linear reads it, or several and every dim of x but the last is statically 1
  (decode): each GEMV then folds the norm in itself, which costs no dispatch. With several rows (prefill's q/k/v
  linears, not merged there) the op's fallback would repeat the norm's dispatch for
  each linear, so that case keeps the norm.

``vkdelegate.linear_add`` readers (a residual-add linear after a norm: not in Llama,
whose norms feed q/k/v and gate/up) and the int4 ``et_vk.linear_q4gsw`` are not
fused. Runs after fuse_rms_norm (which makes the norm), merge_linears (which leaves
one merged linear per norm) and fuse_linear_add; only when the registry has the op.
"""
from __future__ import annotations

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from vkdelegate.backend.custom_ops import RMS_NORM, RMS_NORM_LINEAR
from vkdelegate.ops import registry

aten = torch.ops.aten
_DTYPES = (torch.float32, torch.float16)


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _is_one(size) -> bool:
    return isinstance(size, int) and size == 1 or \
        not isinstance(size, int) and statically_known_true(size == 1)


def _linear_args(linear, y, k: int, dtype):
    """(weight, bias) of ``linear`` when it is a fusable reader of ``y`` (module
    docstring), else None."""
    if linear.op != "call_function" or linear.target != aten.linear.default \
            or linear.kwargs or len(linear.args) not in (2, 3) or linear.args[0] is not y:
        return None
    weight = linear.args[1]
    bias = linear.args[2] if len(linear.args) == 3 else None
    if weight is y or bias is y:
        return None
    w = _val(weight)
    if not isinstance(w, torch.Tensor) or w.dtype != dtype or w.dim() != 2 \
            or not isinstance(w.shape[1], int) or w.shape[1] != k:
        return None
    if bias is not None:
        bv = _val(bias)
        if not isinstance(bv, torch.Tensor) or bv.dtype != dtype or bv.dim() != 1 \
                or not statically_known_true(bv.shape[0] == w.shape[0]):
            return None
    out = _val(linear)
    if not isinstance(out, torch.Tensor) or out.dtype != dtype:
        return None
    return weight, bias


def _fusable(norm):
    """The (linear, weight, bias) readers of an et_vk.rms_norm node that fuse, else
    None."""
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
    if len(users) > 1 and not all(_is_one(s) for s in xv.shape[:-1]):
        return None
    found = []
    for linear in users:
        args = _linear_args(linear, norm, k, xv.dtype)
        if args is None:
            return None
        found.append((linear,) + args)
    return found


def fuse_rms_norm_linear(pg) -> bool:
    """Replace each et_vk.rms_norm -> aten.linear (see the module docstring) by
    ``vkdelegate.rms_norm_linear``; True if any."""
    if RMS_NORM_LINEAR.name not in registry.load_all():
        return False
    graph = pg.gm.graph
    norm_op, fused_op = RMS_NORM.overload(), RMS_NORM_LINEAR.overload()
    changed = False
    for norm in list(graph.nodes):
        if norm.op != "call_function" or norm.target != norm_op:
            continue
        found = _fusable(norm)
        if found is None:
            continue
        x, nw, eps = norm.args
        for linear, weight, bias in found:
            with graph.inserting_before(linear):
                fused = graph.call_function(fused_op, (x, nw, eps, weight, bias))
            fused.meta = dict(linear.meta)
            linear.replace_all_uses_with(fused)
            graph.erase_node(linear)
        graph.erase_node(norm)
        changed = True
    return changed
