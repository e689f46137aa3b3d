"""Fuse torchao's quantized linears into ExecuTorch's quantized linear ops (as
ExecuTorch's backends/vulkan/patterns/quantized_linear.py does on its edge graphs).

After ``run_decompositions`` torchao 0.18's tensor subclasses export as plain int8 /
float constants and the arithmetic of their dequantization:

- ``Int8WeightOnlyConfig``: ``mul(mm(x, _to_copy(permute(q, [1, 0]), float)),
  view(scale))``: the scale applied after the product, exactly what
  ``aten._weight_int8pack_mm(x, q, scale)`` computes; it becomes that op.
- ``IntxWeightOnlyConfig`` (int4 or int8, PerGroup or PerAxis) and the weight of
  ``Int8DynamicActivationIntxWeightConfig``: the weight of an ``mm``/``addmm``/
  ``linear`` is ``permute(view(mul(sub(q, zp), scale)))`` (dequantize_affine
  decomposed), computed from constants only. The pass evaluates that subgraph on the
  constants and checks bit for bit that it equals ``(q - 0) * scale`` per group of a
  constant int8 ``q``; then int4 values ([-8, 7]) give ``et_vk.linear_q4gsw`` with
  the weight packed two per byte (ET's convention), and int8 per-channel values
  ``aten._weight_int8pack_mm`` (+ ``aten.add`` of the bias).
- 8da4w's activation: ``x_dq = mul(sub(_to_copy(q_x), _to_copy(zp)), scale)`` with
  ``q_x = _to_copy(clamp(add(round(mul(x, mul(reciprocal(scale), 1.0))), zp), -128,
  127), int8)``: with an int4 weight this becomes ``et_vk.linear_dq8ca_q4gsw(x,
  scale, zp, ...)``; choose_qparams' own nodes (amin, amax, full_like, minimum,
  maximum, the arithmetic, the cast to int8) become one
  ``vkdelegate.choose_qparams_per_token`` (``fuse_choose_qparams``, a later pass:
  after cse, which gives the chains over one activation one amin). An fp16 x's chain
  is the same nodes in fp16 (each rounding to fp16), which the fused ops reproduce.

Not fused (left as the decomposition, which still runs): nonzero weight zero points
(asymmetric weights), int8 per-group weights, int4 with K not a multiple of 8.
Runs only when the registry has the fused ops.
"""
from __future__ import annotations

import operator

import torch

from vkdelegate.backend.custom_ops import (CHOOSE_QPARAMS_PER_TOKEN, LINEAR_DQ8CA_Q4GSW,
                                          LINEAR_Q4GSW, QPARAMS_EPS, RMS_NORM,
                                          RMS_NORM_CHOOSE_QPARAMS)
from vkdelegate.backend.node_specs import dtype_name
from vkdelegate.ops import registry

aten = torch.ops.aten
INT8PACK = "aten._weight_int8pack_mm.default"
_ASSERT = aten._assert_tensor_metadata.default
_VIEWS = (aten.view.default, aten.reshape.default, aten._unsafe_view.default)
# Ops a constant dequantization subgraph may hold.
_DQ_OPS = _VIEWS + (aten._to_copy.default, aten.sub.Tensor, aten.mul.Tensor,
                    aten.permute.default, aten.t.default, aten.expand.default,
                    aten.unsqueeze.default, aten.squeeze.dim)


def _call(node, *targets) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" \
        and node.target in targets


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _strip_views(node):
    while _call(node, *_VIEWS):
        node = node.args[0]
    return node


def _constant_leaves(pg, node, seen=None):
    """The constant placeholders ``node`` is computed from with _DQ_OPS only (a list;
    None when anything else feeds it)."""
    seen = {} if seen is None else seen
    if not isinstance(node, torch.fx.Node):
        return []
    if node in seen:
        return seen[node]
    if node.op == "placeholder":
        found = [node] if node.name in pg.constants else None
    elif _call(node, *_DQ_OPS):
        found = []
        for a in node.args:
            sub = _constant_leaves(pg, a, seen)
            if sub is None:
                return None
            found += [s for s in sub if s not in found]
    else:
        found = None
    seen[node] = found
    return found


