"""KV-cache writes at a position read from a tensor: make them device ops.

A decoder's ``start_pos`` is an int64[1] input; ``p = start_pos[0].item()`` exports as
``_local_scalar_dense`` (an unbacked SymInt) and ``cache[:, :, p:p + T] = k`` as
``slice_scatter(cache, copy(slice(cache, 2, p, p + T), k'), 2, p, p + T)`` plus runtime
assertions on the slice's sizes and offset. A SymInt never enters a delegate
(backend/symint_partitions.py), so left alone all of it stays on the CPU and the cache
crosses to the host every step. This pass instead:

1. ``functional_update_cache`` (run by program_graph before the graph is checked):
   ExecuTorch's mutating ``llama.update_cache(value, cache, start_pos)``, which export
   wraps in ``auto_functionalized(_v2)``, becomes ``slice_scatter(cache, value, 1,
   start_pos, start_pos + value.size(1))`` (the new cache); the op's dummy result must
   be unused.
2. ``cache_positions``: ``slice_scatter(x, copy(slice(x, d, a, b), s), d, a, b)`` with
   s of the slice's sizes and dtype loses the copy (its value is s); then, where
   ``a = _local_scalar_dense(t)`` and ``b - a`` is src's size along d, the node becomes
   ``vkdelegate.slice_scatter_at(x, src, d, t)``, which reads the position from t on
   the device (t = pos[0] is read as pos itself). The assertions export emitted on
   that position and on the removed slice go with it: the Vulkan kernel (and the CPU
   kernel) raise for a position outside the cache, which is what they assert.
   Positions that only feed sizes keep the SymInt mechanism (ops/families/symint.py).
3. ``fold_repeat_kv`` (run by ``cache_positions``): HF's ``repeat_kv`` of a cache read
   by SDPA, ``reshape(expand(unsqueeze(kv, 2), [B, Hk, n, S, E]), [B, Hk*n, S, E])``,
   copies the whole cache n times per layer and step (transformers uses it whenever an
   attention mask is given); ``scaled_dot_product_attention(q, repeat_kv(k),
   repeat_kv(v), ...)`` becomes ``scaled_dot_product_attention(q, k, v, ...,
   enable_gqa=True)``: ATen's grouped-query attention, query head h reading key head
   h // n, which is what repeat_kv's copy holds (values equal, no copy).
"""
from __future__ import annotations

import operator

import torch

from vkdelegate.backend.custom_ops_llm import SLICE_SCATTER_AT, UPDATE_CACHE
from vkdelegate.ops import registry

aten = torch.ops.aten
_ASSERT = aten._assert_scalar.default
_COMPARE = (operator.ge, operator.le, operator.gt, operator.lt, operator.eq, operator.ne)
_HOPS = ("auto_functionalized", "auto_functionalized_v2")


def _call(node, *targets) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" \
        and node.target in targets


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else node


def functional_update_cache(gm) -> bool:
    """Replace each auto-functionalized ``llama.update_cache`` by a slice_scatter."""
    graph = gm.graph
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function" or getattr(node.target, "__name__", "") not in _HOPS \
                or str(node.args[0]) != UPDATE_CACHE.name:
            continue
        kw = node.kwargs
        cache = kw.get("cache")
        if cache is None and kw.get("_all_bases"):
            cache = kw["_all_bases"][kw.get("_cache_base_index", 0)]
        value, pos = kw.get("value"), kw.get("start_pos")
        users = {u.args[1]: u for u in node.users if u.target is operator.getitem}
        if cache is None or value is None or 0 in users or set(users) - {1} \
                or len(users) != len(node.users):
            continue
        seq = _val(value).shape[1]
        with graph.inserting_before(node):
            if not isinstance(seq, int):  # a dynamic length: read it as a node
                size = graph.call_function(aten.sym_size.int, (value, 1))
                size.meta["val"], seq = seq, size
            if isinstance(pos, torch.fx.Node) or isinstance(seq, torch.fx.Node):
                end = graph.call_function(operator.add, (pos, seq))
                end.meta["val"] = _val(pos) + _val(seq)
            else:
                end = pos + seq
            new = graph.call_function(aten.slice_scatter.default, (cache, value, 1, pos, end))
        new.meta = dict(users[1].meta) if 1 in users else {"val": _val(cache)}
        if 1 in users:
            users[1].replace_all_uses_with(new)
            graph.erase_node(users[1])
        graph.erase_node(node)
        changed = True
    if changed:
        gm.recompile()
    return changed


def _drop_copy(node) -> None:
    """slice_scatter(x, copy(slice(x, ...), s), ...) -> slice_scatter(x, s, ...)."""
    src = node.args[1]
    if not _call(src, aten.copy.default) or len(src.users) != 1 or src.kwargs:
        return
    dst, s = src.args[:2]
    if not _call(dst, aten.slice.Tensor) or dst.args[0] is not node.args[0] \
            or tuple(dst.args[1:4]) != tuple(node.args[2:5]):
        return
    sv, cv = _val(s), _val(src)
    if sv is None or cv is None or sv.dtype != cv.dtype or tuple(sv.shape) != tuple(cv.shape):
        return
    node.replace_input_with(src, s)
    node.graph.erase_node(src)


