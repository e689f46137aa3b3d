"""Fuse HF transformers' rotary embedding into ``vkdelegate.rotary_half``.

``apply_rotary_pos_emb`` (Llama, Qwen2, Mistral, Gemma) computes, for q and for k::

    x * cos + rotate_half(x) * sin,   rotate_half(x) = cat((-x[..., D/2:], x[..., :D/2]), -1)

which exports as ``add(mul(x, C), mul(cat([neg(slice(x, -1, D/2, end)), slice(x, -1,
0, D/2)], -1), S))`` (either operand order of the muls and the add). It becomes
``rotary_half(x, C, S)``: one dispatch instead of 8 and their intermediates. Fused only
when x, C, S and the result share one float dtype, the slices split the last dim in
halves, C and S have equal sizes broadcasting to x's, and no other node reads an
intermediate. Runs only when the registry has the op.

Then two rotary_half nodes with the same cos and sin nodes (a layer's q and k) and one
dtype become ``rotary_half_pair(q, k, cos, sin)`` and its two getitems: one dispatch
instead of two, each output bitwise the single op's (same expression per element).
Paired in graph order, each node at most once, only where the second one's input is
computed before the first node (the pair takes the first one's place, so every user of
either still comes after it). Runs only when the registry has rotary_half_pair.
"""
from __future__ import annotations

import operator

import torch

from vkdelegate.backend.custom_ops_llm import ROTARY_HALF, ROTARY_HALF_PAIR
from vkdelegate.ops import registry

aten = torch.ops.aten
_BIG = 2 ** 62  # an end this large is "to the end" (torch writes 2**63 - 1)


def _call(node, *targets) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" \
        and node.target in targets


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _last_dim(node, dim) -> bool:
    v = _val(node)
    return v is not None and isinstance(dim, int) and dim in (-1, v.dim() - 1)


def _half(node, x, first: bool) -> bool:
    """node is x[..., :D/2] (first) or x[..., D/2:]."""
    v = _val(x)
    if not _call(node, aten.slice.Tensor) or node.args[0] is not x or v is None \
            or not _last_dim(x, node.args[1]) or len(node.args) < 4 \
            or (len(node.args) > 4 and node.args[4] != 1):
        return False
    d = v.shape[-1]
    if not isinstance(d, int) or d % 2:
        return False
    start, end = node.args[2], node.args[3]
    return (start, end) == (0, d // 2) if first else (start == d // 2 and
                                                      isinstance(end, int) and end >= d)


def _rotate_half_of(node):
    """x if node is rotate_half(x), else None."""
    if not _call(node, aten.cat.default) or len(node.args[0]) != 2 \
            or not _last_dim(node, node.args[1] if len(node.args) > 1 else 0):
        return None
    neg, x1 = node.args[0]
    if not _call(neg, aten.neg.default) or not _call(x1, aten.slice.Tensor):
        return None
    x = x1.args[0]
    if not (_half(x1, x, True) and _half(neg.args[0], x, False)):
        return None
    return x


def _match(add):
    """(x, C, S, intermediate nodes) of a rotary embedding ending at ``add``, or None."""
    if not _call(add, aten.add.Tensor) or len(add.args) != 2 or add.kwargs.get("alpha", 1) != 1:
        return None
    for m_cos, m_sin in (add.args, add.args[::-1]):
        if not (_call(m_cos, aten.mul.Tensor) and _call(m_sin, aten.mul.Tensor)):
            continue
        for rot, s in (m_sin.args, m_sin.args[::-1]):
            x = _rotate_half_of(rot)
            if x is None or x not in m_cos.args:
                continue
            c = m_cos.args[1] if m_cos.args[0] is x else m_cos.args[0]
            cat = rot
            neg, x1 = cat.args[0]
            inner = [m_cos, m_sin, cat, neg, neg.args[0], x1]
            return x, c, s, inner
    return None


def _compatible(x, c, s, out) -> bool:
    vx, vc, vs, vo = (_val(n) for n in (x, c, s, out))
    if any(v is None or not isinstance(v, torch.Tensor) for v in (vx, vc, vs, vo)):
        return False
    if len({vx.dtype, vc.dtype, vs.dtype, vo.dtype}) != 1 or not vx.dtype.is_floating_point:
        return False
    if tuple(vc.shape) != tuple(vs.shape) or tuple(vo.shape) != tuple(vx.shape) \
            or vc.dim() > vx.dim() or vx.dim() > 4:
        return False
    padded = (1,) * (vx.dim() - vc.dim()) + tuple(vc.shape)
    return all(str(p) in ("1", str(q)) for p, q in zip(padded, vx.shape)) \
        and str(padded[-1]) == str(vx.shape[-1])


def fuse_rotary(pg) -> bool:
    """Replace each HF rotary embedding by ``vkdelegate.rotary_half``; True if any."""
    if ROTARY_HALF.name not in registry.load_all():
        return False
    op = ROTARY_HALF.overload()
    graph = pg.gm.graph
    changed = False
    for add in list(graph.nodes):
        if add.graph is not graph:
            continue
        found = _match(add)
        if found is None:
            continue
        x, c, s, inner = found
        if not _compatible(x, c, s, add):
            continue
        allowed = set(inner) | {add}
        if any(u not in allowed for n in inner for u in n.users):
            continue
        with graph.inserting_before(add):
            fused = graph.call_function(op, (x, c, s))
        fused.meta = dict(add.meta)
        add.replace_all_uses_with(fused)
        graph.erase_node(add)
        for n in inner:  # users first: each is unused once those before it are gone
            graph.erase_node(n)
        changed = True
    return pair_rotary(graph) or changed


def _before(graph, a, b) -> bool:
    """Node a comes before node b in graph order (placeholders count as first)."""
    if not isinstance(a, torch.fx.Node) or a.op == "placeholder":
        return True
    for n in graph.nodes:
        if n is a:
            return True
        if n is b:
            return False
    return False


def pair_rotary(graph) -> bool:
    """Pair rotary_half nodes sharing cos/sin into rotary_half_pair; True if any."""
    if ROTARY_HALF_PAIR.name not in registry.load_all():
        return False
    single, pair = ROTARY_HALF.overload(), ROTARY_HALF_PAIR.overload()
    waiting: dict = {}  # (cos, sin, dtype) -> the first rotary_half of a future pair
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not single or len(node.args) != 3 \
                or node.kwargs:
            continue
        x, c, s = node.args
        v = _val(node)
        if not isinstance(v, torch.Tensor):
            continue
        key = (c, s, v.dtype, v.shape[-1])
        first = waiting.pop(key, None)
        if first is None or not _before(graph, x, first):
            waiting[key] = node
            continue
        with graph.inserting_before(first):
            fused = graph.call_function(pair, (first.args[0], x, c, s))
            outs = [graph.call_function(operator.getitem, (fused, i)) for i in (0, 1)]
        fused.meta = {**first.meta, "val": (_val(first), v)}
        for old, new in zip((first, node), outs):
            new.meta = dict(old.meta)
            old.replace_all_uses_with(new)
            graph.erase_node(old)
        changed = True
    return changed