def _evaluate(pg, node, memo):
    if not isinstance(node, torch.fx.Node):
        return node
    if node not in memo:
        if node.op == "placeholder":
            memo[node] = pg.constants[node.name]
        else:
            args = [_evaluate(pg, a, memo) for a in node.args]
            memo[node] = node.target(*args, **node.kwargs)
    return memo[node]


def _dequantized_weight(pg, w_node):
    """(q node, scale tensor [N, G], bits) when ``w_node`` ([N, K]) is a symmetric
    per-group dequantization of a constant int8 placeholder, else None."""
    leaves = _constant_leaves(pg, w_node)
    wval = _val(w_node)
    if not leaves or wval is None or wval.dim() != 2 or not wval.dtype.is_floating_point:
        return None
    n, k = wval.shape
    qs = [p for p in leaves if pg.constants[p.name].dtype == torch.int8
          and pg.constants[p.name].numel() == n * k]
    scales = [p for p in leaves if pg.constants[p.name].dtype.is_floating_point]
    if len(qs) != 1 or len(scales) != 1 or len(leaves) > 3:
        return None
    q = pg.constants[qs[0].name].reshape(n, k)
    s = pg.constants[scales[0].name]
    groups = s.numel() // n if s.numel() % n == 0 else 0
    if groups < 1 or k % groups:
        return None
    for p in leaves:  # a zero point must be all zeros (symmetric)
        if p not in (qs[0], scales[0]) and bool(pg.constants[p.name].any()):
            return None
    s = s.reshape(n, groups)
    expected = (q.reshape(n, groups, -1).to(wval.dtype) * s.to(wval.dtype).unsqueeze(-1))
    actual = _evaluate(pg, w_node, {})
    if not torch.equal(expected.reshape(n, k), actual):
        return None
    bits = 4 if int(q.min()) >= -8 and int(q.max()) <= 7 else 8
    return qs[0], s.to(wval.dtype), bits