def _position_tensor(start):
    """t for ``start = _local_scalar_dense(t)`` (pos for t = select(pos, 0, 0)), if t
    is an integer tensor; else None."""
    if not _call(start, aten._local_scalar_dense.default):
        return None
    t = start.args[0]
    if _call(t, aten.select.int) and tuple(t.args[1:]) == (0, 0):
        t = t.args[0]
    val = _val(t)
    if val is None or val.dtype not in (torch.int64, torch.int32) or val.numel() < 1:
        return None
    return t


_SCALAR_READS = (aten.sym_size.int, aten.sym_storage_offset.default, aten.sym_numel.default,
                 _ASSERT)


def _scalar_only(node) -> bool:
    """node computes only SymInts/bools or asserts (no tensor op)."""
    target = node.target
    return node.op == "call_function" and (
        target in _SCALAR_READS or getattr(target, "__module__", "") in ("_operator",
                                                                          "operator"))


def erase_checks(root) -> bool:
    """Erase ``root`` and everything computed from it when all of that is size reads,
    SymInt arithmetic, comparisons and runtime assertions (the checks export emitted
    on a KV-cache position and its slice); leave all of it when anything else reads
    it. True if ``root`` was erased."""
    order, seen, todo = [], {root}, [root]
    while todo:
        node = todo.pop()
        order.append(node)
        for user in node.users:
            if user not in seen:
                seen.add(user)
                todo.append(user)
    if any(not _scalar_only(n) for n in order[1:]):
        return False
    # Users before what they read: repeatedly erase nodes that nothing reads any more.
    pending = [n for n in order if n.op == "call_function"]
    while pending:
        left = [n for n in pending if n.users]
        for n in pending:
            if not n.users:
                n.graph.erase_node(n)
        if len(left) == len(pending):
            break
        pending = left
    return root not in pending


_VIEWS = (aten.view.default, aten.reshape.default, aten._unsafe_view.default)
_SDPA = aten.scaled_dot_product_attention.default


def _repeated(node):
    """(kv, n) for ``node = view(clone?(expand(unsqueeze(kv, 2), [B, Hk, n, S, E])),
    [B, Hk*n, S, E])`` (HF's repeat_kv), else None."""
    if not _call(node, *_VIEWS):
        return None
    src = node.args[0]
    if _call(src, aten.clone.default) and not src.kwargs.get("memory_format"):
        src = src.args[0]
    if not _call(src, aten.expand.default) or not _call(src.args[0], aten.unsqueeze.default):
        return None
    kv, dim = src.args[0].args[:2]
    kv_val, out_val, big = _val(kv), _val(node), _val(src)
    if dim != 2 or kv_val is None or out_val is None or big is None or kv_val.dim() != 4:
        return None
    b, hk, s, e = kv_val.shape
    shape = tuple(big.shape)
    if len(shape) != 5 or shape[:2] != (b, hk) or shape[3:] != (s, e):
        return None
    n = shape[2]
    if not isinstance(n, int) or tuple(out_val.shape) != (b, hk * n, s, e):
        return None
    return kv, n


def fold_repeat_kv(graph) -> bool:
    """SDPA over repeat_kv'd key and value -> SDPA with enable_gqa=True (see the
    module docstring, 3.); True if any."""
    changed = False
    for node in list(graph.nodes):
        if not _call(node, _SDPA) or len(node.args) < 3 or len(node.args) > 7:
            continue
        k, v = _repeated(node.args[1]), _repeated(node.args[2])
        if k is None or v is None or k[1] != v[1] or k[1] < 2:
            continue
        old = node.args[1:3]
        node.args = (node.args[0], k[0], v[0]) + tuple(node.args[3:])
        node.kwargs = {**node.kwargs, "enable_gqa": True}
        for view in old:  # the copies, when nothing else reads them
            chain = [view, view.args[0]]
            while not _call(chain[-1], aten.unsqueeze.default):
                chain.append(chain[-1].args[0])
            for n in chain:
                if not n.users:
                    graph.erase_node(n)
        changed = True
    return changed


def cache_positions(pg) -> bool:
    """Rewrite slice_scatter KV-cache writes and SDPA over repeat_kv'd caches (see the
    module docstring); True if any."""
    graph = pg.gm.graph
    changed = fold_repeat_kv(graph)
    if SLICE_SCATTER_AT.name not in registry.load_all():
        return changed
    for node in list(graph.nodes):
        if not _call(node, aten.slice_scatter.default) or len(node.args) < 5:
            continue
        x, src, dim, start, end = node.args[:5]
        step = node.args[5] if len(node.args) > 5 else 1
        _drop_copy(node)
        src = node.args[1]
        t = _position_tensor(start)
        length = _val(src).shape[dim] if _val(src) is not None else None
        if t is None or step != 1 or length is None or not _call(end, operator.add) \
                or end.args[0] is not start or str(_val(end.args[1])) != str(length):
            continue
        with graph.inserting_before(node):
            new = graph.call_function(SLICE_SCATTER_AT.overload(), (x, src, dim, t))
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        for n in list(graph.nodes):  # the removed slice's checks, then the position's
            if _call(n, aten.slice.Tensor) and n.args[0] is x and n.args[2] is start:
                erase_checks(n)
        erase_checks(start)
        changed = True
    return changed
