"""Common subexpression elimination and no-op arithmetic folding at lowering.

An exported LLM decode step computes the same small values many times: every HF
decoder layer's ``StaticLayer.update`` rebuilds its cache positions
``arange(0, T) + start_pos[0]`` before its ``index_put``, and the model's prelude
builds the rotary and mask positions the same way; each of those is a dispatch (or
several) per step. This pass, in one walk in graph order:

1. **Folds no-op arithmetic** (a node replaced by an operand that already holds its
   value, same sizes and dtype):
   - ``add``/``sub`` of an integer or bool tensor and a zero: a Python 0 or a
     one-element ``arange`` starting at 0 (``arange(0, 1)``: the positions of a
     one-token decode). Not for float tensors: ``-0.0 + 0`` is ``+0.0``.
   - ``mul``/``div`` by a Python 1 (``x * 1.0`` is ``x`` bitwise for every float,
     -0.0, inf and NaN included; an int ``x / 1`` changes dtype and is not folded).
   - ``expand`` to the sizes the input already has; a step-1 ``slice`` keeping its
     whole dim (``hidden[:, -1:]`` of one token).
   - ``select`` along a size-1 dim becomes a ``view`` (a result of rank >= 1 only:
     ``pos[0]`` stays for cache_positions), and a dtype cast of a view that only adds
     leading size-1 dims to a graph input is moved before the view: select is a copy
     on the device, and so is a view of a graph input, where a view of an
     intermediate shares its memory.
   - a binary op's operand that only adds leading size-1 dims to a tensor (a chain of
     unsqueeze/view) reads that tensor, where broadcasting keeps the result's sizes.
   - a binary op's operand ``select(t, 0, 0)`` of a one-element 1-D tensor ``t``
     (``start_pos[0]``) becomes ``t`` where the other operand has rank >= 1 and the
     same dtype: broadcasting gives the same sizes and values, and with equal dtypes
     type promotion is the same.
2. **Merges duplicates**: a call of an op on the allow-list ``PURE`` with the same
   target, the same arguments (after the merges before it) and the same keyword
   arguments as an earlier node, and the same result dtype and sizes, is replaced by
   that node. ``PURE`` holds deterministic ops without side effects or mutation
   (creation ops such as ``arange``, integer/bool arithmetic and comparisons, views
   and ``expand``, ``select``/``slice``, ``cat``, ``_to_copy``, reductions). Random
   ops, ops that write an argument, asserts, ``_local_scalar_dense`` and ``sym_size``
   (SymInt producers, which ``local_symints`` deliberately duplicates) are never on
   it. Float elementwise results are not merged either: ``fuse_elementwise``
   recomputes them inside each consumer's chain, where a shared node with two users
   would become a dispatch of its own. A creation op's missing ``dtype`` keyword
   counts as its result's dtype (``arange(0, 1)`` and ``arange(0, 1, dtype=int64)``
   merge).

A node returned from the program is never replaced (eager returns a distinct tensor),
nor one with a raw SymInt argument (not an fx node: its identity is not its value).
``torch.fx.passes.dialect.common.cse_pass.CSEPass`` is not used: it builds a new
GraphModule (a ProgramGraph keeps its own) and merges every op but random and
in-place ones (asserts, ``index_put``, SymInt producers included).
"""
from __future__ import annotations

import torch

aten = torch.ops.aten

