"""Fuse the decomposed RMS norm into ET-VK's ``et_vk.rms_norm`` (as ExecuTorch's
backends/vulkan/patterns/rms_norm.py does).

The pattern, as HF Llama's LlamaRMSNorm writes it (the casts present for fp16 models,
absent for fp32 ones, where ``.to(torch.float32)`` exports as nothing)::

    xf = _to_copy(x, dtype=float32)                 # optional
    rstd = rsqrt(add(mean(pow(xf, 2) | mul(xf, xf), [-1], keepdim=True), eps))
    y = mul(xf, rstd)                                # either operand order
    out = mul(weight, _to_copy(y, dtype=x.dtype))    # cast optional; either order

becomes ``et_vk.rms_norm(x, weight, eps)``: one dispatch instead of six nodes and
their intermediate tensors. Fused only when the result has x's dtype and so does the
weight, the weight has sizes (x.shape[-1],), eps is a number, and nothing else reads
an intermediate (``_assert_tensor_metadata`` checks of the intermediates go with
them, as do checks of x's own dtype). The fused op rounds once where the fp16 pattern rounds y before the weight
multiply: at most an fp16 ulp apart. Runs only when the registry has the op.
"""
from __future__ import annotations

import torch

from vkdelegate.ops import registry
from vkdelegate.backend.custom_ops import RMS_NORM

aten = torch.ops.aten

FUSED = RMS_NORM.name
_ASSERT = aten._assert_tensor_metadata.default


def _call(node, *targets) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" \
        and node.target in targets


def _dtype(node):
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return getattr(val, "dtype", None)


def _uncast(node, dtype=None):
    """(source, cast node or None): ``node`` with one dtype-only _to_copy removed
    (to ``dtype`` when given)."""
    if _call(node, aten._to_copy.default) and set(node.kwargs) <= {"dtype"} \
            and len(node.args) == 1 and (dtype is None or node.kwargs.get("dtype") == dtype):
        return node.args[0], node
    return node, None


def _operands(node, pred):
    """(a, b) of a binary mul with pred(a) true, trying both orders; None if neither."""
    if not _call(node, aten.mul.Tensor) or len(node.args) != 2:
        return None
    a, b = node.args
    for first, second in ((a, b), (b, a)):
        if pred(first):
            return first, second
    return None


def _match(out):
    """(x, weight, eps, intermediate nodes) of an RMS norm ending at ``out``, or None."""
    pair = _operands(out, lambda n: _call(_uncast(n)[0], aten.mul.Tensor)
                     and any(_call(_uncast(a)[0], aten.rsqrt.default)
                             for a in _uncast(n)[0].args))
    if pair is None:
        return None
    y_cast, weight = pair
    y, out_cast = _uncast(y_cast)
    rs = _operands(y, lambda n: _call(n, aten.rsqrt.default))
    if rs is None:
        return None
    rsqrt, xf = rs
    add = rsqrt.args[0]
    if not _call(add, aten.add.Tensor, aten.add.Scalar) or add.kwargs.get("alpha", 1) != 1:
        return None
    means = [a for a in add.args[:2] if _call(a, aten.mean.dim)]
    eps = [a for a in add.args[:2] if isinstance(a, (int, float)) and not isinstance(a, bool)]
    if len(means) != 1 or len(eps) != 1:
        return None
    mean = means[0]
    x, in_cast = _uncast(xf, torch.float32)
    xval = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    if xval is None or xval.dim() < 1 or len(mean.args) < 3 or mean.kwargs \
            or list(mean.args[1]) not in ([-1], [xval.dim() - 1]) or mean.args[2] is not True:
        return None
    sq = mean.args[0]
    if not ((_call(sq, aten.pow.Tensor_Scalar) and sq.args[0] is xf and sq.args[1] == 2)
            or (_call(sq, aten.mul.Tensor) and sq.args[0] is xf and sq.args[1] is xf)):
        return None
    dtype = xval.dtype
    if _dtype(xf) != torch.float32 or _dtype(out) != dtype or _dtype(weight) != dtype \
            or (out_cast is not None and _dtype(out_cast) != dtype):
        return None
    wval = weight.meta.get("val") if isinstance(weight, torch.fx.Node) else None
    if wval is None or tuple(wval.shape) != (xval.shape[-1],):
        return None
    inner = [n for n in (out_cast, y, rsqrt, add, mean, sq, in_cast) if n is not None]
    allowed = set(inner) | {out}
    for n in inner:
        if any(u not in allowed and u.target is not _ASSERT for u in n.users):
            return None
    return x, weight, float(eps[0]), inner


def fuse_rms_norm(pg) -> bool:
    """Replace each decomposed RMS norm by ``et_vk.rms_norm``; True if any."""
    if FUSED not in registry.load_all():
        return False
    fused_op = RMS_NORM.overload()
    graph = pg.gm.graph
    changed = False
    for out in list(graph.nodes):
        if out.graph is not graph or not _call(out, aten.mul.Tensor):
            continue
        found = _match(out)
        if found is None:
            continue
        x, weight, eps, inner = found
        with graph.inserting_before(out):
            fused = graph.call_function(fused_op, (x, weight, eps))
        fused.meta = dict(out.meta)
        out.replace_all_uses_with(fused)
        graph.erase_node(out)
        for n in inner:  # outputs first: each is unused once the ones after it are gone
            for user in list(n.users):
                graph.erase_node(user)  # _assert_tensor_metadata checks only
            graph.erase_node(n)
        _drop_tautological_asserts(graph, x)
        changed = True
    return changed


def _drop_tautological_asserts(graph, x) -> None:
    """Erase ``_assert_tensor_metadata(x, None, None, dtype)`` checks of x's own dtype
    (what ``x.to(torch.float32)`` of an fp32 x, and the upcast's input check, export
    as): they can never fail, and left in they are CPU nodes next to the fused op."""
    dtype = _dtype(x)
    for user in list(x.users):
        if user.target is not _ASSERT or user.users:
            continue
        args = list(user.args) + [None] * (4 - len(user.args))
        kwargs = dict(user.kwargs)
        device, layout = kwargs.pop("device", None), kwargs.pop("layout", None)
        if args[1:3] != [None, None] or kwargs or args[3] != dtype \
                or getattr(device, "type", "cpu") != "cpu" \
                or layout not in (None, torch.strided):
            continue
        graph.erase_node(user)
