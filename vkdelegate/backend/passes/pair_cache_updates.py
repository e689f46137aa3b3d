"""Pair a decoder layer's K and V cache writes into ``vkdelegate.index_put_pair``.

A HF decoder layer writes its new keys and values with ``index_copy_`` at the same
positions, which export as two ``index_put(cache, [None, None, positions], kv)``
nodes: two scatter dispatches a step (the cache copies before them run in place, see
ops/families/cache_update.py). Two index_put nodes (accumulate=False) with

- the same indices list (the same index node at the same position, None elsewhere),
- destinations of one dtype and sizes, values of one dtype and sizes, and
- the second one's destination and values computed before the first node

become ``index_put_pair(self, self2, indices, values, values2)`` and its two getitems,
in the first one's place: one dispatch writing both, each output what its index_put
gave. Paired in graph order, each node at most once; a destination read by both is
never paired (the second write would need the first's output). Runs after ``cse``,
which gives every layer's writes one positions node, and only when the registry has
the op.

Then a pair whose written keys are a ``rotary_half_pair``'s second output (k', read by
nothing else), and whose first output (q') is read only after the pair, becomes
``rotary_index_put_pair(q, k, cos, sin, self, self2, indices, values2)`` (values2 the
other write's values; the two destinations swapped where k' is the second write's):
the rotary embedding and both cache writes in one dispatch, its outputs q' and the two
caches (``fuse_rotary_cache_writes``).
"""
from __future__ import annotations

import operator

import torch

from vkdelegate.backend.custom_ops_llm import (INDEX_PUT_PAIR, ROTARY_HALF_PAIR,
                                               ROTARY_INDEX_PUT_PAIR)
from vkdelegate.ops import registry

aten = torch.ops.aten


def _val(x):
    return x.meta.get("val") if isinstance(x, torch.fx.Node) else None


def _key(node):
    """What two pairable index_puts share, or None for a node that cannot pair."""
    if node.op != "call_function" or node.target != aten.index_put.default or node.kwargs:
        return None
    args = node.args
    if len(args) < 3 or (len(args) > 3 and args[3] is not False):
        return None
    x, indices, values = args[:3]
    vx, vv, vo = _val(x), _val(values), _val(node)
    if not all(isinstance(v, torch.Tensor) for v in (vx, vv, vo)):
        return None
    if not isinstance(indices, (list, tuple)) \
            or sum(isinstance(i, torch.fx.Node) for i in indices) != 1 \
            or any(i is not None and not isinstance(i, torch.fx.Node) for i in indices):
        return None
    return (tuple(indices), vx.dtype, tuple(map(str, vx.shape)), vv.dtype,
            tuple(map(str, vv.shape)))


def _position(graph) -> dict:
    return {n: i for i, n in enumerate(graph.nodes)}


def pair_cache_updates(pg) -> bool:
    """Pair index_puts sharing indices and sizes (module docstring); True if any."""
    if INDEX_PUT_PAIR.name not in registry.load_all():
        return False
    graph = pg.gm.graph
    op = INDEX_PUT_PAIR.overload()
    waiting: dict = {}
    changed = False
    order = _position(graph)
    for node in list(graph.nodes):
        key = _key(node)
        if key is None:
            continue
        first = waiting.pop(key, None)
        if first is not None:
            x2, values2 = node.args[0], node.args[2]
            ok = x2 is not first.args[0] and all(
                order.get(a, -1) < order[first] for a in (x2, values2))
            if not ok:
                first = None
        if first is None:
            waiting[key] = node
            continue
        with graph.inserting_before(first):
            fused = graph.call_function(op, (first.args[0], node.args[0], first.args[1],
                                             first.args[2], node.args[2]))
            outs = [graph.call_function(operator.getitem, (fused, i)) for i in (0, 1)]
        fused.meta = {**first.meta, "val": (_val(first), _val(node))}
        for old, new in zip((first, node), outs):
            new.meta = dict(old.meta)
            old.replace_all_uses_with(new)
            graph.erase_node(old)
        order = _position(graph)
        changed = True
    return fuse_rotary_cache_writes(graph) or changed


def _getitems(node) -> "dict | None":
    """index -> the getitem node of a multi-output node, None if another user reads it."""
    items = {}
    for user in node.users:
        if user.op != "call_function" or user.target is not operator.getitem \
                or not isinstance(user.args[1], int) or user.args[1] in items:
            return None
        items[user.args[1]] = user
    return items


def fuse_rotary_cache_writes(graph) -> bool:
    """index_put_pair of a rotary_half_pair's k' -> rotary_index_put_pair (module
    docstring); True if any."""
    if ROTARY_INDEX_PUT_PAIR.name not in registry.load_all():
        return False
    pair_op, rotary_op = INDEX_PUT_PAIR.overload(), ROTARY_HALF_PAIR.overload()
    fused_op = ROTARY_INDEX_PUT_PAIR.overload()
    changed = False
    for pair in list(graph.nodes):
        if pair.op != "call_function" or pair.target is not pair_op or pair.kwargs:
            continue
        x, x2, indices, values, values2 = pair.args
        for k_rot, other, dest, dest2, swap in ((values, values2, x, x2, False),
                                                (values2, values, x2, x, True)):
            if not (isinstance(k_rot, torch.fx.Node) and k_rot.target is operator.getitem
                    and k_rot.args[1] == 1 and len(k_rot.users) == 1):
                continue
            rotary = k_rot.args[0]
            if rotary.op != "call_function" or rotary.target is not rotary_op:
                continue
            rot_items, pair_items = _getitems(rotary), _getitems(pair)
            if rot_items is None or pair_items is None or other is k_rot:
                continue
            order = _position(graph)
            q_rot = rot_items.get(0)
            if q_rot is not None and any(order[u] <= order[pair] for u in q_rot.users):
                continue
            with graph.inserting_before(pair):
                fused = graph.call_function(fused_op, (*rotary.args, dest, dest2, indices,
                                                       other))
                outs = [graph.call_function(operator.getitem, (fused, i)) for i in range(3)]
            caches = tuple(_val(pair))
            vals = (tuple(_val(rotary))[0], *(caches[::-1] if swap else caches))
            fused.meta = {**pair.meta, "val": vals}
            olds = (q_rot, pair_items.get(1 if swap else 0), pair_items.get(0 if swap else 1))
            for old, new, val in zip(olds, outs, vals):
                new.meta = dict(old.meta) if old is not None else {"val": val}
                if old is not None:
                    old.replace_all_uses_with(new)
                    graph.erase_node(old)
            graph.erase_node(pair)
            graph.erase_node(k_rot)
            graph.erase_node(rotary)
            changed = True
            break
    return changed