_CREATION = frozenset({
    aten.arange.default, aten.arange.start, aten.arange.start_step, aten.full.default,
    aten.scalar_tensor.default, aten.zeros.default, aten.ones.default,
})
_ELEMENTWISE = frozenset({
    aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar, aten.mul.Tensor,
    aten.mul.Scalar, aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode,
    aten.neg.default, aten.remainder.Scalar, aten.remainder.Tensor,
    aten.eq.Tensor, aten.eq.Scalar, aten.ne.Tensor, aten.ne.Scalar, aten.lt.Tensor,
    aten.lt.Scalar, aten.le.Tensor, aten.le.Scalar, aten.gt.Tensor, aten.gt.Scalar,
    aten.ge.Tensor, aten.ge.Scalar, aten.bitwise_and.Tensor, aten.bitwise_or.Tensor,
    aten.bitwise_not.default, aten.logical_and.default, aten.logical_or.default,
    aten.logical_not.default, aten.where.self, aten.minimum.default,
    aten.maximum.default, aten.cos.default, aten.sin.default, aten.exp.default,
    aten.rsqrt.default, aten.sqrt.default, aten.pow.Tensor_Scalar,
})
_STRUCTURAL = frozenset({
    aten.select.int, aten.slice.Tensor, aten.unsqueeze.default, aten.squeeze.dim,
    aten.squeeze.dims, aten.view.default, aten.reshape.default, aten._unsafe_view.default,
    aten.expand.default, aten.permute.default, aten.transpose.int, aten.t.default,
    aten.cat.default, aten._to_copy.default, aten.mean.dim, aten.sum.dim_IntList,
    aten.amax.default, aten.amin.default,
})
#: Ops whose duplicates are merged: pure and deterministic (no random numbers, no
#: argument written, no side effect).
PURE = _CREATION | _ELEMENTWISE | _STRUCTURAL

_BINARY = frozenset({
    aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.eq.Tensor, aten.ne.Tensor,
    aten.lt.Tensor, aten.le.Tensor, aten.gt.Tensor, aten.ge.Tensor,
})
_NOT_FLOAT = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _val(x):
    return x.meta.get("val") if isinstance(x, torch.fx.Node) else None


def _is_call(x, *targets) -> bool:
    return isinstance(x, torch.fx.Node) and x.op == "call_function" and x.target in targets


def _same_tensor(a, b) -> bool:
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype and tuple(map(str, a.shape)) == tuple(map(str, b.shape)))


def _is_zero(x) -> bool:
    """x is a Python 0 or a one-element arange starting at 0 (the value [0])."""
    if isinstance(x, bool) or not isinstance(x, (int, torch.fx.Node)):
        return False
    if isinstance(x, int):
        return x == 0
    v = _val(x)
    if not isinstance(v, torch.Tensor) or v.dtype not in _NOT_FLOAT or v.dtype is torch.bool:
        return False
    if _is_call(x, aten.arange.default):
        return x.args[0] == 1 and not isinstance(x.args[0], bool)
    if _is_call(x, aten.arange.start, aten.arange.start_step):
        start, end = x.args[0], x.args[1]
        step = x.args[2] if len(x.args) > 2 else 1
        return (all(type(a) is int for a in (start, end, step)) and start == 0
                and step > 0 and 0 < end <= step)
    return False


def _folded(node):
    """The node or value ``node`` is a no-op of, or None."""
    out = _val(node)
    if not isinstance(out, torch.Tensor):
        return None
    t, args = node.target, node.args
    if t in (aten.add.Tensor, aten.sub.Tensor, aten.add.Scalar, aten.sub.Scalar) \
            and len(args) == 2 and node.kwargs.get("alpha", 1) == 1:
        if out.dtype not in _NOT_FLOAT:
            return None
        pairs = [(args[0], args[1])] + ([(args[1], args[0])] if t == aten.add.Tensor else [])
        for x, zero in pairs:
            if isinstance(x, torch.fx.Node) and _is_zero(zero) and _same_tensor(_val(x), out):
                return x
    if t in (aten.mul.Tensor, aten.mul.Scalar, aten.div.Tensor, aten.div.Scalar) \
            and len(args) == 2 and not node.kwargs:
        one = args[1]
        if type(one) in (int, float) and one == 1 and isinstance(args[0], torch.fx.Node) \
                and _same_tensor(_val(args[0]), out):
            return args[0]
    if t == aten.expand.default and isinstance(args[0], torch.fx.Node) \
            and _same_tensor(_val(args[0]), out):
        return args[0]
    return None