def pack_4bit(q: torch.Tensor) -> torch.Tensor:
    """int8 [N, K] values in [-8, 7] -> uint8 [N, ceil(K/8)*4]: ET-VK's
    pack_4bit_weight_tensor (K zero-padded to a multiple of 8, ``(odd + 8) << 4 |
    (even + 8)``)."""
    n, k = q.shape
    padded = torch.zeros((n, -(-k // 8) * 8), dtype=torch.int16)
    padded[:, :k] = q.to(torch.int16)
    shifted = padded + 8
    return ((shifted[:, 1::2] << 4) | shifted[:, ::2]).to(torch.uint8)


def _dynamic_activation(node):
    """(x, scale node, zp node) when ``node`` is 8da4w's fake-quantized activation."""
    mul = _strip_views(node)
    if not _call(mul, aten.mul.Tensor):
        return None
    sub, scale = mul.args[:2]
    if not _call(sub, aten.sub.Tensor) or not all(_call(a, aten._to_copy.default)
                                                  for a in sub.args[:2]):
        return None
    qx, zp = (_strip_views(a.args[0]) for a in sub.args[:2])
    if not _call(qx, aten._to_copy.default) or qx.kwargs.get("dtype") != torch.int8:
        return None
    clamp = _strip_views(qx.args[0])
    if not _call(clamp, aten.clamp.default) or list(clamp.args[1:3]) != [-128, 127]:
        return None
    add = clamp.args[0]
    if not _call(add, aten.add.Tensor) or _strip_views(add.args[1]) is not zp:
        return None
    rnd = add.args[0]
    if not _call(rnd, aten.round.default) or not _call(rnd.args[0], aten.mul.Tensor):
        return None
    x, inv = rnd.args[0].args[:2]
    if not (_call(inv, aten.mul.Tensor) and inv.args[1] == 1.0
            and _call(inv.args[0], aten.reciprocal.default)
            and _strip_views(inv.args[0].args[0]) is _strip_views(scale)):
        return None
    return x, _strip_views(scale), zp


def _weight_of(pg, node):
    """(x, weight [N, K] node, bias) of an mm/addmm/linear node, else None."""
    if _call(node, aten.addmm.default):
        if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
            return None
        bias, x, wt = node.args[:3]
    elif _call(node, aten.mm.default):
        (x, wt), bias = node.args[:2], None
    elif _call(node, aten.linear.default):
        x, w = node.args[:2]
        return x, w, (node.args[2] if len(node.args) > 2 else None)
    else:
        return None
    if not (_call(wt, aten.permute.default) and list(wt.args[1]) == [1, 0]) \
            and not _call(wt, aten.t.default):
        return None
    if bias is not None and (_val(bias) is None or _val(bias).dim() != 1):
        return None
    return x, wt.args[0], bias


def _int8_weight_only(pg, node):
    """(x, q node, scale [N]) of Int8WeightOnlyConfig's ``mul(mm(x, q.T), scale)``."""
    if not _call(node, aten.mul.Tensor) or not _call(node.args[0], aten.mm.default):
        return None
    x, wt = node.args[0].args[:2]
    if _val(x) is None or not (_call(wt, aten._to_copy.default)
                               and wt.kwargs.get("dtype") == _val(x).dtype):
        return None
    perm = wt.args[0]
    if not (_call(perm, aten.permute.default) and list(perm.args[1]) == [1, 0]):
        return None
    q = perm.args[0]
    if q.op != "placeholder" or q.name not in pg.constants \
            or pg.constants[q.name].dtype != torch.int8 or pg.constants[q.name].dim() != 2:
        return None
    n = pg.constants[q.name].shape[0]
    leaves = _constant_leaves(pg, node.args[1])
    if not leaves or _val(node.args[1]) is None or _val(node.args[1]).numel() != n:
        return None
    scale = _evaluate(pg, node.args[1], {}).reshape(n).to(_val(x).dtype)
    return x, q, scale


def _erase_dead(graph, nodes) -> None:
    """Erase the nodes of ``nodes`` (and their _assert_tensor_metadata checks) that
    nothing else uses any more, users first."""
    changed = True
    while changed:
        changed = False
        for n in list(nodes):
            if n.graph is not graph or n.op != "call_function":
                continue
            if all(u.target is _ASSERT for u in n.users):
                for u in list(n.users):
                    graph.erase_node(u)
                graph.erase_node(n)
                nodes.remove(n)
                changed = True


def _ancestors(node, stop) -> list:
    found, todo = [], [node]
    while todo:
        n = todo.pop()
        if isinstance(n, torch.fx.Node) and n not in found and n not in stop:
            found.append(n)
            todo.extend(a for a in n.args if isinstance(a, torch.fx.Node))
    return found


def fuse_quantized_linear(pg) -> bool:
    """Replace torchao's dequantize -> linear patterns by the fused ops; True if any."""
    ops = registry.load_all()
    if not {INT8PACK, LINEAR_Q4GSW.name, LINEAR_DQ8CA_Q4GSW.name} <= set(ops):
        return False
    graph = pg.gm.graph
    changed = False
    for node in list(graph.nodes):
        if node.graph is not graph or node.op != "call_function":
            continue
        found = _int8_weight_only(pg, node)
        if found is not None:
            x, q, scale = found
            s_node = pg.add_constant(q.name + "_scales", scale)
            with graph.inserting_before(node):
                fused = graph.call_function(aten._weight_int8pack_mm.default, (x, q, s_node))
            _replace(graph, node, fused, _ancestors(node, {x}))
            changed = True
            continue
        found = _weight_of(pg, node)
        if found is None:
            continue
        x, w_node, bias = found
        dq = _dequantized_weight(pg, w_node)
        if dq is None or _val(x) is None or _val(x).dtype != _val(w_node).dtype:
            continue
        q_node, scales, bits = dq
        n, k = pg.constants[q_node.name].shape[0], _val(w_node).shape[1]
        inner = _ancestors(node, {x} | ({bias} if bias is not None else set()))
        if bits == 8:
            if scales.shape[1] != 1:
                continue  # int8 per-group: no fused op
            out_shape = list(_val(node).shape)
            if _val(x).dim() != 2 and not all(isinstance(d, int) for d in out_shape):
                continue  # a linear of a dynamic N-d input: no 2-d view back
            q8 = pg.add_constant(q_node.name + "_int8", pg.constants[q_node.name].reshape(n, k))
            s_node = pg.add_constant(q_node.name + "_scales", scales.reshape(n).contiguous())
            with graph.inserting_before(node):
                x2 = x if _val(x).dim() == 2 else _traced(graph, aten.view.default,
                                                          (x, [-1, k]))
                fused = _traced(graph, aten._weight_int8pack_mm.default, (x2, q8, s_node))
                if _val(x).dim() != 2:
                    fused = _traced(graph, aten.view.default, (fused, out_shape))
                if bias is not None:
                    fused = graph.call_function(aten.add.Tensor, (fused, bias))
            _replace(graph, node, fused, inner)
            changed = True
            continue
        group = k // scales.shape[1]
        if k % 8 or group % 8:
            continue
        qmat = pg.constants[q_node.name].reshape(n, k)
        packed = pg.add_constant(q_node.name + "_q4", pack_4bit(qmat))
        s_node = pg.add_constant(q_node.name + "_scales", scales.t().contiguous())
        act = _dynamic_activation(x) if _val(x).dtype in _QPARAMS_DTYPES else None
        with graph.inserting_before(node):
            if act is None:
                fused = graph.call_function(LINEAR_Q4GSW.overload(),
                                            (x, packed, s_node, group, bias))
            else:
                xa, x_scale, x_zp = act
                sums = qmat.to(torch.int32).reshape(n, -1, group).sum(-1).t().to(torch.int32)
                n8 = -(-n // 8) * 8
                sums = torch.nn.functional.pad(sums, (0, n8 - n)).to(torch.int32).contiguous()
                sums_node = pg.add_constant(q_node.name + "_sums", sums)
                fused = graph.call_function(LINEAR_DQ8CA_Q4GSW.overload(), (
                    xa, x_scale, x_zp, packed, sums_node, s_node, group, bias))
        _replace(graph, node, fused, inner)
        changed = True
    return changed


def _traced(graph, op, args):
    """A new call of ``op`` with its meta['val'] computed from its inputs' (fake)
    values."""
    node = graph.call_function(op, args)
    vals = [_val(a) if isinstance(a, torch.fx.Node) else a for a in args]
    fake = torch._guards.detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])
    if fake is None:
        node.meta["val"] = op(*vals)
    else:
        with fake:
            node.meta["val"] = op(*vals)
    return node


def _replace(graph, node, fused, inner) -> None:
    fused.meta = dict(node.meta)
    node.replace_all_uses_with(fused)
    graph.erase_node(node)
    _erase_dead(graph, [n for n in inner if n is not node])


#: The activation dtypes of 8da4w's per-token qparams (custom_ops.QPARAMS_EPS's).
_QPARAMS_DTYPES = (torch.float32, torch.float16)


def _scalar_is(value, expected) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and float(value) == float(expected)


def _per_token_bounds(node, zero_with):
    """(x, the amin node) when ``node`` is ``minimum(amin(x, [-1]), full_like(that
    amin, 0))`` (zero_with = aten.amin, aten.minimum) or the amax / maximum form, else
    None."""
    reduce_op, bound_op = zero_with
    if not _call(node, bound_op) or len(node.args) != 2:
        return None
    red, zero = node.args
    if not _call(red, reduce_op) or not _call(zero, aten.full_like.default) \
            or zero.args[0] is not red or not _scalar_is(zero.args[1], 0) \
            or zero.kwargs.get("dtype") not in (None, _val(red).dtype if _val(red) is not None
                                                else None):
        return None
    x, dims = red.args[0], (red.args[1] if len(red.args) > 1 else red.kwargs.get("dim"))
    keep = red.args[2] if len(red.args) > 2 else red.kwargs.get("keepdim", False)
    val = _val(x)
    if keep or val is None or val.dtype not in _QPARAMS_DTYPES or val.dim() < 1 \
            or list(dims or []) not in ([val.dim() - 1], [-1]):
        return None
    return x, red


def _choose_qparams_chain(zp):
    """(x, scale node, amin node) when ``zp`` is the int8 zero point of torchao's per-token
    asymmetric int8 qparams of an fp32 or fp16 x (choose_qparams_affine decomposed, as
    torchao 0.18 with torch 2.13 exports it, every node in x's dtype):
    ``_to_copy(clamp(sub(-128, round(div(lo, scale))), -128, 127), int8)`` with
    ``scale = clamp(div(sub(hi, lo), 255.0), eps)`` (eps: QPARAMS_EPS of x's dtype),
    ``lo = minimum(amin(x, [-1]), full_like(., 0))``, ``hi = maximum(amax(x, [-1]), full_like(., 0))``; else None."""
    if not _call(zp, aten._to_copy.default) or zp.kwargs.get("dtype") != torch.int8 \
            or set(zp.kwargs) - {"dtype"}:
        return None
    clamp = zp.args[0]
    if not _call(clamp, aten.clamp.default) or len(clamp.args) != 3 \
            or not (_scalar_is(clamp.args[1], -128) and _scalar_is(clamp.args[2], 127)):
        return None
    sub = clamp.args[0]
    if not _call(sub, aten.sub.Tensor) or not _scalar_is(sub.args[0], -128) \
            or len(sub.args) != 2 or sub.kwargs.get("alpha", 1) != 1:
        return None
    rnd = sub.args[1]
    if not _call(rnd, aten.round.default) or len(rnd.args) != 1 or rnd.kwargs:
        return None
    div = rnd.args[0]
    if not _call(div, aten.div.Tensor) or len(div.args) != 2 or div.kwargs:
        return None
    lo, scale = div.args
    if not _call(scale, aten.clamp.default) or len(scale.args) != 2 \
            or not any(_scalar_is(scale.args[1], e) for e in QPARAMS_EPS.values()) \
            or scale.kwargs:
        return None
    span = scale.args[0]
    if not _call(span, aten.div.Tensor) or not _scalar_is(span.args[1], 255.0) \
            or span.kwargs:
        return None
    diff = span.args[0]
    if not _call(diff, aten.sub.Tensor) or len(diff.args) != 2 or diff.kwargs \
            or diff.args[1] is not lo:
        return None
    low = _per_token_bounds(lo, (aten.amin.default, aten.minimum.default))
    high = _per_token_bounds(diff.args[0], (aten.amax.default, aten.maximum.default))
    if low is None or high is None or low[0] is not high[0]:
        return None
    x = low[0]
    if not _scalar_is(scale.args[1], QPARAMS_EPS[dtype_name(_val(x).dtype)]):
        return None  # another dtype's eps
    for n, want in ((scale, _val(x).dtype), (zp, torch.int8)):
        v = _val(n)
        if v is None or v.dtype != want or list(v.shape) != list(_val(x).shape[:-1]):
            return None
    return x, scale, low[1]


def fuse_choose_qparams(pg) -> bool:
    """torchao's decomposed per-token int8 qparams of an activation (8da4w: about
    eight nodes, each its own dispatch) -> one ``vkdelegate.choose_qparams_per_token``
    (backend/custom_ops.py), whose (scale, zero point) replace the chain's; one node
    per amin (cse merges the amin of several linears' chains over one x, not their
    float elementwise nodes). Runs after cse and before fuse_elementwise, which would
    hide the chain's nodes. True if any."""
    if CHOOSE_QPARAMS_PER_TOKEN.name not in registry.load_all():
        return False
    graph = pg.gm.graph
    made = {}  # amin node -> (scale getitem, zp getitem), placed before that amin
    changed = False
    for node in list(graph.nodes):
        if node.graph is not graph:
            continue
        found = _choose_qparams_chain(node)
        if found is None:
            continue
        x, scale, amin = found
        if amin not in made:
            # Before the amin, which every node reading the chain's results follows.
            with graph.inserting_before(amin):
                fused = _traced(graph, CHOOSE_QPARAMS_PER_TOKEN.overload(), (x,))
                s = graph.call_function(operator.getitem, (fused, 0))
                z = graph.call_function(operator.getitem, (fused, 1))
            s.meta["val"], z.meta["val"] = fused.meta["val"]
            made[amin] = (s, z)
        s, z = made[amin]
        chain = _ancestors(node, {x})  # node, scale and their ancestors up to x
        scale.replace_all_uses_with(s)
        node.replace_all_uses_with(z)
        _erase_dead(graph, chain)
        changed = True
    if made and RMS_NORM_CHOOSE_QPARAMS.name in registry.load_all():
        # The products' replaced activation chains (merged q/k/v's, gate/up's) may
        # still read the norm: gone first, so that they count as no reader.
        graph.eliminate_dead_code()
        for s, z in made.values():
            _fold_norm(graph, s, z)
    return changed


def _only_8da4w_readers_but(node, skip) -> bool:
    """Whether every reader of ``node`` but ``skip`` is an 8da4w product, directly or
    through views that only 8da4w products (or ``skip``, or views) read."""
    for user in node.users:
        if user is skip:
            continue
        if _call(user, aten.view.default, aten._unsafe_view.default):
            if not _only_8da4w_readers_but(user, skip):
                return False
        elif not _call(user, LINEAR_DQ8CA_Q4GSW.overload()):
            return False
    return True


def _fold_norm(graph, s, z) -> None:
    """The qparams node behind getitems (s, z) of an x that is an ``et_vk.rms_norm``
    (or a view of one) whose other readers are all 8da4w products (directly or through
    views) -> one ``rms_norm_choose_qparams`` giving the norm's output and the qparams
    (viewed to the qparams node's sizes where x was a view). Left alone otherwise (a
    norm a float linear also reads keeps its node for passes/fuse_rms_norm_linear)."""
    qparams = s.args[0]
    x = qparams.args[0]
    views = []
    norm = x
    while _call(norm, aten.view.default, aten._unsafe_view.default):
        views.append(norm)
        norm = norm.args[0]
    if not _call(norm, RMS_NORM.overload()) or len(norm.args) != 3 or norm.kwargs \
            or set(qparams.users) != {s, z} or not _only_8da4w_readers_but(norm, qparams):
        return
    with graph.inserting_before(norm):
        fused = _traced(graph, RMS_NORM_CHOOSE_QPARAMS.overload(), tuple(norm.args))
        parts = [graph.call_function(operator.getitem, (fused, i)) for i in range(3)]
        for part, val in zip(parts, fused.meta["val"]):
            part.meta["val"] = val
        for i, old in ((1, s), (2, z)):
            if tuple(_val(parts[i]).shape) != tuple(_val(old).shape):
                parts[i] = _traced(graph, aten.view.default,
                                   (parts[i], list(_val(old).shape)))
    s.replace_all_uses_with(parts[1])
    z.replace_all_uses_with(parts[2])
    for dead in (s, z, qparams):
        graph.erase_node(dead)
    parts[0].meta = dict(norm.meta, val=parts[0].meta["val"])
    norm.replace_all_uses_with(parts[0])
    graph.erase_node(norm)
    _erase_dead(graph, views)