def _unselect(node) -> bool:
    """Rewrite a binary op's ``select(t, 0, 0)`` operand (t one-element 1-D) as t."""
    if not _is_call(node, *_BINARY) or len(node.args) != 2:
        return False
    changed = False
    for i in (0, 1):
        sel, other = node.args[i], node.args[1 - i]
        if not _is_call(sel, aten.select.int) or tuple(sel.args[1:]) not in ((0, 0), (0, -1)):
            continue
        t, vo, vt = sel.args[0], _val(other), _val(sel.args[0])
        if not (isinstance(vt, torch.Tensor) and isinstance(vo, torch.Tensor)
                and isinstance(t, torch.fx.Node) and tuple(vt.shape) == (1,)
                and vo.dim() >= 1 and vo.dtype == vt.dtype):
            continue
        args = list(node.args)
        args[i] = t
        node.args = tuple(args)
        changed = True
    return changed


_VIEWS = (aten.unsqueeze.default, aten.view.default, aten.reshape.default,
          aten._unsafe_view.default)


def _static_shape(v):
    return tuple(v.shape) if isinstance(v, torch.Tensor) \
        and all(isinstance(d, int) for d in v.shape) else None


def _leading_ones_base(node):
    """The tensor a chain of views that only add leading size-1 dims starts from
    (``x.unsqueeze(0).unsqueeze(1)`` -> x), or None."""
    base, shape = None, _static_shape(_val(node))
    if shape is None:
        return None
    while _is_call(node, *_VIEWS) and isinstance(node.args[0], torch.fx.Node):
        inner = _static_shape(_val(node.args[0]))
        if inner is None or len(inner) < 1 or len(inner) > len(shape) \
                or shape != (1,) * (len(shape) - len(inner)) + inner:
            break
        base = node = node.args[0]
    return base


def _unview(node) -> bool:
    """Rewrite a binary op's operands that are a tensor with leading size-1 dims added
    (a chain of unsqueeze/view) as that tensor, where the result keeps its sizes:
    broadcasting adds those dims back (same values; equal dtypes and ranks >= 1, so
    the same type promotion). Both operands where that keeps the sizes, else one."""
    if not _is_call(node, *_BINARY) or len(node.args) != 2:
        return False
    out = _static_shape(_val(node))
    if out is None or not all(isinstance(_val(a), torch.Tensor) for a in node.args):
        return False
    bases = []
    for a in node.args:
        base = _leading_ones_base(a)
        vb = _val(base) if base is not None else None
        ok = vb is not None and vb.dtype == _val(a).dtype and vb.dim() >= 1
        bases.append(base if ok else None)

    def keeps(args) -> bool:
        shapes = [_static_shape(_val(a)) for a in args]
        if any(sh is None or len(sh) < 1 for sh in shapes):
            return False
        try:
            return tuple(torch.broadcast_shapes(*shapes)) == out
        except RuntimeError:
            return False
    # One operand alone: prefer the one whose partner has the result's sizes (the
    # small operand loses its leading dims, the large one keeps them).
    singles = [(bases[0], node.args[1]), (node.args[0], bases[1])]
    singles.sort(key=lambda args: _static_shape(_val(args[1] if args[0] is bases[0]
                                                     else args[0])) != out)
    choices = [(bases[0], bases[1])] + singles
    for args in choices:
        if None in args or tuple(args) == tuple(node.args):
            continue
        if keeps(args):
            node.args = tuple(args)
            return True
    return False


def _cast_before_view(graph, node) -> bool:
    """``_to_copy(v)`` (a dtype change only) of a view ``v`` that only adds leading
    size-1 dims to a graph input becomes ``view(_to_copy(input))``: the same values,
    and the view of an intermediate shares its memory where a view of a graph input
    is a copy (a dispatch)."""
    if not _is_call(node, aten._to_copy.default) or len(node.args) != 1 \
            or set(node.kwargs) - {"dtype"}:
        return False
    view = node.args[0]
    base = _leading_ones_base(view) if isinstance(view, torch.fx.Node) else None
    out = _static_shape(_val(node))
    if base is None or base.op != "placeholder" or out is None:
        return False
    with graph.inserting_before(node):
        cast = graph.call_function(aten._to_copy.default, (base,), dict(node.kwargs))
        new = graph.call_function(aten.view.default, (cast, list(out)))
    vb = _val(base)
    cast.meta = {**node.meta, "val": _val(node).reshape(tuple(vb.shape))}
    new.meta = dict(node.meta)
    node.replace_all_uses_with(new)
    graph.erase_node(node)
    return True


def _copy_free_view(graph, node) -> bool:
    """``select(x, d, 0 or -1)`` along a size-1 dim (result of rank >= 1) becomes
    ``view(x, sizes)``, and a step-1 ``slice`` keeping every row of its dim becomes x:
    the same elements in the same order, where select and slice are copies on the
    device and a view of an intermediate shares its memory (a decode step's
    ``logits[0, -1]`` and ``hidden[:, -1:]`` of one token). Static sizes only; a select
    giving a 0-d tensor (``pos[0]``, which cache_positions reads) and a slice that a
    slice_scatter or copy reads are left alone."""
    out = _static_shape(_val(node))
    x = node.args[0] if node.args else None
    vx = _static_shape(_val(x))
    if out is None or vx is None or not isinstance(x, torch.fx.Node):
        return False
    if node.target == aten.select.int:
        if len(out) < 1 or len(node.args) != 3 or type(node.args[1]) is not int:
            return False
        d = node.args[1] % len(vx)
        if vx[d] != 1 or node.args[2] not in (0, -1):
            return False
        with graph.inserting_before(node):
            new = graph.call_function(aten.view.default, (x, list(out)))
        new.meta = dict(node.meta)
    elif node.target == aten.slice.Tensor:
        step = node.args[4] if len(node.args) > 4 else node.kwargs.get("step", 1)
        if step != 1 or out != vx or not all(type(a) in (int, type(None))
                                             for a in node.args[1:]) \
                or any(u.target in (aten.slice_scatter.default, aten.copy.default)
                       for u in node.users):
            return False
        new = x
    else:
        return False
    node.replace_all_uses_with(new)
    graph.erase_node(node)
    return True


class _Unhashable(Exception):
    pass


def _key_of(x):
    if isinstance(x, torch.fx.Node):
        return ("node", x)
    if isinstance(x, (list, tuple)):
        return (type(x).__name__,) + tuple(_key_of(a) for a in x)
    if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool, torch.Tensor)):
        raise _Unhashable
    if isinstance(x, float):
        return ("float", x.hex() if x == x else "nan")
    if isinstance(x, (bool, int, str, type(None), torch.dtype, torch.device, torch.layout,
                      torch.memory_format)):
        return (type(x).__name__, repr(x))
    raise _Unhashable


def _key(node, out):
    kwargs = dict(node.kwargs)
    if node.target in _CREATION:
        kwargs.setdefault("dtype", out.dtype)
    try:
        return (node.target, _key_of(tuple(node.args)),
                tuple(sorted((k, _key_of(v)) for k, v in kwargs.items())))
    except _Unhashable:
        return None


def cse(pg) -> bool:
    """Fold no-op arithmetic and merge duplicate pure calls (module docstring); True if
    the graph changed."""
    graph = pg.gm.graph
    seen: dict = {}
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in PURE:
            continue
        returned = any(u.op == "output" for u in node.users)
        changed |= _unselect(node)
        changed |= _unview(node)
        if not returned and (_cast_before_view(graph, node) or _copy_free_view(graph, node)):
            changed = True
            continue
        out = _val(node)
        if not isinstance(out, torch.Tensor):
            continue
        if not returned:
            same = _folded(node)
            if same is not None:
                node.replace_all_uses_with(same)
                graph.erase_node(node)
                changed = True
                continue
        if out.dtype.is_floating_point and node.target in _ELEMENTWISE:
            continue
        key = _key(node, out)
        if key is None:
            continue
        first = seen.get(key)
        if first is None:
            seen[key] = node
        elif not returned and _same_tensor(_val(first), out):
            node.replace_all_uses_with(first)
            graph.erase_node(node)
            changed = True
    return changed
